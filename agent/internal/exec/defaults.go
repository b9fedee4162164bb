package exec

import (
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/orchard-env/orchard/agent/internal/api"
	"github.com/orchard-env/orchard/agent/internal/proc"
)

// DefaultsRequest is the body of PUT /defaults (AgentDefaults in pool_models.py): what
// a warm-pool sandbox learns when it is claimed, since its container was started before
// anyone knew the claim's env, working directory or user.
type DefaultsRequest struct {
	Env  map[string]string `json:"env"`
	Cwd  *string           `json:"cwd"`
	User *string           `json:"user"`
}

// defaults are the per-claim settings every later command starts from; a request's own
// env, cwd and user still win over them.
type defaults struct {
	mu   sync.RWMutex
	env  map[string]string
	cwd  string
	user string
	set  bool // user was set by PUT /defaults (an empty one then means the agent's own)
}

// apply merges the defaults into a request that names no cwd or user of its own.
func (d *defaults) apply(req *ExecRequest, base []string) []string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if req.Cwd == "" {
		req.Cwd = d.cwd
	}
	if req.User == "" && d.set {
		req.User = d.user
	}
	if len(d.env) == 0 {
		return base
	}
	return proc.MergeEnv(base, d.env)
}

// handleDefaults serves PUT /defaults: it checks the user and folder exist, then
// replaces the defaults as a whole (an absent field keeps its current value).
func (h *Handler) handleDefaults(w http.ResponseWriter, r *http.Request) {
	if !api.RequireMethod(w, r, http.MethodPut) {
		return
	}
	var req DefaultsRequest
	if err := api.ReadJSON(r, &req); err != nil {
		api.WriteError(w, err)
		return
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			api.WriteError(w, api.BadRequest("invalid environment variable %q", k))
			return
		}
	}
	if req.User != nil && *req.User != "" {
		if _, _, err := proc.ResolveUser(*req.User); err != nil {
			api.WriteError(w, err)
			return
		}
	}
	if req.Cwd != nil && *req.Cwd != "" {
		if fi, err := os.Stat(*req.Cwd); err != nil || !fi.IsDir() {
			api.WriteError(w, api.BadRequest("cwd %s is not a directory", *req.Cwd))
			return
		}
	}
	d := &h.defaults
	d.mu.Lock()
	if req.Env != nil {
		d.env = req.Env
	}
	if req.Cwd != nil {
		d.cwd = *req.Cwd
	}
	if req.User != nil {
		d.user, d.set = *req.User, true
	}
	d.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
