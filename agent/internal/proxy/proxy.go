// Package proxy forwards /proxy/{port}/... to 127.0.0.1:{port} inside the sandbox.
package proxy

import "net/http"

// Register adds the /proxy/ route to mux.
func Register(mux *http.ServeMux) {}
