package main

import (
	"encoding/json"
	"errors"
	"net/http"
)

// apiError is a failure with the stable code and HTTP status the service maps to its own
// errors (src/orchard/env/backends/kubernetes node client).
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func fail(status int, code, message string) error {
	return &apiError{status: status, code: code, message: message}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers an apiError as it is and anything else as a 500 `node_error`.
func writeError(w http.ResponseWriter, err error) {
	var e *apiError
	if !errors.As(err, &e) {
		e = &apiError{status: http.StatusInternalServerError, code: "node_error", message: err.Error()}
	}
	writeJSON(w, e.status, map[string]string{"code": e.code, "message": e.message})
}
