package proc

import (
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// PipeGrace is how long the pipes may stay quiet after the main child
	// exited before we stop waiting for EOF: a grandchild that inherited them
	// (a daemon started with &) can hold them open forever.
	PipeGrace = 200 * time.Millisecond
	// MaxSettle bounds that wait even when a grandchild keeps writing.
	MaxSettle = 5 * time.Second
)

// Pump reads a parent-side pipe to EOF, handing each chunk to sink.
type Pump struct {
	done chan struct{}
	n    atomic.Int64
	busy atomic.Bool     // a chunk was read and is still being handed on
	rc   syscall.RawConn // for FIONREAD: bytes waiting in the pipe, unread
}

// StartPump starts reading r. A pipe's read end is closed at EOF; a PTY
// master (keepOpen) is not, since closing it hangs up the terminal, which
// SIGHUPs a session still exiting.
func StartPump(r *os.File, keepOpen bool, sink func([]byte)) *Pump {
	p := &Pump{done: make(chan struct{})}
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

// Done is closed once the pump reached the end of its pipe.
func (p *Pump) Done() <-chan struct{} { return p.done }

// drained reports that no output waits in the pipe or in the pump's hands.
// Quiet pipes only count as quiet when drained: on a loaded machine the pump
// may not run for a while, and output already written must never be dropped.
func (p *Pump) drained() bool {
	select {
	case <-p.done:
		return true
	default:
	}
	if p.busy.Load() {
		return false
	}
	var avail int
	failed := false
	if err := p.rc.Control(func(fd uintptr) {
		var err error
		avail, err = unreadBytes(fd)
		failed = err != nil
	}); err != nil || failed {
		return true // closed, or not a pipe/terminal: nothing more can be read
	}
	return avail == 0
}

// AllDrained is true when every pump is drained.
func AllDrained(pumps []*Pump) bool {
	for _, p := range pumps {
		if !p.drained() {
			return false
		}
	}
	return true
}

// Settle waits, after the main child exited, until the pumps reach EOF, or
// the pipes have been quiet and drained for PipeGrace (a grandchild holds them open),
// or MaxSettle passed. The pumps keep draining afterwards.
func Settle(pumps ...*Pump) {
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
				if (now.Sub(last) >= PipeGrace && AllDrained(pumps)) || now.Sub(start) >= MaxSettle {
					return
				}
			}
		}
	}
}
