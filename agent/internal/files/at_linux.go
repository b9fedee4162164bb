package files

import (
	"syscall"
	"unsafe"
)

// The *at system calls the walk in walk.go is made of. Package syscall lacks some of
// them (readlinkat, linkat, symlinkat, unlinkat with flags, on every architecture and
// Go version the agent builds with), so those are raw calls.

const (
	// oPath is O_PATH, the same value on every Linux architecture Go supports; package
	// syscall does not name it everywhere. An O_PATH descriptor opens no file for I/O
	// (no read permission needed, a FIFO does not block) and serves as an *at dirfd.
	oPath             = 0x200000
	atRemoveDir       = 0x200
	atSymlinkNoFollow = 0x100
)

// again retries a call interrupted by a signal (the Go runtime's preemption signals
// can interrupt file system calls on network and FUSE file systems).
func again(f func() error) error {
	for {
		if err := f(); err != syscall.EINTR {
			return err
		}
	}
}

func openat(dirfd int, name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := syscall.Openat(dirfd, name, flags|syscall.O_CLOEXEC, mode)
		if err != syscall.EINTR {
			return fd, err
		}
	}
}

func openRootFd() (int, error) {
	return openat(-100 /* AT_FDCWD */, "/", oPath|syscall.O_DIRECTORY, 0)
}

func closeFd(fd int) { _ = syscall.Close(fd) }

func fstatFd(fd int) (entry, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return entry{}, err
	}
	sec, nsec := st.Mtim.Unix()
	return entry{mode: st.Mode, uid: st.Uid, gid: st.Gid, size: st.Size, mtimeNs: sec*1e9 + nsec}, nil
}

// readlinkat reads the link at name in dirfd; with name "" it reads the link dirfd is
// itself (opened O_PATH|O_NOFOLLOW), so what is read is what was checked.
func readlinkat(dirfd int, name string) (string, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return "", err
	}
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, _, e := syscall.Syscall6(syscall.SYS_READLINKAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
			uintptr(unsafe.Pointer(&buf[0])), uintptr(size), 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return "", e
		}
		if int(n) < size {
			return string(buf[:n]), nil
		}
		if size >= 1<<16 {
			return "", syscall.ENAMETOOLONG
		}
	}
}

func mkdirat(dirfd int, name string, mode uint32) error {
	return again(func() error { return syscall.Mkdirat(dirfd, name, mode) })
}

func mkfifoat(dirfd int, name string, mode uint32) error {
	return again(func() error { return syscall.Mknodat(dirfd, name, syscall.S_IFIFO|mode, 0) })
}

func renameat(olddirfd int, oldname string, newdirfd int, newname string) error {
	return again(func() error { return syscall.Renameat(olddirfd, oldname, newdirfd, newname) })
}

func fchownat(dirfd int, name string, uid, gid int, flags int) error {
	return syscall.Fchownat(dirfd, name, uid, gid, flags)
}

func unlinkat(dirfd int, name string, flags int) error {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return err
	}
	return again(func() error {
		_, _, e := syscall.Syscall(syscall.SYS_UNLINKAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), uintptr(flags))
		return errnoErr(e)
	})
}

// linkat hard-links oldname without following a symlink there (flags 0).
func linkat(olddirfd int, oldname string, newdirfd int, newname string) error {
	o, err := syscall.BytePtrFromString(oldname)
	if err != nil {
		return err
	}
	n, err := syscall.BytePtrFromString(newname)
	if err != nil {
		return err
	}
	return again(func() error {
		_, _, e := syscall.Syscall6(syscall.SYS_LINKAT, uintptr(olddirfd), uintptr(unsafe.Pointer(o)),
			uintptr(newdirfd), uintptr(unsafe.Pointer(n)), 0, 0)
		return errnoErr(e)
	})
}

func symlinkat(target string, dirfd int, name string) error {
	t, err := syscall.BytePtrFromString(target)
	if err != nil {
		return err
	}
	n, err := syscall.BytePtrFromString(name)
	if err != nil {
		return err
	}
	return again(func() error {
		_, _, e := syscall.Syscall(syscall.SYS_SYMLINKAT, uintptr(unsafe.Pointer(t)), uintptr(dirfd), uintptr(unsafe.Pointer(n)))
		return errnoErr(e)
	})
}

// setTimes sets an open file's access and modification times (futimens); errors are
// ignored, as tar does.
func setTimes(fd int, mtimeNs int64) {
	ts := [2]syscall.Timespec{syscall.NsecToTimespec(mtimeNs), syscall.NsecToTimespec(mtimeNs)}
	_, _, _ = syscall.Syscall6(syscall.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
