package proc

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

type winsize struct{ rows, cols, xpixel, ypixel uint16 }

func ioctl(fd, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

func setWinsize(fd uintptr, rows, cols int) error {
	ws := winsize{rows: uint16(rows), cols: uint16(cols)}
	return ioctl(fd, syscall.TIOCSWINSZ, unsafe.Pointer(&ws))
}

// openPTY allocates a pseudo-terminal through /dev/ptmx with raw ioctls
// (posix_openpt needs libc). The master is non-blocking, so the runtime
// poller serves it and Close interrupts a pending Read; the slave stays
// blocking because the child's programs expect that.
func openPTY(rows, cols int) (master, slave *os.File, err error) {
	if rows <= 0 {
		rows = 24
	}
	if cols <= 0 {
		cols = 80
	}
	if rows > 0xffff || cols > 0xffff {
		return nil, nil, fmt.Errorf("terminal size %dx%d too large", rows, cols)
	}
	mfd, err := syscall.Open("/dev/ptmx", syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	fail := func(step string, err error) (*os.File, *os.File, error) {
		_ = syscall.Close(mfd)
		return nil, nil, fmt.Errorf("%s: %w", step, err)
	}
	var n uint32
	if err := ioctl(uintptr(mfd), syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		return fail("TIOCGPTN", err)
	}
	var unlock int32
	if err := ioctl(uintptr(mfd), syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		return fail("TIOCSPTLCK", err)
	}
	if err := setWinsize(uintptr(mfd), rows, cols); err != nil {
		return fail("TIOCSWINSZ", err)
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	sfd, err := syscall.Open(name, syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fail("open "+name, err)
	}
	return os.NewFile(uintptr(mfd), "/dev/ptmx"), os.NewFile(uintptr(sfd), name), nil
}

// resizePTY sets the terminal size; the kernel sends SIGWINCH to the
// foreground process group. It goes through SyscallConn because File.Fd
// would switch the master back to blocking mode.
func resizePTY(master *os.File, rows, cols int) error {
	if rows <= 0 || cols <= 0 || rows > 0xffff || cols > 0xffff {
		return fmt.Errorf("bad terminal size %dx%d", rows, cols)
	}
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) { ierr = setWinsize(fd, rows, cols) }); err != nil {
		return err
	}
	return ierr
}
