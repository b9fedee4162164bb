package files

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// Writes (PUT /files, mkdir, remove, move, PUT /files/tar) reach their target from / one
// component at a time, each opened relative to the folder before it with O_NOFOLLOW, so
// nothing can be swapped in between a check and its use. The agent runs as root while
// code in the sandbox may run as someone else (issue 31, hole 7: as nobody,
// `ln -s /etc/passwd /tmp/report.txt` made PUT /tmp/report.txt overwrite /etc/passwd).
// The rule, for every component the last one included:
//
//	a write follows a symlink only if root (or the agent's own user) owns it, or if what
//	it leads to belongs to the link's owner too.
//
// So the links an image ships (/bin → usr/bin, /var/run → /run) work, and so does a
// user's link into that user's own files, but a link cannot take a write anywhere its
// owner could not write already. A link that breaks the rule is refused with 403
// forbidden; a dangling link at the last component is replaced, as before. Tar uploads
// keep their own rule below the target folder: a link there must lead inside it.

// entry is what fstat says about one file.
type entry struct {
	mode     uint32 // st_mode: type and permission bits
	uid, gid uint32
	size     int64
	mtimeNs  int64
}

func (e entry) typ() uint32     { return e.mode & syscall.S_IFMT }
func (e entry) isDir() bool     { return e.typ() == syscall.S_IFDIR }
func (e entry) isLink() bool    { return e.typ() == syscall.S_IFLNK }
func (e entry) isRegular() bool { return e.typ() == syscall.S_IFREG }

// dirRef is an open folder (an O_PATH descriptor) and the real path it was reached by.
type dirRef struct {
	fd   int
	path string
}

func (d dirRef) close() { closeFd(d.fd) }

func (d dirRef) join(name string) string {
	switch {
	case name == ".":
		return d.path
	case d.path == "/":
		return "/" + name
	}
	return d.path + "/" + name
}

const (
	dirFlags = oPath | syscall.O_DIRECTORY | syscall.O_NOFOLLOW
	maxLinks = 40 // as the kernel's limit
)

// walker resolves paths for writes.
type walker struct {
	create  bool   // make missing folders (0755) on the way, as mkdir -p
	beneath string // tar uploads: where a link must lead, instead of the owner rule
	links   int    // links followed so far
	depth   int    // links being followed now (inside a link's target)
}

// trusted owners: root, and the agent's own user when it is not root.
func trusted(uid uint32) bool { return uid == 0 || int(uid) == os.Geteuid() }

func openRoot() (dirRef, error) {
	fd, err := openRootFd()
	if err != nil {
		return dirRef{}, &os.PathError{Op: "open", Path: "/", Err: err}
	}
	return dirRef{fd: fd, path: "/"}, nil
}

func reopen(d dirRef) (dirRef, error) {
	fd, err := openat(d.fd, ".", dirFlags&^syscall.O_NOFOLLOW, 0)
	if err != nil {
		return dirRef{}, &os.PathError{Op: "open", Path: d.path, Err: err}
	}
	return dirRef{fd: fd, path: d.path}, nil
}

// walk descends from start through the slash-separated names of rel and returns the
// folder reached, which the caller closes (start stays open). rel comes from a client
// path (clean) or a link's target (which may hold "." and "..", taken physically, as
// the kernel does).
func (w *walker) walk(start dirRef, rel string) (dirRef, error) {
	cur, owned := start, false
	for _, name := range strings.Split(rel, "/") {
		if name == "" || name == "." {
			continue
		}
		next, err := w.step(cur, name)
		if owned {
			cur.close()
		}
		if err != nil {
			return dirRef{}, err
		}
		cur, owned = next, true
	}
	if !owned {
		return reopen(cur)
	}
	return cur, nil
}

func (w *walker) step(cur dirRef, name string) (dirRef, error) {
	if name == ".." {
		fd, err := openat(cur.fd, "..", dirFlags&^syscall.O_NOFOLLOW, 0)
		if err != nil {
			return dirRef{}, &os.PathError{Op: "open", Path: cur.join(".."), Err: err}
		}
		return dirRef{fd: fd, path: filepath.Dir(cur.path)}, nil
	}
	p := cur.join(name)
	fd, err := openat(cur.fd, name, oPath|syscall.O_NOFOLLOW, 0)
	if err == syscall.ENOENT && w.create {
		if err = mkdirat(cur.fd, name, 0o755); err == nil || err == syscall.EEXIST {
			fd, err = openat(cur.fd, name, oPath|syscall.O_NOFOLLOW, 0)
		}
	}
	if err != nil {
		return dirRef{}, &os.PathError{Op: "open", Path: p, Err: err}
	}
	e, err := fstatFd(fd)
	switch {
	case err != nil:
		closeFd(fd)
		return dirRef{}, &os.PathError{Op: "stat", Path: p, Err: err}
	case e.isDir():
		return dirRef{fd: fd, path: p}, nil
	case e.isLink():
		defer closeFd(fd)
		return w.followDir(cur, p, fd, e)
	}
	closeFd(fd)
	return dirRef{}, &os.PathError{Op: "open", Path: p, Err: syscall.ENOTDIR}
}

// followDir follows the link (open as linkFd, found in cur) that a path passes through.
func (w *walker) followDir(cur dirRef, p string, linkFd int, link entry) (dirRef, error) {
	if w.links++; w.links > maxLinks {
		return dirRef{}, &os.PathError{Op: "open", Path: p, Err: syscall.ELOOP}
	}
	target, err := readlinkat(linkFd, "")
	if err != nil {
		return dirRef{}, &os.PathError{Op: "readlink", Path: p, Err: err}
	}
	create := w.create
	w.create, w.depth = false, w.depth+1 // nothing is made at a place a link names
	defer func() { w.create, w.depth = create, w.depth-1 }()
	start := cur
	if strings.HasPrefix(target, "/") {
		if start, err = openRoot(); err != nil {
			return dirRef{}, err
		}
		defer start.close()
	}
	d, err := w.walk(start, target)
	if err != nil {
		return dirRef{}, err
	}
	if w.depth == 1 && w.beneath != "" {
		if !within(d.path, w.beneath) {
			d.close()
			return dirRef{}, api.BadRequest("symlink %s leads outside the target folder %s (to %s); no entry may pass through it",
				p, w.beneath, d.path)
		}
		return d, nil
	}
	if w.beneath == "" {
		dst, err := fstatFd(d.fd)
		if err == nil {
			err = allowed(p, link, d.path, dst)
		}
		if err != nil {
			d.close()
			return dirRef{}, err
		}
	}
	return d, nil
}

func within(p, root string) bool {
	return root == "/" || p == root || strings.HasPrefix(p, root+"/")
}

// allowed is the rule: a link root owns, or one that leads to its owner's own file.
func allowed(linkPath string, link entry, dstPath string, dst entry) error {
	if trusted(link.uid) || dst.uid == link.uid {
		return nil
	}
	return Forbidden("%s is a symlink owned by uid %d and leads to %s, owned by uid %d: writes follow a symlink "+
		"only if it is owned by root or leads to something its owner owns (write to the target's path instead, "+
		"or remove the link)", linkPath, link.uid, dstPath, dst.uid)
}

// parentOf opens the folder holding p's last component (p clean and absolute) and
// returns it with that component's name; for "/" the folder is / and the name ".".
func parentOf(p string, create bool) (dirRef, string, error) {
	root, err := openRoot()
	if err != nil || p == "/" {
		return root, ".", err
	}
	defer root.close()
	w := &walker{create: create}
	d, err := w.walk(root, strings.TrimPrefix(filepath.Dir(p), "/"))
	return d, filepath.Base(p), err
}

// target is where a write lands: a folder (owned by the holder), a name in it, and
// what is there now (nil when nothing). followed says a link at the name was followed.
type target struct {
	dir      dirRef
	name     string
	e        *entry
	followed bool
}

func (t target) path() string { return t.dir.join(t.name) }

var errDangling = errors.New("dangling symlink")

// last looks at name in dir as a write does: a symlink there is followed, by the rule,
// to the existing file it leads to; one that leads nowhere is itself the target (a
// write replaces it).
func (w *walker) last(dir dirRef, name string) (target, error) {
	here, err := reopen(dir)
	if err != nil {
		return target{}, err
	}
	e, err := lstatAt(here, name)
	if errors.Is(err, syscall.ENOENT) {
		return target{dir: here, name: name}, nil
	}
	if err != nil {
		here.close()
		return target{}, err
	}
	if !e.isLink() {
		return target{dir: here, name: name, e: &e}, nil
	}
	t, err := w.followLast(here, name, e)
	if errors.Is(err, errDangling) {
		return target{dir: here, name: name, e: &e}, nil
	}
	here.close()
	if err != nil {
		return target{}, err
	}
	t.followed = true
	return t, nil
}

func (w *walker) followLast(dir dirRef, name string, link entry) (target, error) {
	p := dir.join(name)
	if w.links++; w.links > maxLinks {
		return target{}, &os.PathError{Op: "open", Path: p, Err: syscall.ELOOP}
	}
	txt, err := readlinkat(dir.fd, name)
	if err != nil {
		return target{}, &os.PathError{Op: "readlink", Path: p, Err: err}
	}
	start := dir
	if strings.HasPrefix(txt, "/") {
		if start, err = openRoot(); err != nil {
			return target{}, err
		}
		defer start.close()
	}
	// The link's folder part is walked as a path is; its last name is looked at again.
	parts := strings.Split(strings.TrimRight(txt, "/"), "/")
	base := parts[len(parts)-1]
	folder := strings.Join(parts[:len(parts)-1], "/")
	if base == "" || base == "." || base == ".." {
		folder, base = txt, "."
	}
	d, err := w.walk(start, folder)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return target{}, errDangling
	}
	if err != nil {
		return target{}, err
	}
	defer d.close()
	e, err := lstatAt(d, base)
	if errors.Is(err, syscall.ENOENT) {
		return target{}, errDangling
	}
	if err != nil {
		return target{}, err
	}
	var t target
	if e.isLink() {
		if t, err = w.followLast(d, base, e); err != nil {
			return target{}, err
		}
	} else {
		here, err := reopen(d)
		if err != nil {
			return target{}, err
		}
		t = target{dir: here, name: base, e: &e}
	}
	if err := allowed(p, link, t.path(), *t.e); err != nil {
		t.dir.close()
		return target{}, err
	}
	return t, nil
}

// lstatAt describes name in dir without following it ("." is dir itself).
func lstatAt(dir dirRef, name string) (entry, error) {
	if name == "." {
		e, err := fstatFd(dir.fd)
		if err != nil {
			return e, &os.PathError{Op: "stat", Path: dir.path, Err: err}
		}
		return e, nil
	}
	fd, err := openat(dir.fd, name, oPath|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return entry{}, &os.PathError{Op: "lstat", Path: dir.join(name), Err: err}
	}
	defer closeFd(fd)
	e, err := fstatFd(fd)
	if err != nil {
		return e, &os.PathError{Op: "lstat", Path: dir.join(name), Err: err}
	}
	return e, nil
}

// statAt is the API's Stat of name in dir, reported under the path shown.
func statAt(dir dirRef, name, shown string) (Stat, error) {
	e, err := lstatAt(dir, name)
	if err != nil {
		return Stat{}, fsError(err)
	}
	s := Stat{Path: shown, Name: filepath.Base(shown), Size: e.size, Mode: e.mode & 0o7777,
		Mtime: float64(e.mtimeNs) / 1e9}
	switch {
	case e.isRegular():
		s.Type = "file"
	case e.isDir():
		s.Type = "dir"
	case e.isLink():
		s.Type = "symlink"
		if t, err := readlinkat(dir.fd, name); err == nil {
			s.LinkTarget = &t
		}
	default:
		s.Type = "other"
	}
	return s, nil
}
