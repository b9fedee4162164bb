package main

import (
	"net/http"
	"time"
)

// thaw lets the container's processes run again; it returns once none is frozen.
func thaw(c container, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := c.setFreeze(false); err != nil {
			return err
		}
		frozen, err := c.frozen()
		if err != nil || !frozen {
			return err
		}
		if time.Now().After(deadline) {
			return fail(http.StatusServiceUnavailable, "thaw_timeout",
				"the container's processes did not thaw within "+timeout.String())
		}
		time.Sleep(time.Millisecond)
	}
}

// POST /v1/pods/{pod}/containers/{container}/resume
func (n *node) resume(w http.ResponseWriter, r *http.Request) {
	c, err := n.findContainer(r.PathValue("pod"), r.PathValue("container"))
	if err == nil {
		start := time.Now()
		if err = thaw(c, n.freezeTimeout); err == nil {
			writeJSON(w, http.StatusOK, pauseAnswer{Frozen: false, TookMS: ms(time.Since(start))})
			return
		}
	}
	writeError(w, err)
}
