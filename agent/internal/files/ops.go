package files

import (
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/orchard-env/orchard/agent/internal/api"
)

func handleStat(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	st, err := lstat(p)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, st)
}

// Listing is the answer of GET /files/list (FileList in models.py).
type Listing struct {
	Path    string `json:"path"`
	Entries []Stat `json:"entries"`
}

func handleList(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	fi, err := os.Stat(p)
	if err != nil {
		api.WriteError(w, fsError(err))
		return
	}
	if !fi.IsDir() {
		api.WriteError(w, api.BadRequest("%s is not a directory", p))
		return
	}
	des, err := os.ReadDir(p) // sorted by name
	if err != nil {
		api.WriteError(w, fsError(err))
		return
	}
	out := Listing{Path: p, Entries: make([]Stat, 0, len(des))}
	for _, de := range des {
		info, err := de.Info()
		if err != nil {
			continue // removed while listing
		}
		out.Entries = append(out.Entries, statOf(filepath.Join(p, de.Name()), info))
	}
	api.WriteJSON(w, http.StatusOK, out)
}

// MkdirRequest, RemoveRequest and MoveRequest are the bodies of the file operations
// (the same names in models.py).
type MkdirRequest struct {
	Path    string  `json:"path"`
	Mode    *uint32 `json:"mode"`
	Parents *bool   `json:"parents"`
}

func handleMkdir(w http.ResponseWriter, r *http.Request) {
	var req MkdirRequest
	if err := api.ReadJSON(r, &req); err != nil {
		api.WriteError(w, err)
		return
	}
	p, err := cleanPath(req.Path)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	mode := uint32(0o755)
	if req.Mode != nil {
		mode = *req.Mode
	}
	if err := checkMode(mode); err != nil {
		api.WriteError(w, err)
		return
	}
	parents := req.Parents == nil || *req.Parents
	status, err := mkdir(p, mode, parents)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	st, err := lstat(p)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, status, st)
}

// mkdir creates p (201) or, with parents, accepts an existing folder (200) like mkdir -p.
func mkdir(p string, mode uint32, parents bool) (int, error) {
	if fi, err := os.Stat(p); err == nil {
		if !fi.IsDir() {
			return 0, api.Conflict("%s exists and is not a directory", p)
		}
		if !parents {
			return 0, api.Conflict("%s exists (parents=false)", p)
		}
		return http.StatusOK, nil
	}
	if parents {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return 0, createError(err)
		}
	}
	if err := os.Mkdir(p, goMode(mode)); err != nil {
		if fi, serr := os.Stat(p); parents && serr == nil && fi.IsDir() {
			return http.StatusOK, nil // created concurrently
		}
		if os.IsNotExist(err) {
			return 0, api.NotFound("parent of %s does not exist (parents=false)", p)
		}
		return 0, createError(err)
	}
	// Mkdir's mode is filtered by the umask; the caller asked for this exact mode.
	if err := os.Chmod(p, goMode(mode)); err != nil {
		return 0, createError(err)
	}
	return http.StatusCreated, nil
}

type RemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

func handleRemove(w http.ResponseWriter, r *http.Request) {
	var req RemoveRequest
	if err := api.ReadJSON(r, &req); err != nil {
		api.WriteError(w, err)
		return
	}
	p, err := cleanPath(req.Path)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	if p == "/" {
		api.WriteError(w, api.BadRequest("refusing to remove /"))
		return
	}
	fi, err := os.Lstat(p)
	if err != nil {
		api.WriteError(w, fsError(err))
		return
	}
	if fi.IsDir() && req.Recursive {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if err != nil {
		if fi.IsDir() && (errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)) {
			err = api.Conflict("%s is a non-empty directory (pass recursive=true)", p)
		}
		api.WriteError(w, fsError(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type MoveRequest struct {
	Src       string `json:"src"`
	Dst       string `json:"dst"`
	Overwrite bool   `json:"overwrite"`
}

func handleMove(w http.ResponseWriter, r *http.Request) {
	var req MoveRequest
	if err := api.ReadJSON(r, &req); err != nil {
		api.WriteError(w, err)
		return
	}
	src, err := cleanPath(req.Src)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	dst, err := cleanPath(req.Dst)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	if err := move(src, dst, req.Overwrite); err != nil {
		api.WriteError(w, err)
		return
	}
	st, err := lstat(dst)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, st)
}

func move(src, dst string, overwrite bool) error {
	sfi, err := os.Lstat(src)
	if err != nil {
		return fsError(err)
	}
	if src == dst {
		return nil
	}
	if src == "/" || strings.HasPrefix(dst, src+"/") {
		return api.BadRequest("cannot move %s into itself (%s)", src, dst)
	}
	if dfi, err := os.Lstat(dst); err == nil {
		if !overwrite {
			return api.Conflict("%s exists (overwrite=false)", dst)
		}
		if dfi.IsDir() != sfi.IsDir() {
			return api.Conflict("cannot replace %s with %s: one is a directory, the other is not", dst, src)
		}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return createError(err)
	}
	err = os.Rename(src, dst)
	if errors.Is(err, syscall.EXDEV) {
		err = moveAcross(src, dst)
	}
	if err != nil {
		return createError(err)
	}
	return nil
}

// moveAcross moves src to dst on another file system: copy beside dst, rename over
// dst (so dst is never half-written), then remove src.
func moveAcross(src, dst string) error {
	tmp, err := os.MkdirTemp(filepath.Dir(dst), ".orchard-move-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	staged := filepath.Join(tmp, "x")
	if err := copyTree(src, staged); err != nil {
		return err
	}
	if err := os.Rename(staged, dst); err != nil {
		return err
	}
	return os.RemoveAll(src)
}

// copyTree copies src to dst without following symlinks, keeping modes, owners and mtimes.
func copyTree(src, dst string) error {
	var dirs []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			if err := os.Mkdir(out, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, rel)
			return nil
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, out); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := copyFile(p, out); err != nil {
				return err
			}
		default:
			return api.Conflict("cannot move special file %s across file systems", p)
		}
		return finish(out, fi)
	})
	if err != nil {
		return err
	}
	// Directories last and deepest first: a read-only mode must not block their contents.
	for i := len(dirs) - 1; i >= 0; i-- {
		fi, err := os.Lstat(filepath.Join(src, dirs[i]))
		if err != nil {
			return err
		}
		if err := finish(filepath.Join(dst, dirs[i]), fi); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// finish gives a copied entry the owner, mode and mtime of the original.
func finish(p string, fi fs.FileInfo) error {
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		_ = os.Lchown(p, int(sys.Uid), int(sys.Gid)) // best effort when not root
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil // symlinks have no mode of their own; Chtimes would follow them
	}
	if err := os.Chmod(p, fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return err
	}
	return os.Chtimes(p, fi.ModTime(), fi.ModTime())
}
