package files

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// TarResult is the answer of PUT /files/tar (TarResult in models.py).
type TarResult struct {
	Files int64 `json:"files"`
	Bytes int64 `json:"bytes"`
}

func handleTarUpload(w http.ResponseWriter, r *http.Request) {
	root, err := queryPath(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	limits, err := uploadLimits(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	in, err := decompress(bufio.NewReaderSize(r.Body, 64<<10))
	if err != nil {
		api.WriteError(w, err)
		return
	}
	res, err := extract(root, in, limits)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, res)
}

// decompress recognises gzip and bzip2 by their magic bytes; anything else is read as tar.
func decompress(br *bufio.Reader) (io.Reader, error) {
	// A plain tar starts with the first entry's name, so the checks use the longest
	// magic each format has, to not mistake a file named "BZh..." for bzip2.
	magic, _ := br.Peek(10)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b, 0x08}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, api.BadRequest("invalid gzip stream: %v", err)
		}
		return zr, nil
	case len(magic) == 10 && bytes.HasPrefix(magic, []byte("BZh")) && magic[3] >= '1' && magic[3] <= '9' &&
		bytes.Equal(magic[4:], []byte{0x31, 0x41, 0x59, 0x26, 0x53, 0x59}):
		return bzip2.NewReader(br), nil
	case bytes.HasPrefix(magic, []byte{0xfd, '7', 'z', 'X', 'Z', 0}), bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return nil, api.BadRequest("xz and zstd are not supported; send a plain, gzip or bzip2 tar")
	}
	return br, nil
}

// extractor writes tar entries below root and never outside it: names are relative
// with no "..", every folder on the way is opened relative to the one before it, a
// symlink on the way must lead inside root, and the last component is never followed.
// root itself is reached as every write's path is (walk.go: no symlink a less
// privileged user planted is followed).
type extractor struct {
	root    dirRef
	w       *walker
	limits  tarLimits
	entries int64         // every entry read, folders and skipped ones too
	dirs    []*tar.Header // modes and mtimes applied at the end
	res     TarResult
	// Folders already open (relative name -> folder), so 10,000 files in 100 folders
	// cost 100 walks, not 10,000. Emptied whenever an entry could change what a name
	// leads to (a link, a fifo, anything replaced); what is emptied is closed once the
	// entry is done (stale), as the entry may still hold it.
	known map[string]dirRef
	stale []dirRef
	buf   []byte // one copy buffer for every file
}

// maxKnown bounds the folders held open at once.
const maxKnown = 512

func extract(root string, in io.Reader, limits tarLimits) (TarResult, error) {
	top, err := openRoot()
	if err != nil {
		return TarResult{}, fsError(err)
	}
	dir, err := (&walker{create: true}).walk(top, strings.TrimPrefix(root, "/"))
	top.close()
	if err != nil {
		return TarResult{}, createError(err)
	}
	x := &extractor{root: dir, w: &walker{beneath: dir.path}, limits: limits, known: map[string]dirRef{}}
	defer x.close()
	tr := tar.NewReader(in)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return x.res, api.BadRequest("invalid tar stream after %d entries: %v", x.res.Files, err)
		}
		if x.entries++; x.entries > x.limits.entries {
			return x.res, tooLarge("the archive has more than %d entries (max_entries)", x.limits.entries)
		}
		err = x.entry(hdr, tr)
		x.dropStale()
		if err != nil {
			return x.res, err
		}
	}
	return x.res, x.finishDirs()
}

func (x *extractor) close() {
	x.forget()
	x.dropStale()
	x.root.close()
}

// entryName validates a tar name and returns it cleaned, slash-separated and relative.
func entryName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", api.BadRequest("tar entry %q contains a NUL byte", name)
	}
	if strings.HasPrefix(name, "/") {
		return "", api.BadRequest("tar entry %q is absolute", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", api.BadRequest("tar entry %q contains '..'", name)
		}
	}
	clean := path.Clean(name)
	if clean == "" {
		return ".", nil
	}
	return clean, nil
}

// finishDirs applies folder modes and mtimes, deepest first, after their contents are
// written (a read-only folder could not receive them otherwise). Paths are resolved
// again: a later entry may have replaced a folder with a symlink leading out.
func (x *extractor) finishDirs() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		h := x.dirs[i]
		parent, name := x.root, "."
		if h.Name != "." {
			var err error
			if parent, err = x.resolveDir(path.Dir(h.Name), false); err != nil {
				continue
			}
			name = path.Base(h.Name)
		}
		f, err := openDirAt(parent, name) // a symlink there now is not followed
		x.dropStale()
		if err != nil {
			continue
		}
		err = f.Chmod(goMode(uint32(h.Mode)))
		if err == nil && !h.ModTime.IsZero() {
			setTimes(int(f.Fd()), h.ModTime.UnixNano())
		}
		f.Close()
		if err != nil {
			return createError(err)
		}
	}
	return nil
}

func (x *extractor) entry(h *tar.Header, r io.Reader) error {
	switch h.Typeflag {
	case tar.TypeXGlobalHeader, tar.TypeChar, tar.TypeBlock:
		return nil // metadata, or devices the sandbox has no use for
	}
	name, err := entryName(h.Name)
	if err != nil {
		return err
	}
	h.Name = name
	if name == "." {
		h.Mode &= 0o7777
		if h.Typeflag == tar.TypeDir {
			x.dirs = append(x.dirs, h)
		}
		return nil
	}
	h.Mode &= 0o7777
	if h.Typeflag != tar.TypeDir && h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeRegA {
		x.forget()
	}
	parent, err := x.resolveDir(path.Dir(name), true)
	if err != nil {
		return err
	}
	base := path.Base(name)
	switch h.Typeflag {
	case tar.TypeDir:
		return x.dir(parent, base, h)
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse, tar.TypeCont:
		if err := x.file(parent, base, h, r); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if strings.IndexByte(h.Linkname, 0) >= 0 {
			return api.BadRequest("symlink %q has a NUL byte in its target", h.Name)
		}
		if err := clearAt(parent, base, false); err != nil {
			return err
		}
		// A symlink may point anywhere; writing through it is what resolveDir prevents.
		if err := symlinkat(h.Linkname, parent.fd, base); err != nil {
			return createError(&os.PathError{Op: "symlink", Path: parent.join(base), Err: err})
		}
	case tar.TypeLink:
		if err := x.hardlink(parent, base, h); err != nil {
			return err
		}
	case tar.TypeFifo:
		if err := x.fifo(parent, base, h); err != nil {
			return err
		}
	default:
		return nil // unknown entry types are skipped, as tar does
	}
	x.res.Files++
	return nil
}

// resolveDir returns the open folder for the relative folder rel, creating missing
// folders when create is set. A component that is a symlink must resolve inside root.
// The folder stays open until the next forget (it may be x.root itself).
func (x *extractor) resolveDir(rel string, create bool) (dirRef, error) {
	if rel == "." {
		return x.root, nil
	}
	start, rest := x.root, rel
	if create {
		if d, ok := x.known[rel]; ok {
			return d, nil
		}
		// Start from the deepest folder on the way already open.
		for i := strings.LastIndexByte(rel, '/'); i > 0; i = strings.LastIndexByte(rel[:i], '/') {
			if d, ok := x.known[rel[:i]]; ok {
				start, rest = d, rel[i+1:]
				break
			}
		}
	}
	x.w.create, x.w.links = create, 0
	d, err := x.w.walk(start, rest)
	if err != nil {
		if create {
			return dirRef{}, createError(err)
		}
		return dirRef{}, fsError(err)
	}
	if !create {
		x.stale = append(x.stale, d)
		return d, nil
	}
	if len(x.known) >= maxKnown {
		x.forget()
	}
	x.known[rel] = d
	return d, nil
}

func (x *extractor) forget() {
	for _, d := range x.known {
		x.stale = append(x.stale, d)
	}
	if len(x.known) > 0 {
		x.known = map[string]dirRef{}
	}
}

func (x *extractor) dropStale() {
	for _, d := range x.stale {
		d.close()
	}
	x.stale = x.stale[:0]
}

// clearAt removes whatever is at name in dir so a new entry can take its place, never
// following a symlink there. A folder is kept when keepDir is set (a folder entry over
// a folder) and otherwise removed only if empty.
func clearAt(dir dirRef, name string, keepDir bool) error {
	e, err := lstatAt(dir, name)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if err != nil {
		return createError(err)
	}
	if e.isDir() && keepDir {
		return nil
	}
	flags := 0
	if e.isDir() {
		flags = atRemoveDir
	}
	if err := unlinkat(dir.fd, name, flags); err != nil {
		if e.isDir() {
			return api.Conflict("tar entry would replace non-empty directory %s", dir.join(name))
		}
		return createError(&os.PathError{Op: "remove", Path: dir.join(name), Err: err})
	}
	return nil
}

func (x *extractor) dir(parent dirRef, name string, h *tar.Header) error {
	if e, err := lstatAt(parent, name); err == nil && !e.isDir() {
		x.forget()
	}
	if err := clearAt(parent, name, true); err != nil {
		return err
	}
	if err := mkdirat(parent.fd, name, 0o755); err != nil && err != syscall.EEXIST {
		return createError(&os.PathError{Op: "mkdir", Path: parent.join(name), Err: err})
	}
	x.dirs = append(x.dirs, h)
	return nil
}

func (x *extractor) file(parent dirRef, name string, h *tar.Header, r io.Reader) error {
	// Checked before the file exists, so no partial file is left behind; the copy is
	// bounded too, should the reader ever yield more than the header said.
	room := x.limits.bytes - x.res.Bytes
	if h.Size > room {
		return tooLarge("entry %q (%d bytes) would take the archive's content past %d bytes (max_bytes)",
			h.Name, h.Size, x.limits.bytes)
	}
	// Most names are new, so create first and clear the way only when something is there.
	f, err := createExclAt(parent, name, 0o600)
	if os.IsExist(err) {
		x.forget() // what is removed may be a folder that later names lead through
		if err := clearAt(parent, name, false); err != nil {
			return err
		}
		f, err = createExclAt(parent, name, 0o600)
	}
	if err != nil {
		return createError(err)
	}
	if x.buf == nil {
		x.buf = make([]byte, 256<<10)
	}
	n, err := io.CopyBuffer(f, io.LimitReader(r, room+1), x.buf)
	x.res.Bytes += n
	if err == nil && n > room {
		f.close()
		_ = unlinkat(parent.fd, name, 0)
		return tooLarge("the archive's content exceeds %d bytes (max_bytes)", x.limits.bytes)
	}
	if err != nil {
		f.close()
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrHeader) {
			return api.BadRequest("tar entry %q is truncated: %v", h.Name, err)
		}
		return createError(err)
	}
	if err := f.finish(uint32(h.Mode), h.ModTime); err != nil {
		return createError(err)
	}
	return nil
}

func (x *extractor) fifo(parent dirRef, name string, h *tar.Header) error {
	if err := clearAt(parent, name, false); err != nil {
		return err
	}
	p := parent.join(name)
	if err := mkfifoat(parent.fd, name, uint32(h.Mode)&0o777); err != nil {
		return createError(&os.PathError{Op: "mkfifo", Path: p, Err: err})
	}
	// The exact mode (mkfifo's is filtered by the umask), set on the FIFO just made:
	// opened without blocking and without following a link swapped in meanwhile.
	fd, err := openat(parent.fd, name, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return createError(&os.PathError{Op: "open", Path: p, Err: err})
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if e, err := fstatFd(fd); err != nil || e.typ() != syscall.S_IFIFO {
		return api.Conflict("%s changed while it was written", p)
	}
	if err := f.Chmod(goMode(uint32(h.Mode))); err != nil {
		return createError(err)
	}
	return nil
}

func (x *extractor) hardlink(parent dirRef, name string, h *tar.Header) error {
	target, err := entryName(h.Linkname)
	if err != nil || target == "." {
		return api.BadRequest("hard link %q points outside the target folder (%q)", h.Name, h.Linkname)
	}
	dir, err := x.resolveDir(path.Dir(target), false)
	if err != nil {
		var ae *api.Error
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return api.BadRequest("hard link %q points to missing %q", h.Name, h.Linkname)
		}
		return err
	}
	base := path.Base(target)
	e, err := lstatAt(dir, base)
	if err != nil {
		return api.BadRequest("hard link %q points to missing %q", h.Name, h.Linkname)
	}
	if e.isDir() {
		return api.BadRequest("hard link %q points to a directory", h.Name)
	}
	if dir.join(base) == parent.join(name) {
		return nil
	}
	if err := clearAt(parent, name, false); err != nil {
		return err
	}
	// linkat without AT_SYMLINK_FOLLOW links a symlink itself, so only things inside root.
	if err := linkat(dir.fd, base, parent.fd, name); err != nil {
		return createError(&os.PathError{Op: "link", Path: parent.join(name), Err: err})
	}
	return nil
}
