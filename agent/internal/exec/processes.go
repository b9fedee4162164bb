package exec

import (
	"net/http"
	"strings"

	"github.com/orchard-env/orchard/agent/internal/api"
	"github.com/orchard-env/orchard/agent/internal/proc"
)

// ProcessList is the answer of GET /processes (ProcessList in models.py).
type ProcessList struct {
	Processes []proc.Info `json:"processes"`
}

// handleProcesses serves GET (list) and POST (start) on /processes.
func (h *Handler) handleProcesses(w http.ResponseWriter, r *http.Request) {
	if !api.RequireMethod(w, r, http.MethodGet, http.MethodPost) {
		return
	}
	if r.Method == http.MethodGet {
		list := h.procs.List()
		infos := make([]proc.Info, len(list))
		for i, p := range list {
			infos[i] = p.Info()
		}
		api.WriteJSON(w, http.StatusOK, ProcessList{Processes: infos})
		return
	}
	p, err := h.startProc(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusCreated, p.Info())
}

func (h *Handler) startProc(r *http.Request) (*proc.Proc, error) {
	var req ProcessStart
	if err := api.ReadJSON(r, &req); err != nil {
		return nil, err
	}
	s, err := h.buildSpec(&req.ExecRequest)
	if err != nil {
		return nil, err
	}
	if req.Tag != nil && len(*req.Tag) > 128 {
		return nil, api.BadRequest("tag must be at most 128 bytes")
	}
	var size *proc.PTYSize
	if req.PTY {
		if req.Rows < 0 || req.Cols < 0 || req.Rows > 0xffff || req.Cols > 0xffff {
			return nil, api.BadRequest("rows and cols must be between 1 and 65535")
		}
		size = &proc.PTYSize{Rows: req.Rows, Cols: req.Cols}
	}
	return h.procs.Start(&s.Spec, size, req.Cmd, req.Tag)
}

// procRoute is one action under /processes/{id}/.
type procRoute struct {
	method string
	fn     func(http.ResponseWriter, *http.Request, *proc.Proc) error
}

// handleProcess routes /processes/{id}[/action].
func (h *Handler) handleProcess(w http.ResponseWriter, r *http.Request) {
	id, action, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/processes/"), "/")
	p, err := h.procs.Get(id)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	routes := map[string]procRoute{
		"output": {http.MethodGet, procOutput},
		"follow": {http.MethodGet, procFollow},
		"stdin":  {http.MethodPost, procStdin},
		"signal": {http.MethodPost, procSignal},
		"resize": {http.MethodPost, procResize},
		"wait":   {http.MethodGet, procWait},
	}
	if action == "" {
		if !api.RequireMethod(w, r, http.MethodGet, http.MethodDelete) {
			return
		}
		if r.Method == http.MethodDelete {
			h.procs.Delete(p)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		api.WriteJSON(w, http.StatusOK, p.Info())
		return
	}
	rt, ok := routes[action]
	if !ok {
		api.WriteError(w, api.NotFound("no route %s", r.URL.Path))
		return
	}
	if !api.RequireMethod(w, r, rt.method) {
		return
	}
	if err := rt.fn(w, r, p); err != nil {
		api.WriteError(w, err)
	}
}
