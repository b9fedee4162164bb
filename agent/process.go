package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// proc is a background process: it outlives the request that started it,
// and its output stays readable by offset until it is deleted.
type proc struct {
	id       string
	pid      int
	cmd      json.RawMessage
	tag      *string
	pty      bool
	started  time.Time
	outputs  [2]*outBuf // stdout, stderr (unused with a PTY)
	done     chan struct{}
	ioMu     sync.Mutex // one stdin write at a time, in order
	mu       sync.Mutex // guards everything below
	stdin    *os.File   // pipe write end or the PTY master; nil once closed
	master   *os.File
	exited   bool
	exitCode *int
	signal   *string
	timedOut bool
	ended    time.Time
}

type procInfo struct {
	ID          string          `json:"id"`
	PID         int             `json:"pid"`
	Cmd         json.RawMessage `json:"cmd"`
	Tag         *string         `json:"tag"`
	PTY         bool            `json:"pty"`
	Status      string          `json:"status"`
	ExitCode    *int            `json:"exit_code"`
	Signal      *string         `json:"signal"`
	TimedOut    bool            `json:"timed_out"`
	StartedAt   float64         `json:"started_at"`
	EndedAt     *float64        `json:"ended_at"`
	StdoutBytes int64           `json:"stdout_bytes"`
	StderrBytes int64           `json:"stderr_bytes"`
	StdinOpen   bool            `json:"stdin_open"`
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

func (p *proc) info() procInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := procInfo{
		ID: p.id, PID: p.pid, Cmd: p.cmd, Tag: p.tag, PTY: p.pty, Status: "running",
		StartedAt: unixSeconds(p.started), StdinOpen: p.stdin != nil,
	}
	in.StdoutBytes, _, _ = p.outputs[0].state()
	in.StderrBytes, _, _ = p.outputs[1].state()
	if p.exited {
		in.Status, in.ExitCode, in.Signal, in.TimedOut = "exited", p.exitCode, p.signal, p.timedOut
		e := unixSeconds(p.ended)
		in.EndedAt = &e
	}
	return in
}

func (p *proc) finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// procTable is the agent's registry of background processes.
type procTable struct {
	mu    sync.Mutex
	procs map[string]*proc
}

func (t *procTable) get(id string) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.procs[id]; ok {
		return p, nil
	}
	return nil, api.NotFound("no process %q", id)
}

func newProcID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "p-" + hex.EncodeToString(b[:])
}

// handleProcesses serves GET (list) and POST (start) on /processes.
func (a *agent) handleProcesses(w http.ResponseWriter, r *http.Request) {
	if !api.RequireMethod(w, r, http.MethodGet, http.MethodPost) {
		return
	}
	if r.Method == http.MethodGet {
		a.procs.mu.Lock()
		list := make([]*proc, 0, len(a.procs.procs))
		for _, p := range a.procs.procs {
			list = append(list, p)
		}
		a.procs.mu.Unlock()
		sort.Slice(list, func(i, j int) bool { return list[i].started.Before(list[j].started) })
		infos := make([]procInfo, len(list))
		for i, p := range list {
			infos[i] = p.info()
		}
		api.WriteJSON(w, http.StatusOK, map[string]any{"processes": infos})
		return
	}
	p, err := a.startProc(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusCreated, p.info())
}

func (a *agent) startProc(r *http.Request) (*proc, error) {
	req, s, err := a.parseExec(r)
	if err != nil {
		return nil, err
	}
	if req.Tag != nil && len(*req.Tag) > 128 {
		return nil, api.BadRequest("tag must be at most 128 bytes")
	}
	var size *ptySize
	if req.PTY {
		if req.Rows < 0 || req.Cols < 0 || req.Rows > 0xffff || req.Cols > 0xffff {
			return nil, api.BadRequest("rows and cols must be between 1 and 65535")
		}
		size = &ptySize{rows: req.Rows, cols: req.Cols}
	}
	id := newProcID()
	c, err := a.spawn(s, true, size)
	if err != nil {
		return nil, err
	}
	p := &proc{
		id: id, pid: c.pid, cmd: req.Cmd, tag: req.Tag, pty: req.PTY, started: time.Now(),
		done: make(chan struct{}), stdin: c.stdin, master: c.master,
	}
	p.outputs[0] = newOutBuf(procOutputLimit, a.spillDir, id+".stdout")
	p.outputs[1] = newOutBuf(procOutputLimit, a.spillDir, id+".stderr")
	var pumps []*pump
	if c.master != nil {
		p.stdin = c.master
		pumps = append(pumps, startPump(c.master, true, func(b []byte) { _, _ = p.outputs[0].Write(b) }))
	} else {
		pumps = append(pumps,
			startPump(c.stdout, false, func(b []byte) { _, _ = p.outputs[0].Write(b) }),
			startPump(c.stderr, false, func(b []byte) { _, _ = p.outputs[1].Write(b) }))
	}
	if s.hasStdin {
		p.ioMu.Lock() // taken now so later writes queue behind the initial input
		go func() {
			defer p.ioMu.Unlock()
			_, _ = p.stdin.Write(s.stdin)
		}()
	}
	go p.monitor(c, s.timeout, pumps)
	a.procs.mu.Lock()
	a.procs.procs[id] = p
	a.procs.mu.Unlock()
	return p, nil
}

// monitor records the exit once the output has settled, so a process is
// reported exited only when it is and its output is complete.
func (p *proc) monitor(c *child, timeout time.Duration, pumps []*pump) {
	ws, timedOut := waitExit(context.Background(), c.pid, c.exit, timeout)
	ended := time.Now()
	settle(pumps...)
	p.outputs[0].close()
	p.outputs[1].close()
	code, sig := exitInfo(ws)
	if timedOut {
		code = 124
	}
	p.mu.Lock()
	p.exited, p.exitCode, p.signal, p.timedOut, p.ended = true, &code, sig, timedOut, ended
	stdin, master := p.stdin, p.master
	p.stdin, p.master = nil, nil
	p.mu.Unlock()
	closeAll(stdin)
	if master != stdin {
		closeAll(master)
	}
	close(p.done)
}

// handleProcess routes /processes/{id}[/action].
func (a *agent) handleProcess(w http.ResponseWriter, r *http.Request) {
	id, action, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/processes/"), "/")
	p, err := a.procs.get(id)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	type route struct {
		method string
		fn     func(http.ResponseWriter, *http.Request, *proc) error
	}
	routes := map[string]route{
		"":       {http.MethodGet, nil},
		"output": {http.MethodGet, a.procOutput},
		"follow": {http.MethodGet, a.procFollow},
		"stdin":  {http.MethodPost, a.procStdin},
		"signal": {http.MethodPost, a.procSignal},
		"resize": {http.MethodPost, a.procResize},
		"wait":   {http.MethodGet, a.procWait},
	}
	rt, ok := routes[action]
	if !ok {
		api.WriteError(w, api.NotFound("no route %s", r.URL.Path))
		return
	}
	if action == "" {
		if !api.RequireMethod(w, r, http.MethodGet, http.MethodDelete) {
			return
		}
		if r.Method == http.MethodDelete {
			a.deleteProc(p)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		api.WriteJSON(w, http.StatusOK, p.info())
		return
	}
	if !api.RequireMethod(w, r, rt.method) {
		return
	}
	if err := rt.fn(w, r, p); err != nil {
		api.WriteError(w, err)
	}
}

// deleteProc kills the process group (the leader, or what it left behind) and forgets it.
func (a *agent) deleteProc(p *proc) {
	a.procs.mu.Lock()
	delete(a.procs.procs, p.id)
	a.procs.mu.Unlock()
	if !p.finished() {
		killGroup(p.pid)
	} else if _, err := os.Stat("/proc/" + strconv.Itoa(p.pid)); os.IsNotExist(err) {
		// The leader is gone (reaped). Linux does not hand out a pid while a process group
		// of that id has members, so -pid reaches only the leftovers (`cmd &`, daemons that
		// kept the group). If /proc/<pid> exists, the number was reused after the group
		// emptied: that is someone else's process, so nothing is sent.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	p.outputs[0].remove()
	p.outputs[1].remove()
}

func queryInt(r *http.Request, name string, def int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, api.BadRequest("%s must be a non-negative integer", name)
	}
	return n, nil
}

func queryEncoding(r *http.Request) (bool, error) {
	switch e := r.URL.Query().Get("encoding"); e {
	case "", "text":
		return false, nil
	case "base64":
		return true, nil
	default:
		return false, api.BadRequest("encoding must be text or base64")
	}
}

type outputResult struct {
	Stream     string `json:"stream"`
	Offset     int64  `json:"offset"`
	NextOffset int64  `json:"next_offset"`
	Data       string `json:"data"`
	Encoding   string `json:"encoding"`
	EOF        bool   `json:"eof"`
	Dropped    bool   `json:"dropped"`
}

// maxOutputRead bounds one /output answer.
const maxOutputRead = 4 << 20

func (a *agent) procOutput(w http.ResponseWriter, r *http.Request, p *proc) error {
	stream := r.URL.Query().Get("stream")
	idx := 0
	switch stream {
	case "", "stdout":
		stream = "stdout"
	case "stderr":
		idx = 1
	default:
		return api.BadRequest("stream must be stdout or stderr")
	}
	off, err := queryInt(r, "offset", 0)
	if err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", 65536)
	if err != nil {
		return err
	}
	if limit == 0 || limit > maxOutputRead {
		limit = maxOutputRead
	}
	b64, err := queryEncoding(r)
	if err != nil {
		return err
	}
	buf := p.outputs[idx]
	data, start, dropped, err := buf.read(off, int(limit))
	if err != nil {
		return api.BadRequest("%v", err)
	}
	fin := p.finished() // checked after the read: if true, total below is final
	total, _, _ := buf.state()
	end := start + int64(len(data))
	eof := fin && end == total
	if !b64 && !eof {
		data = data[:completeUTF8(data)]
		end = start + int64(len(data))
	}
	api.WriteJSON(w, http.StatusOK, outputResult{
		Stream: stream, Offset: start, NextOffset: end, Data: encode(data, b64),
		Encoding: encodingName(b64), EOF: eof, Dropped: dropped,
	})
	return nil
}

// procFollow streams output from the given offsets as NDJSON, live, then
// the exit line; a client that lost its connection resumes from the last
// offsets it saw.
func (a *agent) procFollow(w http.ResponseWriter, r *http.Request, p *proc) error {
	b64, err := queryEncoding(r)
	if err != nil {
		return err
	}
	streams := 2
	if p.pty {
		streams = 1
	}
	var pos [2]int64
	for i, name := range []string{"stdout_offset", "stderr_offset"} {
		if pos[i], err = queryInt(r, name, 0); err != nil {
			return err
		}
		if total, _, _ := p.outputs[i].state(); pos[i] > total {
			return api.BadRequest("%s %d is past the end of the stream (%d)", name, pos[i], total)
		}
	}
	out := newNDJSON(w)
	chunkers := [2]*textChunker{
		{stream: "stdout", b64: b64, offset: pos[0]},
		{stream: "stderr", b64: b64, offset: pos[1]},
	}
	for {
		var wake [2]<-chan struct{}
		fin := p.finished()
		atEnd := true
		for i := 0; i < streams; i++ {
			total, _, changed := p.outputs[i].state()
			wake[i] = changed
			for pos[i] < total {
				data, start, dropped, err := p.outputs[i].read(pos[i], 64<<10)
				if err != nil || len(data) == 0 {
					pos[i] = total // unreadable (the process was deleted): nothing more to send
					break
				}
				if dropped {
					if ev := chunkers[i].chunk(nil, true); ev != nil {
						out.send(ev)
					}
					chunkers[i].offset = start
				}
				pos[i] = start + int64(len(data))
				if ev := chunkers[i].chunk(data, false); ev != nil {
					out.send(ev)
				}
			}
			if pos[i] < total {
				atEnd = false
			}
		}
		if fin && atEnd {
			break
		}
		select {
		case <-wake[0]:
		case <-wake[1]:
		case <-p.done:
		case <-r.Context().Done():
			return nil
		}
	}
	for i := 0; i < streams; i++ {
		if ev := chunkers[i].chunk(nil, true); ev != nil {
			out.send(ev)
		}
	}
	in := p.info()
	ev := exitEvent{Type: "exit", TimedOut: in.TimedOut, Signal: in.Signal}
	if in.ExitCode != nil {
		ev.ExitCode = *in.ExitCode
	}
	if in.EndedAt != nil {
		ev.DurationS = *in.EndedAt - in.StartedAt
	}
	out.send(ev)
	return nil
}

type stdinRequest struct {
	Data     string `json:"data"`
	Encoding string `json:"encoding"`
	Close    bool   `json:"close"`
}

// stdinWriteTimeout bounds a write to a process that does not read its input.
const stdinWriteTimeout = 30 * time.Second

func (a *agent) procStdin(w http.ResponseWriter, r *http.Request, p *proc) error {
	var req stdinRequest
	if err := api.ReadJSON(r, &req); err != nil {
		return err
	}
	data := []byte(req.Data)
	switch req.Encoding {
	case "", "text":
	case "base64":
		b, err := base64.StdEncoding.DecodeString(req.Data)
		if err != nil {
			return api.BadRequest("data is not valid base64: %v", err)
		}
		data = b
	default:
		return api.BadRequest("encoding must be text or base64")
	}
	p.ioMu.Lock()
	defer p.ioMu.Unlock()
	p.mu.Lock()
	f, exited := p.stdin, p.exited
	p.mu.Unlock()
	if exited {
		return api.Conflict("process %s has exited", p.id)
	}
	if f == nil {
		return api.Conflict("stdin of process %s is closed", p.id)
	}
	if req.Close && p.pty {
		data = append(data, 4) // ^D: a terminal has no end of input but the EOF character
	}
	if len(data) > 0 {
		_ = f.SetWriteDeadline(time.Now().Add(stdinWriteTimeout))
		n, err := f.Write(data)
		_ = f.SetWriteDeadline(time.Time{})
		if err != nil {
			return api.Conflict("stdin write failed after %d of %d bytes: %v", n, len(data), err)
		}
	}
	if req.Close && !p.pty {
		p.mu.Lock()
		if p.stdin == f {
			p.stdin = nil
		}
		p.mu.Unlock()
		_ = f.Close()
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// parseSignal accepts "TERM", "SIGTERM", "term", "15" or 15.
func parseSignal(raw json.RawMessage) (syscall.Signal, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return syscall.SIGTERM, nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		var n int
		if err := json.Unmarshal(raw, &n); err != nil {
			return 0, api.BadRequest("signal must be a name or a number")
		}
		name = strconv.Itoa(n)
	}
	if n, err := strconv.Atoi(name); err == nil {
		if n < 1 || n > 64 {
			return 0, api.BadRequest("signal %d out of range", n)
		}
		return syscall.Signal(n), nil
	}
	name = strings.TrimPrefix(strings.ToUpper(name), "SIG")
	for s, n := range signalNames {
		if n == name {
			return s, nil
		}
	}
	return 0, api.BadRequest("unknown signal %q", name)
}

func (a *agent) procSignal(w http.ResponseWriter, r *http.Request, p *proc) error {
	var req struct {
		Signal json.RawMessage `json:"signal"`
		Group  *bool           `json:"group"`
	}
	if err := api.ReadJSON(r, &req); err != nil {
		return err
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		return err
	}
	if p.finished() {
		return api.Conflict("process %s has exited", p.id)
	}
	target := -p.pid // the whole group, grandchildren included
	if req.Group != nil && !*req.Group {
		target = p.pid
	}
	if err := syscall.Kill(target, sig); err != nil {
		return api.Conflict("signal %s: %v", signalName(sig), err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *agent) procResize(w http.ResponseWriter, r *http.Request, p *proc) error {
	var req struct {
		Rows int `json:"rows"`
		Cols int `json:"cols"`
	}
	if err := api.ReadJSON(r, &req); err != nil {
		return err
	}
	if req.Rows < 1 || req.Cols < 1 || req.Rows > 0xffff || req.Cols > 0xffff {
		return api.BadRequest("rows and cols must be between 1 and 65535")
	}
	if !p.pty {
		return api.Conflict("process %s has no terminal", p.id)
	}
	p.mu.Lock()
	master := p.master
	p.mu.Unlock()
	if master == nil {
		return api.Conflict("process %s has exited", p.id)
	}
	if err := resizePTY(master, req.Rows, req.Cols); err != nil {
		return api.Conflict("resize: %v", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// procWait answers when the process exits or the timeout passes, whichever
// is first; on timeout the info still says running.
func (a *agent) procWait(w http.ResponseWriter, r *http.Request, p *proc) error {
	var timer <-chan time.Time
	if v := r.URL.Query().Get("timeout_s"); v != "" {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs < 0 || secs > 1e9 {
			return api.BadRequest("timeout_s must be a non-negative number")
		}
		t := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-p.done:
	case <-timer:
	case <-r.Context().Done():
		return nil
	}
	api.WriteJSON(w, http.StatusOK, p.info())
	return nil
}
