// Package proc starts and supervises the agent's children: the reaper that owns every
// wait(2), spawning with pipes or a terminal, output capture with spill files, and the
// table of background processes. It knows nothing of HTTP routes (internal/exec does).
package proc

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// Reaper owns every wait(2) in the agent. As PID 1 (or a child subreaper)
// the agent must collect orphaned zombies with wait4(-1), and that would
// steal exit statuses from anyone else waiting on a specific child, so no
// code calls exec.Cmd.Wait: children are started through Start, which
// registers the pid while holding the same lock the reaper holds while
// reaping, so an exit can never be collected before someone listens for it.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	all     bool // reap any child (orphans too), not only registered ones
}

// NewReaper starts the SIGCHLD loop. all=false waits only for registered
// pids, for embedding in a process that runs other children itself.
func NewReaper(all bool) *Reaper {
	r := &Reaper{waiters: map[int]chan syscall.WaitStatus{}, all: all}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		// The ticker is a safety net only: SIGCHLDs coalesce but a pending
		// one always follows the last exit, so reap normally runs per signal.
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-sigs:
			case <-tick.C:
			}
			r.reap()
		}
	}()
	return r
}

// Start forks and execs a child and returns a channel that receives its
// wait status exactly once.
func (r *Reaper) Start(path string, argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *Reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ws syscall.WaitStatus
	if r.all {
		for {
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			r.dispatch(pid, ws)
		}
	}
	for pid := range r.waiters {
		if got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err == nil && got == pid {
			r.dispatch(pid, ws)
		}
	}
}

// dispatch hands a status to its waiter; statuses of orphans are dropped,
// which is all reaping them needs.
func (r *Reaper) dispatch(pid int, ws syscall.WaitStatus) {
	if ch, ok := r.waiters[pid]; ok {
		ch <- ws
		delete(r.waiters, pid)
	}
}

// live lists the registered children still running.
func (r *Reaper) live() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	pids := make([]int, 0, len(r.waiters))
	for pid := range r.waiters {
		pids = append(pids, pid)
	}
	return pids
}

// signalAll sends sig to every child's process group (each child leads its
// own); as PID 1 it signals every process in the namespace instead, which
// also reaches daemons that escaped their group.
func (r *Reaper) signalAll(sig syscall.Signal) {
	if os.Getpid() == 1 {
		_ = syscall.Kill(-1, sig)
		return
	}
	for _, pid := range r.live() {
		_ = syscall.Kill(-pid, sig)
		_ = syscall.Kill(pid, sig)
	}
}

// Shutdown forwards sig to the children, waits up to grace for them to
// exit, then SIGKILLs whatever is left.
func (r *Reaper) Shutdown(sig syscall.Signal, grace time.Duration) {
	r.signalAll(sig)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) && len(r.live()) > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if len(r.live()) > 0 {
		r.signalAll(syscall.SIGKILL)
		end := time.Now().Add(time.Second)
		for time.Now().Before(end) && len(r.live()) > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
}
