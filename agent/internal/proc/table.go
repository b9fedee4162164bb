package proc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// OutputLimit bounds the in-memory part of each background-process stream.
const OutputLimit = 4 << 20

// Proc is a background process: it outlives the request that started it,
// and its output stays readable by offset until it is deleted.
type Proc struct {
	id       string
	pid      int
	cmd      json.RawMessage
	tag      *string
	pty      bool
	started  time.Time
	outputs  [2]*OutBuf // stdout, stderr (unused with a PTY)
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

// Info is a process as the API describes it (docs/agent-api.md, "Background processes").
type Info struct {
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

// Info describes the process now.
func (p *Proc) Info() Info {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := Info{
		ID: p.id, PID: p.pid, Cmd: p.cmd, Tag: p.tag, PTY: p.pty, Status: "running",
		StartedAt: unixSeconds(p.started), StdinOpen: p.stdin != nil,
	}
	in.StdoutBytes, _, _ = p.outputs[0].State()
	in.StderrBytes, _, _ = p.outputs[1].State()
	if p.exited {
		in.Status, in.ExitCode, in.Signal, in.TimedOut = "exited", p.exitCode, p.signal, p.timedOut
		e := unixSeconds(p.ended)
		in.EndedAt = &e
	}
	return in
}

// ID is the process's id in the table ("p-…").
func (p *Proc) ID() string { return p.id }

// PTY is true when stdout and stderr are one terminal stream.
func (p *Proc) PTY() bool { return p.pty }

// Output is stream i: 0 stdout, 1 stderr.
func (p *Proc) Output(i int) *OutBuf { return p.outputs[i] }

// Done is closed once the process has exited and its output is complete.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Finished reports whether Done is closed.
func (p *Proc) Finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Table is the agent's registry of background processes.
type Table struct {
	reaper *Reaper
	spill  *SpillDir
	mu     sync.Mutex
	procs  map[string]*Proc
}

// NewTable starts processes with r and spills their output into spill.
func NewTable(r *Reaper, spill *SpillDir) *Table {
	return &Table{reaper: r, spill: spill, procs: map[string]*Proc{}}
}

// Get finds a process by id (404 not_found otherwise).
func (t *Table) Get(id string) (*Proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.procs[id]; ok {
		return p, nil
	}
	return nil, api.NotFound("no process %q", id)
}

// List returns every known process, oldest first.
func (t *Table) List() []*Proc {
	t.mu.Lock()
	list := make([]*Proc, 0, len(t.procs))
	for _, p := range t.procs {
		list = append(list, p)
	}
	t.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].started.Before(list[j].started) })
	return list
}

func newProcID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "p-" + hex.EncodeToString(b[:])
}

// Start spawns s as a background process with stdin kept open (a terminal when pty
// is set); cmd and tag are recorded as given.
func (t *Table) Start(s *Spec, pty *PTYSize, cmd json.RawMessage, tag *string) (*Proc, error) {
	id := newProcID()
	c, err := t.reaper.Spawn(s, true, pty)
	if err != nil {
		return nil, err
	}
	p := &Proc{
		id: id, pid: c.PID, cmd: cmd, tag: tag, pty: pty != nil, started: time.Now(),
		done: make(chan struct{}), stdin: c.Stdin, master: c.Master,
	}
	p.outputs[0] = NewOutBuf(OutputLimit, t.spill, id+".stdout")
	p.outputs[1] = NewOutBuf(OutputLimit, t.spill, id+".stderr")
	var pumps []*Pump
	if c.Master != nil {
		p.stdin = c.Master
		pumps = append(pumps, StartPump(c.Master, true, func(b []byte) { _, _ = p.outputs[0].Write(b) }))
	} else {
		pumps = append(pumps,
			StartPump(c.Stdout, false, func(b []byte) { _, _ = p.outputs[0].Write(b) }),
			StartPump(c.Stderr, false, func(b []byte) { _, _ = p.outputs[1].Write(b) }))
	}
	if s.HasStdin {
		p.ioMu.Lock() // taken now so later writes queue behind the initial input
		go func() {
			defer p.ioMu.Unlock()
			_, _ = p.stdin.Write(s.Stdin)
		}()
	}
	go p.monitor(c, s.Timeout, pumps)
	t.mu.Lock()
	t.procs[id] = p
	t.mu.Unlock()
	return p, nil
}

// monitor records the exit once the output has settled, so a process is
// reported exited only when it is and its output is complete.
func (p *Proc) monitor(c *Child, timeout time.Duration, pumps []*Pump) {
	ws, timedOut := WaitExit(context.Background(), c.PID, c.Exit, timeout)
	ended := time.Now()
	Settle(pumps...)
	p.outputs[0].Close()
	p.outputs[1].Close()
	code, sig := ExitInfo(ws)
	if timedOut {
		code = 124
	}
	p.mu.Lock()
	p.exited, p.exitCode, p.signal, p.timedOut, p.ended = true, &code, sig, timedOut, ended
	stdin, master := p.stdin, p.master
	p.stdin, p.master = nil, nil
	p.mu.Unlock()
	CloseAll(stdin)
	if master != stdin {
		CloseAll(master)
	}
	close(p.done)
}

// Delete kills the process group (the leader, or what it left behind) and forgets it.
func (t *Table) Delete(p *Proc) {
	t.mu.Lock()
	delete(t.procs, p.id)
	t.mu.Unlock()
	if !p.Finished() {
		KillGroup(p.pid)
	} else if _, err := os.Stat("/proc/" + strconv.Itoa(p.pid)); os.IsNotExist(err) {
		// The leader is gone (reaped). Linux does not hand out a pid while a process group
		// of that id has members, so -pid reaches only the leftovers (`cmd &`, daemons that
		// kept the group). If /proc/<pid> exists, the number was reused after the group
		// emptied: that is someone else's process, so nothing is sent.
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	p.outputs[0].Remove()
	p.outputs[1].Remove()
}
