package proc

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// BecomeSubreaper makes orphaned descendants reparent to the agent when it
// is not PID 1, so it reaps them just as init would (and tests can see it).
func BecomeSubreaper() {
	const prSetChildSubreaper = 36
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// CatchInheritedIgnores turns signals ignored when the agent started (a
// shell's background job, nohup, a CI runner) into caught-and-dropped ones:
// ignored dispositions survive exec, caught ones reset to default, so every
// command starts with the clean signal state it would have under a clean PID 1.
// Go will not catch signals 32 and 33 (libc's); those are set to default.
func CatchInheritedIgnores() {
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
