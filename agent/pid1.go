package main

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// reaper owns every wait(2) in the agent. As PID 1 (or a child subreaper)
// the agent must collect orphaned zombies with wait4(-1), and that would
// steal exit statuses from anyone else waiting on a specific child, so no
// code calls exec.Cmd.Wait: children are started through start, which
// registers the pid while holding the same lock the reaper holds while
// reaping, so an exit can never be collected before someone listens for it.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	all     bool // reap any child (orphans too), not only registered ones
}

// newReaper starts the SIGCHLD loop. all=false waits only for registered
// pids, for embedding in a process that runs other children itself.
func newReaper(all bool) *reaper {
	r := &reaper{waiters: map[int]chan syscall.WaitStatus{}, all: all}
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

// start forks and execs a child and returns a channel that receives its
// wait status exactly once.
func (r *reaper) start(path string, argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
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

func (r *reaper) reap() {
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
func (r *reaper) dispatch(pid int, ws syscall.WaitStatus) {
	if ch, ok := r.waiters[pid]; ok {
		ch <- ws
		delete(r.waiters, pid)
	}
}

// live lists the registered children still running.
func (r *reaper) live() []int {
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
func (r *reaper) signalAll(sig syscall.Signal) {
	if os.Getpid() == 1 {
		_ = syscall.Kill(-1, sig)
		return
	}
	for _, pid := range r.live() {
		_ = syscall.Kill(-pid, sig)
		_ = syscall.Kill(pid, sig)
	}
}

// shutdown forwards sig to the children, waits up to grace for them to
// exit, then SIGKILLs whatever is left.
func (r *reaper) shutdown(sig syscall.Signal, grace time.Duration) {
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

// becomeSubreaper makes orphaned descendants reparent to the agent when it
// is not PID 1, so it reaps them just as init would (and tests can see it).
func becomeSubreaper() {
	const prSetChildSubreaper = 36
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// exitInfo turns a wait status into a shell-style exit code and signal name.
func exitInfo(ws syscall.WaitStatus) (int, *string) {
	if ws.Signaled() {
		name := signalName(ws.Signal())
		return 128 + int(ws.Signal()), &name
	}
	return ws.ExitStatus(), nil
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "HUP", syscall.SIGINT: "INT", syscall.SIGQUIT: "QUIT", syscall.SIGILL: "ILL",
	syscall.SIGTRAP: "TRAP", syscall.SIGABRT: "ABRT", syscall.SIGBUS: "BUS", syscall.SIGFPE: "FPE",
	syscall.SIGKILL: "KILL", syscall.SIGUSR1: "USR1", syscall.SIGSEGV: "SEGV", syscall.SIGUSR2: "USR2",
	syscall.SIGPIPE: "PIPE", syscall.SIGALRM: "ALRM", syscall.SIGTERM: "TERM", syscall.SIGCHLD: "CHLD",
	syscall.SIGCONT: "CONT", syscall.SIGSTOP: "STOP", syscall.SIGTSTP: "TSTP", syscall.SIGTTIN: "TTIN",
	syscall.SIGTTOU: "TTOU", syscall.SIGURG: "URG", syscall.SIGXCPU: "XCPU", syscall.SIGXFSZ: "XFSZ",
	syscall.SIGVTALRM: "VTALRM", syscall.SIGPROF: "PROF", syscall.SIGWINCH: "WINCH", syscall.SIGIO: "IO",
	syscall.SIGPWR: "PWR", syscall.SIGSYS: "SYS",
}

func signalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	return "SIG" + strconv.Itoa(int(s))
}

// catchInheritedIgnores turns signals ignored when the agent started (a
// shell's background job, nohup, a CI runner) into caught-and-dropped ones:
// ignored dispositions survive exec, caught ones reset to default, so every
// command starts with the clean signal state it would have under a clean PID 1.
// Go will not catch signals 32 and 33 (libc's); those are set to default.
func catchInheritedIgnores() {
	var sigs []os.Signal
	for _, s := range ignoredSignals() {
		sigs = append(sigs, s)
	}
	if len(sigs) == 0 {
		return
	}
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, sigs...)
	go func() {
		for range ch {
		}
	}()
	for _, s := range ignoredSignals() {
		var act [4]uint64 // struct kernel_sigaction, all zero: SIG_DFL
		_, _, _ = syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(s),
			uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0)
	}
}

// ignoredSignals lists the signals this process ignores (SigIgn in /proc/self/status).
func ignoredSignals() []syscall.Signal {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	var mask uint64
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "SigIgn:") {
			mask, _ = strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "SigIgn:")), 16, 64)
		}
	}
	var out []syscall.Signal
	for n := 1; n <= 64; n++ {
		s := syscall.Signal(n)
		if mask&(1<<(n-1)) != 0 && s != syscall.SIGKILL && s != syscall.SIGSTOP {
			out = append(out, s)
		}
	}
	return out
}
