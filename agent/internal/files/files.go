// Package files serves the agent's file API (see docs/agent-api.md, "Files").
package files

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// Register adds the /files routes to mux.
func Register(mux *http.ServeMux) {
	mux.HandleFunc("/files", func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			handleRead(w, r)
		case http.MethodPut:
			handleWrite(w, r)
		default:
			api.RequireMethod(w, r, http.MethodGet, http.MethodHead, http.MethodPut)
		}
	})
	mux.HandleFunc("/files/stat", only(handleStat, http.MethodGet))
	mux.HandleFunc("/files/list", only(handleList, http.MethodGet))
	mux.HandleFunc("/files/mkdir", only(handleMkdir, http.MethodPost))
	mux.HandleFunc("/files/remove", only(handleRemove, http.MethodPost))
	mux.HandleFunc("/files/move", only(handleMove, http.MethodPost))
	mux.HandleFunc("/files/tar", func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			handleTarDownload(w, r)
		case http.MethodPut:
			handleTarUpload(w, r)
		default:
			api.RequireMethod(w, r, http.MethodGet, http.MethodPut)
		}
	})
	// Unknown /files/... routes answer in the JSON error shape, not the mux's plain text.
	mux.HandleFunc("/files/", func(w http.ResponseWriter, r *http.Request) {
		api.WriteError(w, api.NotFound("no route %s", r.URL.Path))
	})
}

func only(h http.HandlerFunc, method string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if api.RequireMethod(w, r, method) {
			h(w, r)
		}
	}
}

// cleanPath validates a client path: absolute, non-empty, no NUL byte.
func cleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", api.BadRequest("path is required")
	case strings.IndexByte(p, 0) >= 0:
		return "", api.BadRequest("path contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return "", api.BadRequest("path %q is not absolute", p)
	}
	return filepath.Clean(p), nil
}

func queryPath(r *http.Request) (string, error) {
	return cleanPath(r.URL.Query().Get("path"))
}

func queryBool(r *http.Request, name string, def bool) (bool, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, api.BadRequest("%s=%q is not a boolean", name, s)
	}
	return b, nil
}

func queryInt(r *http.Request, name string, def int64) (int64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, api.BadRequest("%s=%q is not a non-negative integer", name, s)
	}
	return n, nil
}

// Forbidden is the 403 for permission errors (EACCES, EPERM, EROFS).
func Forbidden(format string, args ...any) *api.Error {
	return api.Errf(http.StatusForbidden, "forbidden", format, args...)
}

// fsError maps an OS error from looking something up onto the API's statuses.
// A path through a non-directory (ENOTDIR) does not exist, so it is a 404 here.
func fsError(err error) error {
	return mapErrno(err, http.StatusNotFound)
}

// createError is fsError for creating something: a parent that is a file is a conflict.
func createError(err error) error {
	return mapErrno(err, http.StatusConflict)
}

func mapErrno(err error, notDirStatus int) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err
	}
	msg := err.Error()
	switch errno {
	case syscall.ENOENT:
		return api.NotFound("%s", msg)
	case syscall.ENOTDIR:
		if notDirStatus == http.StatusNotFound {
			return api.NotFound("%s", msg)
		}
		return api.Conflict("%s", msg)
	case syscall.EEXIST, syscall.ENOTEMPTY, syscall.EISDIR, syscall.EBUSY, syscall.ETXTBSY, syscall.EMLINK:
		return api.Conflict("%s", msg)
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return Forbidden("%s", msg)
	case syscall.ENAMETOOLONG, syscall.ELOOP, syscall.EINVAL:
		return api.BadRequest("%s", msg)
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
		// The existing code for "did not fit", rather than a new one every client must learn.
		return api.Errf(http.StatusRequestEntityTooLarge, "too_large", "%s", msg)
	}
	return err
}

// Stat is the JSON shape of one file system entry.
type Stat struct {
	Path       string  `json:"path"`
	Name       string  `json:"name"`
	Type       string  `json:"type"`
	Size       int64   `json:"size"`
	Mode       uint32  `json:"mode"`
	Mtime      float64 `json:"mtime"`
	LinkTarget *string `json:"link_target"`
}

// statOf describes p from its Lstat info (a symlink is reported as itself).
func statOf(p string, fi fs.FileInfo) Stat {
	s := Stat{
		Path:  p,
		Name:  filepath.Base(p),
		Size:  fi.Size(),
		Mode:  unixMode(fi.Mode()),
		Mtime: float64(fi.ModTime().UnixNano()) / 1e9,
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		s.Type = "file"
	case m.IsDir():
		s.Type = "dir"
	case m&fs.ModeSymlink != 0:
		s.Type = "symlink"
		if target, err := os.Readlink(p); err == nil {
			s.LinkTarget = &target
		}
	default:
		s.Type = "other"
	}
	return s
}

func lstat(p string) (Stat, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return Stat{}, fsError(err)
	}
	return statOf(p, fi), nil
}

// unixMode turns Go's FileMode into the permission and special bits of st_mode (0o7777).
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		u |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		u |= syscall.S_ISVTX
	}
	return u
}

// goMode is the inverse of unixMode.
func goMode(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	if u&syscall.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if u&syscall.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if u&syscall.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func checkMode(u uint32) error {
	if u > 0o7777 {
		return api.BadRequest("mode %#o is out of range (at most 07777)", u)
	}
	return nil
}
