package proc

import (
	"context"
	"log"
	"os"
	"syscall"
	"time"
)

// Spec is a validated command, ready to start.
type Spec struct {
	Path     string
	Argv     []string
	Dir      string
	Env      []string
	Cred     *syscall.Credential
	Stdin    []byte
	HasStdin bool
	Timeout  time.Duration
}

// PTYSize is a terminal's size; zero fields mean 24 rows, 80 columns.
type PTYSize struct{ Rows, Cols int }

// Child is a started process; the agent holds the other ends of its stdio.
type Child struct {
	PID    int
	Exit   <-chan syscall.WaitStatus
	Stdout *os.File // nil with a PTY
	Stderr *os.File // nil with a PTY
	Stdin  *os.File // pipe write end; nil unless kept open
	Master *os.File // PTY master, else nil
}

// Spawn starts s in its own process group (a new session with a PTY). With
// keepStdin the stdin pipe (or PTY) stays open for later writes and s.Stdin
// is not written; otherwise s.Stdin is fed and closed, or stdin is /dev/null.
func (r *Reaper) Spawn(s *Spec, keepStdin bool, pty *PTYSize) (*Child, error) {
	c := &Child{}
	var childEnds []*os.File
	defer func() { CloseAll(childEnds...) }()
	attr := &syscall.ProcAttr{Dir: s.Dir, Env: s.Env, Sys: &syscall.SysProcAttr{Credential: s.Cred}}
	if pty != nil {
		master, slave, err := openPTY(pty.Rows, pty.Cols)
		if err != nil {
			return nil, err
		}
		childEnds = append(childEnds, slave)
		fd := slave.Fd()
		attr.Files = []uintptr{fd, fd, fd}
		attr.Sys.Setsid, attr.Sys.Setctty, attr.Sys.Ctty = true, true, 0
		c.Master = master
	} else {
		var stdin *os.File
		if keepStdin || s.HasStdin {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, err
			}
			stdin, c.Stdin = r, w
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
			CloseAll(c.Stdin)
			return nil, err
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			CloseAll(c.Stdin, outR, outW)
			return nil, err
		}
		childEnds = append(childEnds, outW, errW)
		c.Stdout, c.Stderr = outR, errR
		// Fd puts the child's ends back in blocking mode, as programs expect.
		attr.Files = []uintptr{stdin.Fd(), outW.Fd(), errW.Fd()}
		attr.Sys.Setpgid = true
	}
	pid, exit, err := r.Start(s.Path, s.Argv, attr)
	if err != nil {
		CloseAll(c.Stdin, c.Stdout, c.Stderr, c.Master)
		return nil, ExecFailed("start %s: %v", s.Argv[0], err)
	}
	c.PID, c.Exit = pid, exit
	if !keepStdin && s.HasStdin {
		w := c.Stdin
		if w == nil {
			w = c.Master
		}
		go func() {
			_, _ = w.Write(s.Stdin) // EPIPE when the child ignores stdin is fine
			if c.Stdin != nil {
				_ = c.Stdin.Close()
			}
		}()
	}
	return c, nil
}

// StartEntrypoint runs the image's own entrypoint+cmd as a supervised child
// with the agent's stdio, as user (empty: the agent's own); its exit is
// logged, the sandbox stays up.
func (r *Reaper) StartEntrypoint(argv, env []string, user string) error {
	path, err := LookPath(argv[0], env, "")
	if err != nil {
		return err
	}
	sys := &syscall.SysProcAttr{Setpgid: true}
	if user != "" {
		cred, userEnv, err := ResolveUser(user)
		if err != nil {
			return err
		}
		sys.Credential, env = cred, MergeEnv(env, userEnv)
	}
	attr := &syscall.ProcAttr{
		Env:   env,
		Files: []uintptr{os.Stdin.Fd(), os.Stdout.Fd(), os.Stderr.Fd()},
		Sys:   sys,
	}
	pid, exit, err := r.Start(path, argv, attr)
	if err != nil {
		return err
	}
	go func() {
		code, sig := ExitInfo(<-exit)
		if sig != nil {
			log.Printf("entrypoint (pid %d) killed by %s", pid, *sig)
		} else {
			log.Printf("entrypoint (pid %d) exited with %d", pid, code)
		}
	}()
	return nil
}

// CloseAll closes every file that is not nil.
func CloseAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}

// KillGroup SIGKILLs pid's process group (grandchildren included) and pid.
func KillGroup(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// WaitExit waits for the child; on timeout, or when ctx ends (the client
// went away), it kills the child's process group and keeps waiting.
// timedOut is true only when the kill is what ended the child.
func WaitExit(ctx context.Context, pid int, exit <-chan syscall.WaitStatus, timeout time.Duration) (ws syscall.WaitStatus, timedOut bool) {
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
			KillGroup(pid)
		case <-done:
			done = nil
			KillGroup(pid)
		}
	}
}
