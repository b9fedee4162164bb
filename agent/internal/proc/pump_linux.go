package proc

import (
	"syscall"
	"unsafe"
)

// unreadBytes is how many bytes wait in a pipe or terminal (TIOCINQ, i.e. FIONREAD).
func unreadBytes(fd uintptr) (int, error) {
	var avail int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&avail))); e != 0 {
		return 0, e
	}
	return int(avail), nil
}
