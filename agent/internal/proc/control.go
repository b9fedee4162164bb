package proc

import (
	"syscall"
	"time"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// stdinWriteTimeout bounds a write to a process that does not read its input.
const stdinWriteTimeout = 30 * time.Second

// WriteStdin writes data in order with other writes; close ends the input (with a
// terminal: sends ^D, and the terminal stays open). 409 conflict once stdin is closed,
// the process has exited, or the write did not complete in 30 s.
func (p *Proc) WriteStdin(data []byte, close bool) error {
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
	if close && p.pty {
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
	if close && !p.pty {
		p.mu.Lock()
		if p.stdin == f {
			p.stdin = nil
		}
		p.mu.Unlock()
		_ = f.Close()
	}
	return nil
}

// Signal sends sig to the process group (group) or to the process alone.
func (p *Proc) Signal(sig syscall.Signal, group bool) error {
	if p.Finished() {
		return api.Conflict("process %s has exited", p.id)
	}
	target := -p.pid // the whole group, grandchildren included
	if !group {
		target = p.pid
	}
	if err := syscall.Kill(target, sig); err != nil {
		return api.Conflict("signal %s: %v", SignalName(sig), err)
	}
	return nil
}

// Resize sets the terminal's size (409 without a terminal or after exit).
func (p *Proc) Resize(rows, cols int) error {
	if !p.pty {
		return api.Conflict("process %s has no terminal", p.id)
	}
	p.mu.Lock()
	master := p.master
	p.mu.Unlock()
	if master == nil {
		return api.Conflict("process %s has exited", p.id)
	}
	if err := resizePTY(master, rows, cols); err != nil {
		return api.Conflict("resize: %v", err)
	}
	return nil
}
