package files

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

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
// with no "..", every folder on the way is checked not to be a symlink leading out,
// and the last component is never followed.
type extractor struct {
	root     string
	rootReal string
	limits   tarLimits
	entries  int64         // every entry read, folders and skipped ones too
	dirs     []*tar.Header // modes and mtimes applied at the end
	res      TarResult
	// Folders already resolved (relative name -> real path), so 10,000 files in 100
	// folders cost 100 walks, not 10,000. Emptied whenever an entry could change what
	// a name leads to (a link, a fifo, anything replaced).
	known map[string]string
	buf   []byte // one copy buffer for every file
}

func extract(root string, in io.Reader, limits tarLimits) (TarResult, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return TarResult{}, createError(err)
	}
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return TarResult{}, fsError(err)
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return TarResult{}, api.Conflict("%s is not a directory", root)
	}
	x := &extractor{root: root, rootReal: real, limits: limits, known: map[string]string{}}
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
		if err := x.entry(hdr, tr); err != nil {
			return x.res, err
		}
	}
	return x.res, x.finishDirs()
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
		p := x.root
		if h.Name != "." {
			parent, err := x.resolveDir(path.Dir(h.Name), false)
			if err != nil {
				continue
			}
			p = filepath.Join(parent, path.Base(h.Name))
		}
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			continue
		}
		if err := os.Chmod(p, goMode(uint32(h.Mode))); err != nil {
			return createError(err)
		}
		setMtime(p, h.ModTime)
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
	dst := filepath.Join(parent, path.Base(name))
	switch h.Typeflag {
	case tar.TypeDir:
		return x.dir(dst, h)
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse, tar.TypeCont:
		if err := x.file(dst, h, r); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if strings.IndexByte(h.Linkname, 0) >= 0 {
			return api.BadRequest("symlink %q has a NUL byte in its target", h.Name)
		}
		if err := clearPath(dst, false); err != nil {
			return err
		}
		// A symlink may point anywhere; writing through it is what resolveDir prevents.
		if err := os.Symlink(h.Linkname, dst); err != nil {
			return createError(err)
		}
	case tar.TypeLink:
		if err := x.hardlink(dst, h); err != nil {
			return err
		}
	case tar.TypeFifo:
		if err := clearPath(dst, false); err != nil {
			return err
		}
		if err := syscall.Mkfifo(dst, uint32(h.Mode)&0o777); err != nil {
			return createError(err)
		}
		if err := os.Chmod(dst, goMode(uint32(h.Mode))); err != nil {
			return createError(err)
		}
	default:
		return nil // unknown entry types are skipped, as tar does
	}
	x.res.Files++
	return nil
}

// resolveDir returns the on-disk folder for the relative folder rel, creating missing
// folders when create is set. A component that is a symlink must resolve inside root.
func (x *extractor) resolveDir(rel string, create bool) (string, error) {
	cur := x.root
	if rel == "." {
		return cur, nil
	}
	if p, ok := x.known[rel]; ok && create {
		return p, nil
	}
	parts := strings.Split(rel, "/")
	for i, part := range parts {
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(next)
		switch {
		case os.IsNotExist(err) && create:
			if err := os.Mkdir(next, 0o755); err != nil {
				return "", createError(err)
			}
		case err != nil:
			return "", fsError(err)
		case fi.Mode()&fs.ModeSymlink != 0:
			real, err := filepath.EvalSymlinks(next)
			if err != nil || !x.inside(real) {
				return "", api.BadRequest("symlink %q leads outside the target folder; no entry may pass through it",
					strings.Join(parts[:i+1], "/"))
			}
			if rfi, err := os.Stat(real); err != nil || !rfi.IsDir() {
				return "", api.BadRequest("%q is a symlink to a non-directory", rel)
			}
			next = real
		case !fi.IsDir():
			return "", api.Conflict("%s is not a directory", next)
		}
		cur = next
	}
	if create {
		x.known[rel] = cur
	}
	return cur, nil
}

func (x *extractor) forget() {
	if len(x.known) > 0 {
		x.known = map[string]string{}
	}
}

func (x *extractor) inside(real string) bool {
	return real == x.rootReal || strings.HasPrefix(real, x.rootReal+"/") || x.rootReal == "/"
}

// clearPath removes whatever is at dst so a new entry can take its place, never
// following a symlink there. A folder is kept when keepDir is set (a folder entry
// over a folder) and otherwise removed only if empty.
func clearPath(dst string, keepDir bool) error {
	fi, err := os.Lstat(dst)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return createError(err)
	}
	if fi.IsDir() && keepDir {
		return nil
	}
	if err := os.Remove(dst); err != nil {
		if fi.IsDir() {
			return api.Conflict("tar entry would replace non-empty directory %s", dst)
		}
		return createError(err)
	}
	return nil
}

func (x *extractor) dir(dst string, h *tar.Header) error {
	if fi, err := os.Lstat(dst); err == nil && !fi.IsDir() {
		x.forget()
	}
	if err := clearPath(dst, true); err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o755); err != nil && !os.IsExist(err) {
		return createError(err)
	}
	x.dirs = append(x.dirs, h)
	return nil
}

func (x *extractor) file(dst string, h *tar.Header, r io.Reader) error {
	// Checked before the file exists, so no partial file is left behind; the copy is
	// bounded too, should the reader ever yield more than the header said.
	room := x.limits.bytes - x.res.Bytes
	if h.Size > room {
		return tooLarge("entry %q (%d bytes) would take the archive's content past %d bytes (max_bytes)",
			h.Name, h.Size, x.limits.bytes)
	}
	// Most names are new, so create first and clear the way only when something is there.
	f, err := createExcl(dst, 0o600)
	if os.IsExist(err) {
		x.forget() // what is removed may be a folder that later names lead through
		if err := clearPath(dst, false); err != nil {
			return err
		}
		f, err = createExcl(dst, 0o600)
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
		_ = os.Remove(dst)
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

func (x *extractor) hardlink(dst string, h *tar.Header) error {
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
	src := filepath.Join(dir, path.Base(target))
	fi, err := os.Lstat(src)
	if err != nil {
		return api.BadRequest("hard link %q points to missing %q", h.Name, h.Linkname)
	}
	if fi.IsDir() {
		return api.BadRequest("hard link %q points to a directory", h.Name)
	}
	if src == dst {
		return nil
	}
	if err := clearPath(dst, false); err != nil {
		return err
	}
	// link(2) does not follow a symlink at src, so this links only things inside root.
	if err := os.Link(src, dst); err != nil {
		return createError(err)
	}
	return nil
}

func setMtime(p string, t time.Time) {
	if !t.IsZero() {
		_ = os.Chtimes(p, t, t)
	}
}

func handleTarDownload(w http.ResponseWriter, r *http.Request) {
	root, err := queryPath(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	gz, err := queryBool(r, "gzip", false)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	// Walk the real folder: WalkDir does not descend into a root that is a symlink.
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		api.WriteError(w, fsError(err))
		return
	}
	fi, err := os.Stat(real)
	if err != nil {
		api.WriteError(w, fsError(err))
		return
	}
	if gz {
		w.Header().Set("Content-Type", "application/gzip")
	} else {
		w.Header().Set("Content-Type", "application/x-tar")
	}
	cw := &countingWriter{w: w}
	// Tar writes 512-byte headers and small files: batch them into large writes (and
	// large HTTP chunks), or every small file costs a chunk and a syscall on each hop.
	bw := bufio.NewWriterSize(cw, 256<<10)
	out := io.Writer(bw)
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(bw)
		out = zw
	}
	tw := tar.NewWriter(out)
	if fi.IsDir() {
		err = writeTree(tw, real)
	} else {
		err = addEntry(tw, real, filepath.Base(root), fi, nil)
	}
	if err == nil {
		err = tw.Close()
	}
	if err == nil && zw != nil {
		err = zw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil && cw.n == 0 {
		w.Header().Del("Content-Type")
		api.WriteError(w, fsError(err))
		return
	}
	if err != nil {
		// Bytes are already out: break the connection so the client sees a short
		// stream rather than a tar that looks complete.
		panic(http.ErrAbortHandler)
	}
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type inode struct{ dev, ino uint64 }

// writeTree adds root's contents in name order, without following symlinks;
// files linked more than once become hard-link entries after the first.
func writeTree(tw *tar.Writer, root string) error {
	seen := map[inode]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) && p != root {
				return nil // removed while walking
			}
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return addEntry(tw, p, filepath.ToSlash(rel), fi, seen)
	})
}

func addEntry(tw *tar.Writer, p, name string, fi fs.FileInfo, seen map[inode]string) error {
	var link string
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	}
	if fi.Mode()&fs.ModeSocket != 0 {
		return nil // tar has no socket type
	}
	h, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	h.Name = name
	if fi.IsDir() {
		h.Name += "/"
	}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok && seen != nil && fi.Mode().IsRegular() && sys.Nlink > 1 {
		key := inode{uint64(sys.Dev), sys.Ino}
		if first, ok := seen[key]; ok {
			h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
		} else {
			seen[key] = name
		}
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if h.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	// Exactly the size in the header: a file that shrank meanwhile fails the copy.
	_, err = io.CopyN(tw, f, h.Size)
	return err
}
