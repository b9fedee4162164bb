package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The Python client derives the same token (tests/kubernetes/test_node_client.py pins
// this vector too).
func TestNodeTokenVector(t *testing.T) {
	got := nodeToken([]byte("0123456789abcdef0123"), "node-a")
	const want = "18319a6991d523c20ef4deb8c01f169972266cc795d90bdab9b962dc660a7938"
	if got != want {
		t.Fatalf("nodeToken = %s, want %s", got, want)
	}
	if nodeToken([]byte("0123456789abcdef0123"), "node-b") == got {
		t.Fatal("two nodes share a token")
	}
}

func TestRequireToken(t *testing.T) {
	key := []byte("0123456789abcdef0123")
	h := requireToken(&tokens{token: nodeToken(key, "node-a")}, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	cases := []struct {
		name, header string
		want         int
	}{
		{"none", "", http.StatusUnauthorized},
		{"empty", "Bearer ", http.StatusUnauthorized},
		{"not bearer", "Basic " + nodeToken(key, "node-a"), http.StatusUnauthorized},
		{"wrong", "Bearer 00", http.StatusUnauthorized},
		{"another node's", "Bearer " + nodeToken(key, "node-b"), http.StatusUnauthorized},
		{"another key's", "Bearer " + nodeToken([]byte("another key, long enough"), "node-a"), http.StatusUnauthorized},
		{"this node's", "Bearer " + nodeToken(key, "node-a"), http.StatusNoContent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/v1/anything", nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Fatalf("status %d, want %d (%s)", rec.Code, tc.want, rec.Body)
			}
		})
	}
}

// A changed Secret takes effect without a restart: the file is read again when a token
// does not match (at most once a second), and the old key then no longer opens it.
func TestTokensFollowTheKeyFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	write := func(k string) {
		if err := os.WriteFile(file, []byte(k+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	oldKey, newKey := "the old key, long enough", "the new key, long enough"
	write(oldKey)
	tk := &tokens{file: file, node: "node-a"}
	if err := tk.load(); err != nil {
		t.Fatal(err)
	}
	if !tk.matches(nodeToken([]byte(oldKey), "node-a")) {
		t.Fatal("the key file's token does not open it")
	}
	write(newKey)
	if !tk.matches(nodeToken([]byte(newKey), "node-a")) {
		t.Fatal("the new key does not open it")
	}
	if tk.matches(nodeToken([]byte(oldKey), "node-a")) {
		t.Fatal("the old key still opens it")
	}
	// A broken file keeps the last good key; guesses do not make it read the file each time.
	write("short")
	tk.checked = time.Time{}
	if tk.matches("guess") || !tk.matches(nodeToken([]byte(newKey), "node-a")) {
		t.Fatal("a broken key file changed the token")
	}
	before := tk.checked
	tk.matches("another guess")
	if tk.checked != before {
		t.Fatal("read the file again within a second")
	}
}
