package files

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"syscall"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// File operations relative to open folders, so that no path is looked up twice (see
// walk.go): temporary names, recursive removal and copying a tree.

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// createTemp creates a new file (0600) with a random name in dir.
func createTemp(dir dirRef, prefix string) (*os.File, string, error) {
	for i := 0; ; i++ {
		name := randomName(prefix)
		fd, err := openat(dir.fd, name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err == syscall.EEXIST && i < 100 {
			continue
		}
		if err != nil {
			return nil, "", &os.PathError{Op: "open", Path: dir.join(name), Err: err}
		}
		return os.NewFile(uintptr(fd), dir.join(name)), name, nil
	}
}

// mkdirTemp creates a new folder (0700) with a random name in dir.
func mkdirTemp(dir dirRef, prefix string) (string, error) {
	for i := 0; ; i++ {
		name := randomName(prefix)
		err := mkdirat(dir.fd, name, 0o700)
		if err == syscall.EEXIST && i < 100 {
			continue
		}
		if err != nil {
			return "", &os.PathError{Op: "mkdir", Path: dir.join(name), Err: err}
		}
		return name, nil
	}
}

// openDirAt opens name in dir as a folder for reading (never through a symlink).
func openDirAt(dir dirRef, name string) (*os.File, error) {
	fd, err := openat(dir.fd, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir.join(name), Err: err}
	}
	return os.NewFile(uintptr(fd), dir.join(name)), nil
}

// removeAllAt removes name in dir and, if it is a folder, everything below it, never
// following a symlink (a link is removed itself). A missing name is no error.
func removeAllAt(dir dirRef, name string) error {
	err := unlinkat(dir.fd, name, 0)
	if err == nil || err == syscall.ENOENT {
		return nil
	}
	if err != syscall.EISDIR && err != syscall.EPERM {
		return &os.PathError{Op: "remove", Path: dir.join(name), Err: err}
	}
	f, oerr := openDirAt(dir, name)
	if oerr != nil {
		if os.IsNotExist(oerr) {
			return nil
		}
		return &os.PathError{Op: "remove", Path: dir.join(name), Err: err}
	}
	sub := dirRef{fd: int(f.Fd()), path: dir.join(name)}
	names, rerr := f.Readdirnames(-1)
	var first error
	if rerr != nil {
		first = rerr
	}
	for _, n := range names {
		if err := removeAllAt(sub, n); err != nil && first == nil {
			first = err
		}
	}
	f.Close()
	err = unlinkat(dir.fd, name, atRemoveDir)
	if err == nil || err == syscall.ENOENT {
		return nil
	}
	if first != nil {
		return first
	}
	return &os.PathError{Op: "remove", Path: dir.join(name), Err: err}
}

// copyTreeAt copies sname in sdir to dname in ddir without following symlinks, keeping
// modes, owners and mtimes. A folder gets its mode after its contents (a read-only
// folder could not receive them otherwise).
func copyTreeAt(sdir dirRef, sname string, ddir dirRef, dname string) error {
	e, err := lstatAt(sdir, sname)
	if err != nil {
		return err
	}
	switch {
	case e.isDir():
		if err := mkdirat(ddir.fd, dname, 0o700); err != nil {
			return &os.PathError{Op: "mkdir", Path: ddir.join(dname), Err: err}
		}
		in, err := openDirAt(sdir, sname)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := openDirAt(ddir, dname)
		if err != nil {
			return err
		}
		defer out.Close()
		names, err := in.Readdirnames(-1)
		if err != nil {
			return err
		}
		from := dirRef{fd: int(in.Fd()), path: sdir.join(sname)}
		to := dirRef{fd: int(out.Fd()), path: ddir.join(dname)}
		for _, n := range names {
			if err := copyTreeAt(from, n, to, n); err != nil {
				return err
			}
		}
		return finishFd(out, e)
	case e.isLink():
		link, err := readlinkat(sdir.fd, sname)
		if err != nil {
			return &os.PathError{Op: "readlink", Path: sdir.join(sname), Err: err}
		}
		if err := symlinkat(link, ddir.fd, dname); err != nil {
			return &os.PathError{Op: "symlink", Path: ddir.join(dname), Err: err}
		}
		_ = fchownat(ddir.fd, dname, int(e.uid), int(e.gid), atSymlinkNoFollow) // best effort when not root
		return nil
	case e.isRegular():
		ifd, err := openat(sdir.fd, sname, syscall.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: sdir.join(sname), Err: err}
		}
		in := os.NewFile(uintptr(ifd), sdir.join(sname))
		defer in.Close()
		ofd, err := openat(ddir.fd, dname, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return &os.PathError{Op: "open", Path: ddir.join(dname), Err: err}
		}
		out := os.NewFile(uintptr(ofd), ddir.join(dname))
		defer out.Close()
		if _, err := io.Copy(out, in); err != nil {
			return err
		}
		return finishFd(out, e)
	}
	return api.Conflict("cannot move special file %s across file systems", sdir.join(sname))
}

// finishFd gives a copied file or folder, open as f, the owner, mode and mtime of e.
func finishFd(f *os.File, e entry) error {
	_ = f.Chown(int(e.uid), int(e.gid)) // best effort when not root
	if err := f.Chmod(goMode(e.mode & 0o7777)); err != nil {
		return err
	}
	setTimes(int(f.Fd()), e.mtimeNs)
	return nil
}
