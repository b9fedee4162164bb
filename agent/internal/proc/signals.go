package proc

import (
	"strconv"
	"strings"
	"syscall"
)

// ExitInfo turns a wait status into a shell-style exit code and signal name.
func ExitInfo(ws syscall.WaitStatus) (int, *string) {
	if ws.Signaled() {
		name := SignalName(ws.Signal())
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
	syscall.SIGSYS: "SYS",
}

func init() {
	for s, n := range platformSignals {
		signalNames[s] = n
	}
}

// SignalName is the name without the SIG prefix ("TERM"), or "SIG<n>" for one without a name.
func SignalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	return "SIG" + strconv.Itoa(int(s))
}

// SignalByName finds a signal by its name, with or without SIG, in any case.
func SignalByName(name string) (syscall.Signal, bool) {
	name = strings.TrimPrefix(strings.ToUpper(name), "SIG")
	for s, n := range signalNames {
		if n == name {
			return s, true
		}
	}
	return 0, false
}
