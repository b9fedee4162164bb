package proc

import "syscall"

// platformSignals are the names only Linux has.
var platformSignals = map[syscall.Signal]string{syscall.SIGPWR: "PWR"}
