package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// tokenGate holds the one bearer token the agent accepts. POST /token (itself behind the
// current token) replaces it: a sandbox restored from a memory snapshot wakes up with
// its source's token in memory, and its backend hands it its own at once
// (docs/state.md, memory snapshots).
type tokenGate struct {
	want atomic.Pointer[[sha256.Size]byte]
}

func newTokenGate(token string) *tokenGate {
	g := &tokenGate{}
	g.set(token)
	return g
}

func (g *tokenGate) set(token string) {
	sum := sha256.Sum256([]byte("Bearer " + token))
	g.want.Store(&sum)
}

// ok hashes both sides first, so the comparison takes the same time whatever the
// length or content of the guess.
func (g *tokenGate) ok(authorization string) bool {
	got := sha256.Sum256([]byte(authorization))
	return subtle.ConstantTimeCompare(got[:], g.want.Load()[:]) == 1
}

// TokenUpdate is the body of POST /token (models.TokenUpdate).
type TokenUpdate struct {
	Token string `json:"token"`
}

func (g *tokenGate) handleToken(w http.ResponseWriter, r *http.Request) {
	if !api.RequireMethod(w, r, http.MethodPost) {
		return
	}
	var body TokenUpdate
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil {
		api.WriteError(w, api.Errf(http.StatusBadRequest, "invalid_request", "bad body: %v", err))
		return
	}
	token := strings.TrimSpace(body.Token)
	if len(token) < 16 {
		api.WriteError(w, api.Errf(http.StatusBadRequest, "invalid_request", "a token has at least 16 characters"))
		return
	}
	g.set(token)
	w.WriteHeader(http.StatusNoContent)
}
