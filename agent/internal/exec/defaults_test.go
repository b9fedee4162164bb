package exec

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestDefaults(t *testing.T) {
	h := &Handler{}
	cases := []struct {
		body string
		code int
	}{
		{`{"env": {"A": "1"}, "cwd": "/"}`, http.StatusNoContent},
		{`{"cwd": "/no/such/dir"}`, http.StatusBadRequest},
		{`{"env": {"B=C": "1"}}`, http.StatusBadRequest},
		{`{"user": "no-such-user-here"}`, http.StatusBadRequest},
		{`{"nope": 1}`, http.StatusBadRequest},
	}
	for _, c := range cases {
		w := httptest.NewRecorder()
		h.handleDefaults(w, httptest.NewRequest(http.MethodPut, "/defaults", strings.NewReader(c.body)))
		if w.Code != c.code {
			t.Errorf("PUT /defaults %s = %d, want %d (%s)", c.body, w.Code, c.code, w.Body)
		}
	}
	req := &ExecRequest{Env: map[string]string{"A": "2"}}
	env := h.defaults.apply(req, []string{"PATH=/bin", "A=0"})
	if req.Cwd != "/" || strings.Join(env, " ") != "PATH=/bin A=1" {
		t.Errorf("apply: cwd %q env %v", req.Cwd, env)
	}
	own := &ExecRequest{Cwd: "/tmp"}
	h.defaults.apply(own, nil)
	if own.Cwd != "/tmp" {
		t.Errorf("a request's own cwd must win, got %q", own.Cwd)
	}
}
