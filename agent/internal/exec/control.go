package exec

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/orchard-env/orchard/agent/internal/api"
	"github.com/orchard-env/orchard/agent/internal/proc"
)

// StdinRequest, SignalRequest and ResizeRequest are the bodies of the process
// actions (StdinWrite, SignalRequest, ResizeRequest in models.py).
type StdinRequest struct {
	Data     string `json:"data"`
	Encoding string `json:"encoding"`
	Close    bool   `json:"close"`
}

type SignalRequest struct {
	Signal json.RawMessage `json:"signal"` // a name or a number
	Group  *bool           `json:"group"`
}

type ResizeRequest struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

func procStdin(w http.ResponseWriter, r *http.Request, p *proc.Proc) error {
	var req StdinRequest
	if err := api.ReadJSON(r, &req); err != nil {
		return err
	}
	data := []byte(req.Data)
	switch req.Encoding {
	case "", "text":
	case "base64":
		b, err := base64.StdEncoding.DecodeString(req.Data)
		if err != nil {
			return api.BadRequest("data is not valid base64: %v", err)
		}
		data = b
	default:
		return api.BadRequest("encoding must be text or base64")
	}
	if err := p.WriteStdin(data, req.Close); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// parseSignal accepts "TERM", "SIGTERM", "term", "15" or 15.
func parseSignal(raw json.RawMessage) (syscall.Signal, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return syscall.SIGTERM, nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		var n int
		if err := json.Unmarshal(raw, &n); err != nil {
			return 0, api.BadRequest("signal must be a name or a number")
		}
		name = strconv.Itoa(n)
	}
	if n, err := strconv.Atoi(name); err == nil {
		if n < 1 || n > 64 {
			return 0, api.BadRequest("signal %d out of range", n)
		}
		return syscall.Signal(n), nil
	}
	if s, ok := proc.SignalByName(name); ok {
		return s, nil
	}
	return 0, api.BadRequest("unknown signal %q", name)
}

func procSignal(w http.ResponseWriter, r *http.Request, p *proc.Proc) error {
	var req SignalRequest
	if err := api.ReadJSON(r, &req); err != nil {
		return err
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		return err
	}
	if err := p.Signal(sig, req.Group == nil || *req.Group); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func procResize(w http.ResponseWriter, r *http.Request, p *proc.Proc) error {
	var req ResizeRequest
	if err := api.ReadJSON(r, &req); err != nil {
		return err
	}
	if req.Rows < 1 || req.Cols < 1 || req.Rows > 0xffff || req.Cols > 0xffff {
		return api.BadRequest("rows and cols must be between 1 and 65535")
	}
	if err := p.Resize(req.Rows, req.Cols); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// procWait answers when the process exits or the timeout passes, whichever
// is first; on timeout the info still says running.
func procWait(w http.ResponseWriter, r *http.Request, p *proc.Proc) error {
	var timer <-chan time.Time
	if v := r.URL.Query().Get("timeout_s"); v != "" {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs < 0 || secs > 1e9 {
			return api.BadRequest("timeout_s must be a non-negative number")
		}
		t := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-p.Done():
	case <-timer:
	case <-r.Context().Done():
		return nil
	}
	api.WriteJSON(w, http.StatusOK, p.Info())
	return nil
}
