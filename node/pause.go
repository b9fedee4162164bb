package main

import (
	"net/http"
	"time"
)

// pauseAnswer is what pause, resume and state say: the container's freezer state now.
type pauseAnswer struct {
	Frozen bool    `json:"frozen"`
	TookMS float64 `json:"took_ms"`
}

// freeze stops every process of the container (CPU stops, memory stays) and returns once
// the kernel says all are frozen. A v1 freezer can sit in FREEZING while a task is in an
// uninterruptible wait: the request is repeated (as runc does) until the deadline, and a
// freeze that does not complete is undone, so a failed pause leaves the sandbox running.
func freeze(c container, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	delay := 100 * time.Microsecond
	for {
		if err := c.setFreeze(true); err != nil {
			return err
		}
		done, err := c.frozen()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			_ = thaw(c, timeout)
			return fail(http.StatusServiceUnavailable, "freeze_timeout",
				"the container's processes did not all freeze within "+timeout.String())
		}
		time.Sleep(delay)
		delay = min(2*delay, 10*time.Millisecond)
	}
}

// POST /v1/pods/{pod}/containers/{container}/pause
func (n *node) pause(w http.ResponseWriter, r *http.Request) {
	c, err := n.findContainer(r.PathValue("pod"), r.PathValue("container"))
	if err == nil {
		start := time.Now()
		if err = freeze(c, n.freezeTimeout); err == nil {
			writeJSON(w, http.StatusOK, pauseAnswer{Frozen: true, TookMS: ms(time.Since(start))})
			return
		}
	}
	writeError(w, err)
}

// GET /v1/pods/{pod}/containers/{container}/state
func (n *node) state(w http.ResponseWriter, r *http.Request) {
	c, err := n.findContainer(r.PathValue("pod"), r.PathValue("container"))
	if err == nil {
		var frozen bool
		if frozen, err = c.frozen(); err == nil {
			writeJSON(w, http.StatusOK, pauseAnswer{Frozen: frozen})
			return
		}
	}
	writeError(w, err)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
