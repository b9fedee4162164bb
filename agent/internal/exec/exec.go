// Package exec serves the agent's command API: POST /exec (blocking), POST /exec/stream
// (NDJSON) and /processes (background processes, stdin, signals, terminals). One file
// per concern; the processes themselves live in internal/proc.
package exec

import (
	"net/http"

	"github.com/orchard-env/orchard/agent/internal/api"
	"github.com/orchard-env/orchard/agent/internal/proc"
)

// Config is what the handlers share with the rest of the agent.
type Config struct {
	Reaper    *proc.Reaper
	Spill     *proc.SpillDir
	MaxOutput int      // per-stream cap of a blocking exec, unless the request sets one
	User      string   // default user for requests that name none
	BaseEnv   []string // the agent's environment, scrubbed of its own settings
}

// Handler serves the routes; it holds the process table.
type Handler struct {
	cfg      Config
	procs    *proc.Table
	defaults defaults // set by PUT /defaults (a claimed warm-pool sandbox)
}

// New makes the handlers for cfg.
func New(cfg Config) *Handler {
	return &Handler{cfg: cfg, procs: proc.NewTable(cfg.Reaper, cfg.Spill)}
}

// Register adds /exec, /exec/stream, /processes, /processes/ and /defaults to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("/exec", post(h.handleExec))
	mux.HandleFunc("/exec/stream", post(h.handleExecStream))
	mux.HandleFunc("/processes", h.handleProcesses)
	mux.HandleFunc("/processes/", h.handleProcess)
	mux.HandleFunc("/defaults", h.handleDefaults)
}

func post(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if api.RequireMethod(w, r, http.MethodPost) {
			fn(w, r)
		}
	}
}
