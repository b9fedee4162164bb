// Package api holds the agent's shared HTTP helpers: one error shape, bounded JSON bodies.
package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Error is the agent's one error shape; the service maps its codes onto its own.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func Errf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func BadRequest(format string, args ...any) *Error {
	return Errf(http.StatusBadRequest, "bad_request", format, args...)
}

func NotFound(format string, args ...any) *Error {
	return Errf(http.StatusNotFound, "not_found", format, args...)
}

func Conflict(format string, args ...any) *Error {
	return Errf(http.StatusConflict, "conflict", format, args...)
}

func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// ErrorResponse is every error's body (ErrorResponse and ErrorBody in models.py).
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteError writes err as {"error": {"code", "message"}}; non-API errors become 500 internal.
func WriteError(w http.ResponseWriter, err error) {
	var ae *Error
	if !errors.As(err, &ae) {
		ae = Errf(http.StatusInternalServerError, "internal", "%v", err)
	}
	WriteJSON(w, ae.Status, ErrorResponse{ErrorBody{Code: ae.Code, Message: ae.Message}})
}

// MaxJSONBody bounds request bodies decoded as JSON (commands, small file ops).
const MaxJSONBody = 16 << 20

// ReadJSON decodes a bounded JSON body into v, rejecting unknown fields and bad shapes with 400, oversized bodies with 413.
func ReadJSON(r *http.Request, v any) error {
	body := http.MaxBytesReader(nil, r.Body, MaxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields() // a typo such as "timeout" for "timeout_s" must not pass silently
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return Errf(http.StatusRequestEntityTooLarge, "too_large", "request body over %d bytes", MaxJSONBody)
		}
		if errors.Is(err, io.EOF) {
			return BadRequest("empty request body; expected JSON")
		}
		return BadRequest("invalid JSON body: %v", err)
	}
	return nil
}

// RequireMethod answers 405 unless r uses one of methods.
func RequireMethod(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	WriteError(w, Errf(http.StatusMethodNotAllowed, "method_not_allowed", "%s not allowed on %s", r.Method, r.URL.Path))
	return false
}
