package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A copy restored from a memory snapshot is handed its own token: the old one stops working.
func TestTokenRotation(t *testing.T) {
	a := startAgent(t, agentOpts{})
	newToken := "rotated-token-0123456789"
	cases := []struct {
		name string
		auth string
		body any
		want int
	}{
		{"needs the current token", "Bearer nope", map[string]any{"token": newToken}, 401},
		{"refuses a short token", "Bearer " + testToken, map[string]any{"token": "short"}, 400},
		{"refuses a bad body", "Bearer " + testToken, "not an object", 400},
		{"replaces it", "Bearer " + testToken, map[string]any{"token": newToken}, 204},
		{"the old one is gone", "Bearer " + testToken, map[string]any{"token": newToken}, 401},
	}
	for _, c := range cases {
		if status, body := a.doAuth("POST", "/token", c.body, c.auth); status != c.want {
			t.Fatalf("%s: status %d, want %d: %s", c.name, status, c.want, body)
		}
	}
	if status, body := a.doAuth("POST", "/exec", map[string]any{"cmd": "true"}, "Bearer "+newToken); status != 200 {
		t.Fatalf("exec with the new token: %d %s", status, body)
	}
}

// --log sends the agent's and the entrypoint's output to a file it opens itself.
func TestLogFile(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "console.log")
	startAgent(t, agentOpts{args: []string{"--log", logPath}, entry: []string{"/bin/sh", "-c", "echo from-entrypoint"}})
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "from-entrypoint") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log file holds %q", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
