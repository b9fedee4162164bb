package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// tokenContext separates these tokens from any other use of the same key.
const tokenContext = "orchard-node/v1\x00"

// nodeToken is the token that opens the helper on one node: HMAC-SHA256 of the node's name
// under the key the service and the DaemonSet share. A token seen on one node's traffic
// opens no other node's helper. The service computes the same (kubernetes/node.py).
func nodeToken(key []byte, node string) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(tokenContext + node))
	return hex.EncodeToString(mac.Sum(nil))
}

// readKey reads the shared key from its file (a Secret's; a trailing newline is not part
// of the key).
func readKey(file string) ([]byte, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	key := []byte(strings.TrimSpace(string(raw)))
	if len(key) < 16 {
		return nil, errors.New("the key is shorter than 16 bytes")
	}
	return key, nil
}

// tokens is this node's token, from the key file. The kubelet rewrites a Secret's files
// when the Secret changes (and a pod may start on a cached, older copy): a token that
// does not match makes the helper read the file again (at most once a second), so a new
// key takes effect without a restart.
type tokens struct {
	file, node string

	mu      sync.Mutex
	token   string
	checked time.Time
}

func (t *tokens) load() error {
	key, err := readKey(t.file)
	if err != nil {
		return err
	}
	t.token = nodeToken(key, t.node)
	return nil
}

func (t *tokens) matches(got string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if same(got, t.token) {
		return true
	}
	if t.file == "" || time.Since(t.checked) < time.Second {
		return false
	}
	t.checked = time.Now()
	if err := t.load(); err != nil {
		return false // the old token stays until the file is right again
	}
	return same(got, t.token)
}

func same(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// requireToken refuses every request without this node's token: there is no anonymous
// route, not even a health check (the kubelet probes the port over TCP).
func requireToken(t *tokens, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || got == "" || !t.matches(got) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="orchard-node"`)
			writeError(w, fail(http.StatusUnauthorized, "unauthorized", "a valid node token is required"))
			return
		}
		next.ServeHTTP(w, r)
	})
}
