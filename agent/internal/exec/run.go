package exec

import (
	"net/http"
	"time"

	"github.com/orchard-env/orchard/agent/internal/api"
	"github.com/orchard-env/orchard/agent/internal/proc"
)

// ExecResult is the answer of POST /exec (ExecResult in models.py).
type ExecResult struct {
	ExitCode        int     `json:"exit_code"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	Encoding        string  `json:"encoding"`
	DurationS       float64 `json:"duration_s"`
	TimedOut        bool    `json:"timed_out"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
	StdoutFile      *string `json:"stdout_file"`
	StderrFile      *string `json:"stderr_file"`
	Signal          *string `json:"signal"`
}

// handleExec runs a command to completion: POST /exec.
func (h *Handler) handleExec(w http.ResponseWriter, r *http.Request) {
	s, c, start, ok := h.startExec(w, r)
	if !ok {
		return
	}
	out := proc.NewCapture(s.limit, h.cfg.Spill, "stdout")
	errOut := proc.NewCapture(s.limit, h.cfg.Spill, "stderr")
	p1 := proc.StartPump(c.Stdout, false, func(b []byte) { _, _ = out.Write(b) })
	p2 := proc.StartPump(c.Stderr, false, func(b []byte) { _, _ = errOut.Write(b) })
	ws, timedOut := proc.WaitExit(r.Context(), c.PID, c.Exit, s.Timeout)
	duration := time.Since(start).Seconds()
	proc.Settle(p1, p2)
	out.Finish()
	errOut.Finish()

	res := ExecResult{Encoding: encodingName(s.b64), DurationS: duration, TimedOut: timedOut}
	res.ExitCode, res.Signal = proc.ExitInfo(ws)
	if timedOut {
		res.ExitCode = 124
	}
	for _, st := range []struct {
		c         *proc.Capture
		data      *string
		truncated *bool
		file      **string
	}{{out, &res.Stdout, &res.StdoutTruncated, &res.StdoutFile}, {errOut, &res.Stderr, &res.StderrTruncated, &res.StderrFile}} {
		data, truncated, path := st.c.Result()
		*st.data, *st.truncated = encode(data, s.b64), truncated
		if path != "" {
			p := path
			*st.file = &p
		}
	}
	api.WriteJSON(w, http.StatusOK, res)
}
