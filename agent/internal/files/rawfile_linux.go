package files

import (
	"syscall"
	"time"
	"unsafe"
)

// setMtime sets the open file's access and modification times; errors are ignored,
// as tar does.
func (f *rawFile) setMtime(t time.Time) {
	ts := [2]syscall.Timespec{syscall.NsecToTimespec(t.UnixNano()), syscall.NsecToTimespec(t.UnixNano())}
	// utimensat(fd, NULL, ...) is futimens: the open file, no second path lookup.
	_, _, _ = syscall.Syscall6(syscall.SYS_UTIMENSAT, uintptr(f.fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
}
