package proc

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

const dirFlags = syscall.O_RDONLY | syscall.O_DIRECTORY | syscall.O_NOFOLLOW | syscall.O_CLOEXEC

// spillHandle is the open spill folder; files are made relative to it.
type spillHandle struct {
	fd   int
	path string
}

// open walks from / to the folder with openat(O_NOFOLLOW), creating what is missing
// (0755 on the way, 0700 the folder itself), and checks the folder is private.
func (d *SpillDir) open(create bool) (*spillHandle, error) {
	if d.path == "/" {
		return nil, d.notAFolder("/")
	}
	fd, err := syscall.Open("/", dirFlags, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: "/", Err: err}
	}
	parts := strings.Split(strings.TrimPrefix(d.path, "/"), "/")
	for i, part := range parts {
		next, err := syscall.Openat(fd, part, dirFlags, 0)
		if err == syscall.ENOENT && create {
			mode := uint32(0o755)
			if i == len(parts)-1 {
				mode = 0o700
			}
			if err = syscall.Mkdirat(fd, part, mode); err == nil || err == syscall.EEXIST {
				next, err = syscall.Openat(fd, part, dirFlags, 0)
			}
		}
		_ = syscall.Close(fd)
		if err != nil {
			p := "/" + filepath.Join(parts[:i+1]...)
			if err == syscall.ELOOP || err == syscall.ENOTDIR {
				return nil, d.notAFolder(p)
			}
			return nil, &os.PathError{Op: "open", Path: p, Err: err}
		}
		fd = next
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		_ = syscall.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: d.path, Err: err}
	}
	if err := d.checkPrivate(st.Uid, st.Mode); err != nil {
		_ = syscall.Close(fd)
		return nil, err
	}
	return &spillHandle{fd: fd, path: d.path}, nil
}

func (h *spillHandle) create(name string) (*os.File, error) {
	fd, err := syscall.Openat(h.fd, name, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "create", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(h.path, name)), nil
}

func (h *spillHandle) remove(name string) { _ = syscall.Unlinkat(h.fd, name) }

func (h *spillHandle) close() { _ = syscall.Close(h.fd) }
