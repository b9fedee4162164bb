package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// execRequest is the body shared by /exec, /exec/stream and POST /processes.
type execRequest struct {
	Cmd            json.RawMessage   `json:"cmd"`
	Cwd            string            `json:"cwd"`
	Env            map[string]string `json:"env"`
	User           string            `json:"user"`
	Stdin          *string           `json:"stdin"`
	StdinB64       *string           `json:"stdin_b64"`
	TimeoutS       float64           `json:"timeout_s"`
	MaxOutputBytes int64             `json:"max_output_bytes"`
	OutputEncoding string            `json:"output_encoding"`
	PTY            bool              `json:"pty"`
	Rows           int               `json:"rows"`
	Cols           int               `json:"cols"`
	Tag            *string           `json:"tag"`
}

// cmdSpec is a validated request, ready to start.
type cmdSpec struct {
	path     string
	argv     []string
	dir      string
	env      []string
	cred     *syscall.Credential
	stdin    []byte
	hasStdin bool
	timeout  time.Duration
	limit    int
	b64      bool
}

const (
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	shellPath   = "/bin/sh"
	// pipeGrace is how long the pipes may stay quiet after the main child
	// exited before we stop waiting for EOF: a grandchild that inherited them
	// (a daemon started with &) can hold them open forever.
	pipeGrace = 200 * time.Millisecond
	// maxSettle bounds that wait even when a grandchild keeps writing.
	maxSettle = 5 * time.Second
)

func execFailed(format string, args ...any) error {
	return api.Errf(http.StatusUnprocessableEntity, "exec_failed", format, args...)
}

// buildSpec validates a request and resolves program, user and environment.
func (a *agent) buildSpec(req *execRequest) (*cmdSpec, error) {
	s := &cmdSpec{dir: req.Cwd}
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
	s.argv = argv

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
		s.stdin, s.hasStdin = []byte(*req.Stdin), true
	}
	if req.StdinB64 != nil {
		b, err := base64.StdEncoding.DecodeString(*req.StdinB64)
		if err != nil {
			return nil, api.BadRequest("stdin_b64 is not valid base64: %v", err)
		}
		s.stdin, s.hasStdin = b, true
	}
	if req.TimeoutS < 0 || req.TimeoutS > 1e9 {
		return nil, api.BadRequest("timeout_s must be between 0 and 1e9")
	}
	s.timeout = time.Duration(req.TimeoutS * float64(time.Second))
	switch {
	case req.MaxOutputBytes < 0:
		return nil, api.BadRequest("max_output_bytes must be positive")
	case req.MaxOutputBytes == 0:
		s.limit = a.maxOutput
	case req.MaxOutputBytes > 1<<30:
		return nil, api.BadRequest("max_output_bytes must be at most 1 GiB")
	default:
		s.limit = int(req.MaxOutputBytes)
	}

	env := append([]string(nil), a.baseEnv...)
	if req.User == "" {
		req.User = a.user
	}
	if req.User != "" {
		cred, userEnv, err := resolveUser(req.User)
		if err != nil {
			return nil, err
		}
		s.cred = cred
		env = mergeEnv(env, userEnv)
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(req.Env[k], 0) >= 0 {
			return nil, api.BadRequest("invalid environment variable %q", k)
		}
	}
	s.env = mergeEnv(env, req.Env)

	if s.dir != "" {
		if fi, err := os.Stat(s.dir); err != nil {
			return nil, execFailed("cwd: %v", err)
		} else if !fi.IsDir() {
			return nil, execFailed("cwd %s is not a directory", s.dir)
		}
	}
	if argv[0] == shellPath && line != "" {
		if _, err := os.Stat(shellPath); err != nil {
			return nil, api.Errf(http.StatusUnprocessableEntity, "no_shell",
				"a string cmd runs with %s, which this image lacks; send cmd as a list", shellPath)
		}
		s.path = shellPath
		return s, nil
	}
	path, err := lookPath(argv[0], s.env, s.dir)
	if err != nil {
		return nil, err
	}
	s.path = path
	return s, nil
}

// lookPath finds file in the PATH the child will see (not the agent's).
func lookPath(file string, env []string, dir string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil // execve reports what is wrong with it
	}
	pathEnv := defaultPath
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			pathEnv = kv[len("PATH="):]
		}
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		check := p
		if !filepath.IsAbs(p) && dir != "" {
			check = filepath.Join(dir, p)
		}
		if fi, err := os.Stat(check); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			if !filepath.IsAbs(p) {
				p = "./" + p
			}
			return p, nil
		}
	}
	return "", execFailed("%s: executable file not found in PATH", file)
}

// mergeEnv returns base with the variables in add set (replacing any earlier value).
func mergeEnv(base []string, add map[string]string) []string {
	if len(add) == 0 {
		return base
	}
	out := make([]string, 0, len(base)+len(add))
	for _, kv := range base {
		k := kv
		if i := strings.IndexByte(kv, '='); i >= 0 {
			k = kv[:i]
		}
		if _, ok := add[k]; !ok {
			out = append(out, kv)
		}
	}
	for k, v := range add {
		out = append(out, k+"="+v)
	}
	return out
}

// scrubbedEnv is the agent's environment without its own settings, so no
// child ever sees the token.
func scrubbedEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "ORCHARD_AGENT_") {
			out = append(out, kv)
		}
	}
	return out
}

// resolveUser parses "uid[:gid]" or "name[:group]" (names from /etc/passwd
// and /etc/group; os/user reads them in pure Go) into credentials, plus
// HOME/USER/LOGNAME when the user is known.
func resolveUser(spec string) (*syscall.Credential, map[string]string, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	var u *user.User
	var err error
	if _, convErr := strconv.ParseUint(name, 10, 32); convErr == nil {
		u, err = user.LookupId(name)
		if err != nil {
			u = &user.User{Uid: name, Gid: name}
		}
	} else if u, err = user.Lookup(name); err != nil {
		return nil, nil, api.BadRequest("unknown user %q", name)
	}
	gid := u.Gid
	if hasGroup {
		if _, convErr := strconv.ParseUint(group, 10, 32); convErr == nil {
			gid = group
		} else if g, err := user.LookupGroup(group); err == nil {
			gid = g.Gid
		} else {
			return nil, nil, api.BadRequest("unknown group %q", group)
		}
	}
	uid64, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid64, err := strconv.ParseUint(gid, 10, 32)
	if err != nil {
		return nil, nil, api.BadRequest("bad gid %q for user %q", gid, spec)
	}
	cred := &syscall.Credential{Uid: uint32(uid64), Gid: uint32(gid64), Groups: []uint32{}}
	if !hasGroup && u.Username != "" {
		if ids, err := u.GroupIds(); err == nil {
			for _, id := range ids {
				if n, err := strconv.ParseUint(id, 10, 32); err == nil && uint32(n) != cred.Gid {
					cred.Groups = append(cred.Groups, uint32(n))
				}
			}
		}
	}
	if os.Geteuid() != 0 {
		cred.NoSetGroups = true // only root may call setgroups
	}
	env := map[string]string{}
	if u.Username != "" {
		env["USER"], env["LOGNAME"] = u.Username, u.Username
	}
	if u.HomeDir != "" {
		env["HOME"] = u.HomeDir
	}
	return cred, env, nil
}

// child is a started process; the agent holds the other ends of its stdio.
type child struct {
	pid    int
	exit   <-chan syscall.WaitStatus
	stdout *os.File // nil with a PTY
	stderr *os.File // nil with a PTY
	stdin  *os.File // pipe write end; nil unless kept open
	master *os.File // PTY master, else nil
}

type ptySize struct{ rows, cols int }

// spawn starts s in its own process group (a new session with a PTY). With
// keepStdin the stdin pipe (or PTY) stays open for later writes and s.stdin
// is not written; otherwise s.stdin is fed and closed, or stdin is /dev/null.
func (a *agent) spawn(s *cmdSpec, keepStdin bool, pty *ptySize) (*child, error) {
	c := &child{}
	var childEnds []*os.File
	defer func() {
		for _, f := range childEnds {
			_ = f.Close()
		}
	}()
	attr := &syscall.ProcAttr{Dir: s.dir, Env: s.env, Sys: &syscall.SysProcAttr{Credential: s.cred}}
	if pty != nil {
		master, slave, err := openPTY(pty.rows, pty.cols)
		if err != nil {
			return nil, err
		}
		childEnds = append(childEnds, slave)
		fd := slave.Fd()
		attr.Files = []uintptr{fd, fd, fd}
		attr.Sys.Setsid, attr.Sys.Setctty, attr.Sys.Ctty = true, true, 0
		c.master = master
	} else {
		var stdin *os.File
		if keepStdin || s.hasStdin {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, err
			}
			stdin, c.stdin = r, w
		} else {
			f, err := os.Open(os.DevNull)
			if err != nil {
				// No /dev/null (a bare rootfs): an empty pipe reads EOF too.
				r, w, perr := os.Pipe()
				if perr != nil {
					return nil, perr
				}
				_ = w.Close()
				f = r
			}
			stdin = f
		}
		childEnds = append(childEnds, stdin)
		outR, outW, err := os.Pipe()
		if err != nil {
			closeAll(c.stdin)
			return nil, err
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll(c.stdin, outR, outW)
			return nil, err
		}
		childEnds = append(childEnds, outW, errW)
		c.stdout, c.stderr = outR, errR
		// Fd puts the child's ends back in blocking mode, as programs expect.
		attr.Files = []uintptr{stdin.Fd(), outW.Fd(), errW.Fd()}
		attr.Sys.Setpgid = true
	}
	pid, exit, err := a.reaper.start(s.path, s.argv, attr)
	if err != nil {
		closeAll(c.stdin, c.stdout, c.stderr, c.master)
		return nil, execFailed("start %s: %v", s.argv[0], err)
	}
	c.pid, c.exit = pid, exit
	if !keepStdin && s.hasStdin {
		w := c.stdin
		if w == nil {
			w = c.master
		}
		go func() {
			_, _ = w.Write(s.stdin) // EPIPE when the child ignores stdin is fine
			if c.stdin != nil {
				_ = c.stdin.Close()
			}
		}()
	}
	return c, nil
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

// killGroup SIGKILLs pid's process group (grandchildren included) and pid.
func killGroup(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// waitExit waits for the child; on timeout, or when ctx ends (the client
// went away), it kills the child's process group and keeps waiting.
// timedOut is true only when the kill is what ended the child.
func waitExit(ctx context.Context, pid int, exit <-chan syscall.WaitStatus, timeout time.Duration) (ws syscall.WaitStatus, timedOut bool) {
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	killed := false
	done := ctx.Done()
	for {
		select {
		case ws := <-exit:
			return ws, killed && ws.Signaled() && ws.Signal() == syscall.SIGKILL
		case <-timer:
			killed, timer = true, nil
			killGroup(pid)
		case <-done:
			done = nil
			killGroup(pid)
		}
	}
}

// pump reads a parent-side pipe to EOF, handing each chunk to sink.
type pump struct {
	done chan struct{}
	n    atomic.Int64
	busy atomic.Bool     // a chunk was read and is still being handed on
	rc   syscall.RawConn // for FIONREAD: bytes waiting in the pipe, unread
}

// A pipe's read end is closed at EOF; a PTY master (keepOpen) is not, since
// closing it hangs up the terminal, which SIGHUPs a session still exiting.
func startPump(r *os.File, keepOpen bool, sink func([]byte)) *pump {
	p := &pump{done: make(chan struct{})}
	p.rc, _ = r.SyscallConn()
	go func() {
		defer close(p.done)
		if !keepOpen {
			defer r.Close()
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				p.busy.Store(true)
				sink(buf[:n])
				p.n.Add(int64(n))
				p.busy.Store(false)
			}
			if err != nil {
				return // EOF, or EIO from a PTY master once the terminal is gone
			}
		}
	}()
	return p
}

// drained reports that no output waits in the pipe or in the pump's hands.
// Quiet pipes only count as quiet when drained: on a loaded machine the pump
// may not run for a while, and output already written must never be dropped.
func (p *pump) drained() bool {
	select {
	case <-p.done:
		return true
	default:
	}
	if p.busy.Load() {
		return false
	}
	var avail int32
	failed := false
	if err := p.rc.Control(func(fd uintptr) {
		_, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&avail)))
		failed = e != 0
	}); err != nil || failed {
		return true // closed, or not a pipe/terminal: nothing more can be read
	}
	return avail == 0
}

func allDrained(pumps []*pump) bool {
	for _, p := range pumps {
		if !p.drained() {
			return false
		}
	}
	return true
}

// settle waits, after the main child exited, until the pumps reach EOF, or
// the pipes have been quiet and drained for pipeGrace (a grandchild holds them open),
// or maxSettle passed. The pumps keep draining afterwards.
func settle(pumps ...*pump) {
	total := func() (n int64) {
		for _, p := range pumps {
			n += p.n.Load()
		}
		return n
	}
	start, last, lastN := time.Now(), time.Now(), total()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for _, p := range pumps {
		for waiting := true; waiting; {
			select {
			case <-p.done:
				waiting = false
			case now := <-tick.C:
				if n := total(); n != lastN {
					last, lastN = now, n
				}
				if (now.Sub(last) >= pipeGrace && allDrained(pumps)) || now.Sub(start) >= maxSettle {
					return
				}
			}
		}
	}
}

type execResult struct {
	ExitCode        int     `json:"exit_code"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	Encoding        string  `json:"encoding"`
	DurationS       float64 `json:"duration_s"`
	TimedOut        bool    `json:"timed_out"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
	StdoutFile      *string `json:"stdout_file"`
	StderrFile      *string `json:"stderr_file"`
	Signal          *string `json:"signal"`
}

func encodingName(b64 bool) string {
	if b64 {
		return "base64"
	}
	return "text"
}

func (a *agent) parseExec(r *http.Request) (*execRequest, *cmdSpec, error) {
	var req execRequest
	if err := api.ReadJSON(r, &req); err != nil {
		return nil, nil, err
	}
	s, err := a.buildSpec(&req)
	return &req, s, err
}

// handleExec runs a command to completion: POST /exec.
func (a *agent) handleExec(w http.ResponseWriter, r *http.Request) {
	if !api.RequireMethod(w, r, http.MethodPost) {
		return
	}
	_, s, err := a.parseExec(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	start := time.Now()
	c, err := a.spawn(s, false, nil)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	out := newCapture(s.limit, a.spillDir, "stdout")
	errOut := newCapture(s.limit, a.spillDir, "stderr")
	p1 := startPump(c.stdout, false, func(b []byte) { _, _ = out.Write(b) })
	p2 := startPump(c.stderr, false, func(b []byte) { _, _ = errOut.Write(b) })
	ws, timedOut := waitExit(r.Context(), c.pid, c.exit, s.timeout)
	duration := time.Since(start).Seconds()
	settle(p1, p2)
	out.finish()
	errOut.finish()

	res := execResult{Encoding: encodingName(s.b64), DurationS: duration, TimedOut: timedOut}
	res.ExitCode, res.Signal = exitInfo(ws)
	if timedOut {
		res.ExitCode = 124
	}
	for _, st := range []struct {
		c         *capture
		data      *string
		truncated *bool
		file      **string
	}{{out, &res.Stdout, &res.StdoutTruncated, &res.StdoutFile}, {errOut, &res.Stderr, &res.StderrTruncated, &res.StderrFile}} {
		data, truncated, path := st.c.result()
		*st.data, *st.truncated = encode(data, s.b64), truncated
		if path != "" {
			p := path
			*st.file = &p
		}
	}
	api.WriteJSON(w, http.StatusOK, res)
}

// chunkEvent and exitEvent are the NDJSON lines of /exec/stream and follow.
type chunkEvent struct {
	Type   string `json:"type"`
	Data   string `json:"data"`
	Offset int64  `json:"offset"`
}

type exitEvent struct {
	Type      string  `json:"type"`
	ExitCode  int     `json:"exit_code"`
	DurationS float64 `json:"duration_s"`
	TimedOut  bool    `json:"timed_out"`
	Signal    *string `json:"signal"`
}

// ndjson writes one JSON object per line and flushes it at once.
type ndjson struct {
	mu sync.Mutex
	w  http.ResponseWriter
	f  http.Flusher
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	n := &ndjson{w: w, f: f}
	n.flush()
	return n
}

func (n *ndjson) flush() {
	if n.f != nil {
		n.f.Flush()
	}
}

func (n *ndjson) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	_, _ = n.w.Write(append(b, '\n'))
	n.flush()
}

// textChunker tracks one stream's offset and, in text mode, holds back a
// character cut at a chunk boundary so it is not turned into U+FFFD.
type textChunker struct {
	stream  string
	b64     bool
	offset  int64
	pending []byte
}

func (t *textChunker) chunk(p []byte, final bool) *chunkEvent {
	data := append(t.pending, p...)
	t.pending = nil
	if !t.b64 && !final {
		n := completeUTF8(data)
		t.pending = append([]byte(nil), data[n:]...)
		data = data[:n]
	}
	if len(data) == 0 {
		return nil
	}
	ev := &chunkEvent{Type: t.stream, Data: encode(data, t.b64), Offset: t.offset}
	t.offset += int64(len(data))
	return ev
}

type streamChunk struct {
	stream int
	data   []byte
}

// handleExecStream runs a command and streams its output: POST /exec/stream.
func (a *agent) handleExecStream(w http.ResponseWriter, r *http.Request) {
	if !api.RequireMethod(w, r, http.MethodPost) {
		return
	}
	_, s, err := a.parseExec(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	start := time.Now()
	c, err := a.spawn(s, false, nil)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	out := newNDJSON(w)
	events := make(chan streamChunk, 16)
	stop := make(chan struct{})
	sink := func(i int) func([]byte) {
		return func(b []byte) {
			select {
			case events <- streamChunk{i, append([]byte(nil), b...)}:
			case <-stop: // the answer is complete; drain and drop
			}
		}
	}
	pumps := []*pump{startPump(c.stdout, false, sink(0)), startPump(c.stderr, false, sink(1))}
	pumpsDone := make(chan struct{})
	go func() {
		<-pumps[0].done
		<-pumps[1].done
		close(pumpsDone)
	}()
	type exitRes struct {
		ws       syscall.WaitStatus
		timedOut bool
		at       time.Time
	}
	exited := make(chan exitRes, 1)
	go func() {
		ws, timedOut := waitExit(r.Context(), c.pid, c.exit, s.timeout)
		exited <- exitRes{ws, timedOut, time.Now()}
	}()
	chunkers := []*textChunker{{stream: "stdout", b64: s.b64}, {stream: "stderr", b64: s.b64}}
	emit := func(ch streamChunk) {
		if ev := chunkers[ch.stream].chunk(ch.data, false); ev != nil {
			out.send(ev)
		}
	}
	var res *exitRes
	var quiet <-chan time.Time
	lastData := time.Now()
	for done := pumpsDone; res == nil || done != nil; {
		select {
		case ch := <-events:
			emit(ch)
			lastData = time.Now()
		case e := <-exited:
			res = &e
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			quiet = t.C
		case <-done:
			done = nil
		case now := <-quiet:
			if (now.Sub(lastData) >= pipeGrace && allDrained(pumps)) || now.Sub(res.at) >= maxSettle {
				done = nil
			}
		}
	}
	close(stop)
	for drained := false; !drained; {
		select {
		case ch := <-events:
			emit(ch)
		default:
			drained = true
		}
	}
	for _, t := range chunkers {
		if ev := t.chunk(nil, true); ev != nil {
			out.send(ev)
		}
	}
	ev := exitEvent{Type: "exit", DurationS: res.at.Sub(start).Seconds(), TimedOut: res.timedOut}
	ev.ExitCode, ev.Signal = exitInfo(res.ws)
	if res.timedOut {
		ev.ExitCode = 124
	}
	out.send(ev)
}
