//go:build !linux

package proc

import "syscall"

var platformSignals = map[syscall.Signal]string{}
