// Package files serves the agent's file API (see docs/agent-api.md).
package files

import "net/http"

// Register adds the /files routes to mux.
func Register(mux *http.ServeMux) {}
