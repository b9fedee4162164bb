package exec

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/orchard-env/orchard/agent/internal/api"
	"github.com/orchard-env/orchard/agent/internal/proc"
)

// ExecRequest is the body of /exec and /exec/stream (ExecRequest in models.py).
type ExecRequest struct {
	Cmd            json.RawMessage   `json:"cmd"`
	Cwd            string            `json:"cwd"`
	Env            map[string]string `json:"env"`
	User           string            `json:"user"`
	Stdin          *string           `json:"stdin"`
	StdinB64       *string           `json:"stdin_b64"`
	TimeoutS       float64           `json:"timeout_s"`
	MaxOutputBytes int64             `json:"max_output_bytes"`
	OutputEncoding string            `json:"output_encoding"`
}

// ProcessStart is the body of POST /processes: an exec request plus a terminal and a tag.
type ProcessStart struct {
	ExecRequest
	PTY  bool    `json:"pty"`
	Rows int     `json:"rows"`
	Cols int     `json:"cols"`
	Tag  *string `json:"tag"`
}

// cmdSpec is a validated request: what to start, and how to report its output.
type cmdSpec struct {
	proc.Spec
	limit int  // per-stream cap of a blocking exec
	b64   bool // output as base64
}

const shellPath = "/bin/sh"

// buildSpec validates a request and resolves program, user and environment.
func (h *Handler) buildSpec(req *ExecRequest) (*cmdSpec, error) {
	env := h.defaults.apply(req, h.cfg.BaseEnv)
	s := &cmdSpec{Spec: proc.Spec{Dir: req.Cwd}}
	var argv []string
	var line string
	switch {
	case len(req.Cmd) == 0 || string(req.Cmd) == "null":
		return nil, api.BadRequest("cmd is required")
	case json.Unmarshal(req.Cmd, &line) == nil:
		if strings.TrimSpace(line) == "" {
			return nil, api.BadRequest("cmd must not be empty")
		}
		argv = []string{shellPath, "-c", line}
	case json.Unmarshal(req.Cmd, &argv) == nil:
		if len(argv) == 0 || argv[0] == "" {
			return nil, api.BadRequest("cmd must not be an empty list")
		}
	default:
		return nil, api.BadRequest("cmd must be a string or a list of strings")
	}
	for _, arg := range argv {
		if strings.IndexByte(arg, 0) >= 0 {
			return nil, api.BadRequest("cmd must not contain NUL bytes")
		}
	}
	s.Argv = argv

	switch req.OutputEncoding {
	case "", "text":
	case "base64":
		s.b64 = true
	default:
		return nil, api.BadRequest("output_encoding must be text or base64")
	}
	if req.Stdin != nil && req.StdinB64 != nil {
		return nil, api.BadRequest("give stdin or stdin_b64, not both")
	}
	if req.Stdin != nil {
		s.Stdin, s.HasStdin = []byte(*req.Stdin), true
	}
	if req.StdinB64 != nil {
		b, err := base64.StdEncoding.DecodeString(*req.StdinB64)
		if err != nil {
			return nil, api.BadRequest("stdin_b64 is not valid base64: %v", err)
		}
		s.Stdin, s.HasStdin = b, true
	}
	if req.TimeoutS < 0 || req.TimeoutS > 1e9 {
		return nil, api.BadRequest("timeout_s must be between 0 and 1e9")
	}
	s.Timeout = time.Duration(req.TimeoutS * float64(time.Second))
	switch {
	case req.MaxOutputBytes < 0:
		return nil, api.BadRequest("max_output_bytes must be positive")
	case req.MaxOutputBytes == 0:
		s.limit = h.cfg.MaxOutput
	case req.MaxOutputBytes > 1<<30:
		return nil, api.BadRequest("max_output_bytes must be at most 1 GiB")
	default:
		s.limit = int(req.MaxOutputBytes)
	}

	env = append([]string(nil), env...)
	if req.User == "" {
		req.User = h.cfg.User
	}
	if req.User != "" {
		cred, userEnv, err := proc.ResolveUser(req.User)
		if err != nil {
			return nil, err
		}
		s.Cred = cred
		env = proc.MergeEnv(env, userEnv)
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(req.Env[k], 0) >= 0 {
			return nil, api.BadRequest("invalid environment variable %q", k)
		}
	}
	s.Env = proc.MergeEnv(env, req.Env)

	if s.Dir != "" {
		if fi, err := os.Stat(s.Dir); err != nil {
			return nil, proc.ExecFailed("cwd: %v", err)
		} else if !fi.IsDir() {
			return nil, proc.ExecFailed("cwd %s is not a directory", s.Dir)
		}
	}
	if argv[0] == shellPath && line != "" {
		if _, err := os.Stat(shellPath); err != nil {
			return nil, api.Errf(http.StatusUnprocessableEntity, "no_shell",
				"a string cmd runs with %s, which this image lacks; send cmd as a list", shellPath)
		}
		s.Path = shellPath
		return s, nil
	}
	path, err := proc.LookPath(argv[0], s.Env, s.Dir)
	if err != nil {
		return nil, err
	}
	s.Path = path
	return s, nil
}

// startExec reads and validates the body of /exec or /exec/stream and starts the
// command, with stdin fed and closed; on failure the error is already answered.
func (h *Handler) startExec(w http.ResponseWriter, r *http.Request) (*cmdSpec, *proc.Child, time.Time, bool) {
	var req ExecRequest
	err := api.ReadJSON(r, &req)
	var s *cmdSpec
	if err == nil {
		s, err = h.buildSpec(&req)
	}
	start := time.Now()
	var c *proc.Child
	if err == nil {
		c, err = h.cfg.Reaper.Spawn(&s.Spec, false, nil)
	}
	if err != nil {
		api.WriteError(w, err)
		return nil, nil, start, false
	}
	return s, c, start, true
}
