package files

import (
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
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
	target := p
	// Like a shell redirect, writing to a symlink writes to the file it points at.
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			target = real
		}
	}
	existing, err := os.Lstat(target)
	switch {
	case err == nil && !overwrite:
		return Stat{}, api.Conflict("%s exists (overwrite=false)", p)
	case err == nil && existing.IsDir():
		return Stat{}, api.Conflict("%s is a directory", p)
	case err != nil && !os.IsNotExist(err):
		return Stat{}, createError(err)
	case err != nil:
		existing = nil
	}
	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Stat{}, createError(err)
	}
	tmp, err := os.CreateTemp(dir, ".orchard-upload-*")
	if err != nil {
		return Stat{}, createError(err)
	}
	renamed := false
	defer func() {
		if !renamed {
			tmp.Close()
			os.Remove(tmp.Name())
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
	} else if existing != nil && existing.Mode().IsRegular() {
		perm = unixMode(existing.Mode())
	}
	if existing != nil {
		// Keep the owner of a replaced file (the agent usually runs as root).
		if sys, ok := existing.Sys().(*syscall.Stat_t); ok {
			_ = tmp.Chown(int(sys.Uid), int(sys.Gid))
		}
	}
	// Chmod after Chown: chown clears setuid/setgid bits.
	if err := tmp.Chmod(goMode(perm)); err != nil {
		return Stat{}, createError(err)
	}
	if err := tmp.Close(); err != nil {
		return Stat{}, createError(err)
	}
	if err := place(tmp.Name(), target, overwrite); err != nil {
		return Stat{}, err
	}
	renamed = true
	return lstat(target)
}

// place moves the finished temp file to target. Without overwrite it uses link(2),
// which fails if target appeared meanwhile, instead of rename(2), which would replace it.
func place(tmp, target string, overwrite bool) error {
	if !overwrite {
		err := os.Link(tmp, target)
		if err == nil {
			os.Remove(tmp)
			return nil
		}
		if os.IsExist(err) {
			os.Remove(tmp)
			return api.Conflict("%s exists (overwrite=false)", target)
		}
		// Some file systems have no hard links: fall back to check-then-rename.
		if _, err := os.Lstat(target); err == nil {
			os.Remove(tmp)
			return api.Conflict("%s exists (overwrite=false)", target)
		}
	}
	if err := os.Rename(tmp, target); err != nil {
		os.Remove(tmp)
		return createError(err)
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
