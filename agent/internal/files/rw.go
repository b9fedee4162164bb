package files

import (
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// handleRead streams a file's bytes, optionally a range [offset, offset+length).
func handleRead(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	offset, err := queryInt(r, "offset", 0)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	length, err := queryInt(r, "length", math.MaxInt64)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		api.WriteError(w, fsError(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		api.WriteError(w, fsError(err))
		return
	}
	if fi.IsDir() {
		api.WriteError(w, api.BadRequest("%s is a directory", p))
		return
	}
	if offset > 0 {
		if _, err := f.Seek(offset, io.SeekStart); err != nil {
			api.WriteError(w, api.BadRequest("cannot seek %s to %d: %v", p, offset, err))
			return
		}
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	// Files in /proc and the like report size 0 yet have content: only a regular file
	// with a size gets a Content-Length; everything else is streamed to EOF.
	if fi.Mode().IsRegular() && fi.Size() > 0 {
		h.Set("X-File-Size", strconv.FormatInt(fi.Size(), 10))
		n := fi.Size() - offset
		if n < 0 {
			n = 0
		}
		if length < n {
			n = length
		}
		h.Set("Content-Length", strconv.FormatInt(n, 10))
		length = n
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := copyBig(w, io.LimitReader(f, length)); err != nil {
		// The status is sent; breaking the connection tells the client the body is short.
		panic(http.ErrAbortHandler)
	}
}

// bodyReader remembers read errors so they are told apart from disk errors.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// parseMode reads an octal mode such as "0644", "644" or "0o644".
func parseMode(s string) (uint32, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	u, err := strconv.ParseUint(t, 8, 32)
	if err != nil {
		return 0, api.BadRequest("mode=%q is not an octal mode", s)
	}
	return uint32(u), checkMode(uint32(u))
}

// handleWrite streams the body into a temporary file next to the target, then renames
// it into place, so readers see the old file or the new one, never a partial one.
func handleWrite(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	overwrite, err := queryBool(r, "overwrite", true)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	var mode *uint32
	if s := r.URL.Query().Get("mode"); s != "" {
		m, err := parseMode(s)
		if err != nil {
			api.WriteError(w, err)
			return
		}
		mode = &m
	}
	st, err := writeFile(p, &bodyReader{r: r.Body}, mode, overwrite)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusCreated, st)
}

func writeFile(p string, body *bodyReader, mode *uint32, overwrite bool) (Stat, error) {
	parent, name, err := parentOf(p, true)
	if err != nil {
		return Stat{}, createError(err)
	}
	defer parent.close()
	// Like a shell redirect, writing to a symlink writes to the file it points at, if
	// the rule in walk.go lets the write follow it.
	t, err := (&walker{}).last(parent, name)
	if err != nil {
		return Stat{}, createError(err)
	}
	defer t.dir.close()
	existing := t.e
	switch {
	case existing != nil && !overwrite:
		return Stat{}, api.Conflict("%s exists (overwrite=false)", p)
	case existing != nil && existing.isDir():
		return Stat{}, api.Conflict("%s is a directory", p)
	}
	tmp, tmpName, err := createTemp(t.dir, ".orchard-upload-")
	if err != nil {
		return Stat{}, createError(err)
	}
	placed := false
	defer func() {
		if !placed {
			tmp.Close()
			_ = unlinkat(t.dir.fd, tmpName, 0)
		}
	}()
	if _, err := copyBig(tmp, body); err != nil {
		if body.err != nil {
			return Stat{}, api.BadRequest("reading request body: %v", body.err)
		}
		return Stat{}, createError(err)
	}
	perm := uint32(0o644)
	if mode != nil {
		perm = *mode
	} else if existing != nil && existing.isRegular() {
		perm = existing.mode & 0o7777
	}
	if existing != nil {
		// Keep the owner of a replaced file (the agent usually runs as root).
		_ = tmp.Chown(int(existing.uid), int(existing.gid))
	}
	// Chmod after Chown: chown clears setuid/setgid bits. Both act on the open file.
	if err := tmp.Chmod(goMode(perm)); err != nil {
		return Stat{}, createError(err)
	}
	err = tmp.Close()
	placed = true
	if err != nil {
		_ = unlinkat(t.dir.fd, tmpName, 0)
		return Stat{}, createError(err)
	}
	if err := place(t.dir, tmpName, t.name, p, overwrite); err != nil {
		return Stat{}, err
	}
	shown := p
	if t.followed {
		shown = t.path()
	}
	return statAt(t.dir, t.name, shown)
}

// place moves the finished temp file to name in dir. Without overwrite it uses
// link(2), which fails if the name appeared meanwhile, instead of rename(2), which would
// replace it. Neither follows a symlink at the name.
func place(dir dirRef, tmp, name, shown string, overwrite bool) error {
	if !overwrite {
		err := linkat(dir.fd, tmp, dir.fd, name)
		if err == nil {
			_ = unlinkat(dir.fd, tmp, 0)
			return nil
		}
		if err == syscall.EEXIST {
			_ = unlinkat(dir.fd, tmp, 0)
			return api.Conflict("%s exists (overwrite=false)", shown)
		}
		// Some file systems have no hard links: fall back to check-then-rename.
		if _, err := lstatAt(dir, name); err == nil {
			_ = unlinkat(dir.fd, tmp, 0)
			return api.Conflict("%s exists (overwrite=false)", shown)
		}
	}
	if err := renameat(dir.fd, tmp, dir.fd, name); err != nil {
		_ = unlinkat(dir.fd, tmp, 0)
		return createError(&os.PathError{Op: "rename", Path: shown, Err: err})
	}
	return nil
}

// bigBuffer is the copy size for file bodies: 1 MiB per read and write instead of
// io.Copy's 32 KiB, so 100 MB is ~100 system calls a side, not ~3,200.
const bigBuffer = 1 << 20

// writerOnly hides a destination's ReadFrom: http's and os.File's fall back to 32 KiB
// copies for a socket or a request body, which is what copyBig avoids.
type writerOnly struct{ io.Writer }

func copyBig(dst io.Writer, src io.Reader) (int64, error) {
	return io.CopyBuffer(writerOnly{dst}, src, make([]byte, bigBuffer))
}
