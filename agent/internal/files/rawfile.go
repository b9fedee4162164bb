package files

import (
	"os"
	"syscall"
	"time"
)

// rawFile is a file written with plain system calls. Tar uploads create thousands of
// small files: os.File would add an epoll registration per open, a 32 KiB buffer per
// copy (io.Copy through its ReadFrom) and a path lookup per utimes (futimens instead).
type rawFile struct {
	fd   int
	path string
}

// createExclAt creates name in dir (O_EXCL|O_NOFOLLOW: never through a symlink there).
func createExclAt(dir dirRef, name string, perm uint32) (*rawFile, error) {
	fd, err := openat(dir.fd, name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW, perm)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir.join(name), Err: err}
	}
	return &rawFile{fd: fd, path: dir.join(name)}, nil
}

func (f *rawFile) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := syscall.Write(f.fd, p[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return n, &os.PathError{Op: "write", Path: f.path, Err: err}
		}
		n += m
	}
	return n, nil
}

// finish sets the mode (raw st_mode bits) and, unless zero, the mtime, then closes.
func (f *rawFile) finish(mode uint32, mtime time.Time) error {
	if err := syscall.Fchmod(f.fd, mode); err != nil {
		f.close()
		return &os.PathError{Op: "chmod", Path: f.path, Err: err}
	}
	if !mtime.IsZero() {
		setTimes(f.fd, mtime.UnixNano())
	}
	if err := syscall.Close(f.fd); err != nil {
		return &os.PathError{Op: "close", Path: f.path, Err: err}
	}
	return nil
}

func (f *rawFile) close() { _ = syscall.Close(f.fd) }
