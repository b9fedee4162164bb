package files

import (
	"errors"
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
	status, st, err := mkdir(p, mode, parents)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, status, st)
}

// mkdir creates p (201) or, with parents, accepts an existing folder (200) like mkdir -p.
func mkdir(p string, mode uint32, parents bool) (int, Stat, error) {
	parent, name, err := parentOf(p, parents)
	if err != nil {
		if !parents && errors.Is(err, syscall.ENOENT) {
			return 0, Stat{}, api.NotFound("parent of %s does not exist (parents=false)", p)
		}
		return 0, Stat{}, createError(err)
	}
	defer parent.close()
	exists := func() (int, Stat, error) {
		t, err := (&walker{}).last(parent, name) // a link there is followed by the rule
		if err != nil {
			return 0, Stat{}, createError(err)
		}
		t.dir.close()
		switch {
		case t.e == nil:
			return 0, Stat{}, nil
		case !t.e.isDir():
			return 0, Stat{}, api.Conflict("%s exists and is not a directory", p)
		case !parents:
			return 0, Stat{}, api.Conflict("%s exists (parents=false)", p)
		}
		st, err := statAt(parent, name, p)
		return http.StatusOK, st, err
	}
	if status, st, err := exists(); status != 0 || err != nil {
		return status, st, err
	}
	if err := mkdirat(parent.fd, name, mode&0o777); err != nil {
		if err == syscall.EEXIST {
			if status, st, err := exists(); status != 0 || err != nil {
				return status, st, err // created concurrently
			}
		}
		if err == syscall.ENOENT {
			return 0, Stat{}, api.NotFound("parent of %s does not exist (parents=false)", p)
		}
		return 0, Stat{}, createError(&os.PathError{Op: "mkdir", Path: p, Err: err})
	}
	// mkdir's mode is filtered by the umask; the caller asked for this exact mode.
	f, err := openDirAt(parent, name)
	if err != nil {
		return 0, Stat{}, createError(err)
	}
	err = f.Chmod(goMode(mode))
	f.Close()
	if err != nil {
		return 0, Stat{}, createError(err)
	}
	st, err := statAt(parent, name, p)
	return http.StatusCreated, st, err
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
	if err := remove(p, req.Recursive); err != nil {
		api.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// remove deletes p's last component itself: a symlink there is removed, not followed.
func remove(p string, recursive bool) error {
	parent, name, err := parentOf(p, false)
	if err != nil {
		return fsError(err)
	}
	defer parent.close()
	e, err := lstatAt(parent, name)
	if err != nil {
		return fsError(err)
	}
	switch {
	case e.isDir() && recursive:
		err = removeAllAt(parent, name)
	case e.isDir():
		if err = unlinkat(parent.fd, name, atRemoveDir); err == syscall.ENOTEMPTY || err == syscall.EEXIST {
			return api.Conflict("%s is a non-empty directory (pass recursive=true)", p)
		}
	default:
		err = unlinkat(parent.fd, name, 0)
	}
	if errno, ok := err.(syscall.Errno); ok {
		err = &os.PathError{Op: "remove", Path: p, Err: errno}
	}
	return fsError(err)
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
	st, err := move(src, dst, req.Overwrite)
	if err != nil {
		api.WriteError(w, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, st)
}

// move renames src's last component itself (a symlink is moved, not followed) to dst,
// replacing what is at dst (never writing through a link there).
func move(src, dst string, overwrite bool) (Stat, error) {
	sdir, sname, err := parentOf(src, false)
	if err != nil {
		return Stat{}, fsError(err)
	}
	defer sdir.close()
	se, err := lstatAt(sdir, sname)
	if err != nil {
		return Stat{}, fsError(err)
	}
	if src == dst {
		return statAt(sdir, sname, dst)
	}
	if src == "/" || strings.HasPrefix(dst, src+"/") {
		return Stat{}, api.BadRequest("cannot move %s into itself (%s)", src, dst)
	}
	ddir, dname, err := parentOf(dst, true)
	if err != nil {
		return Stat{}, createError(err)
	}
	defer ddir.close()
	if de, err := lstatAt(ddir, dname); err == nil {
		if !overwrite {
			return Stat{}, api.Conflict("%s exists (overwrite=false)", dst)
		}
		if de.isDir() != se.isDir() {
			return Stat{}, api.Conflict("cannot replace %s with %s: one is a directory, the other is not", dst, src)
		}
	}
	err = renameat(sdir.fd, sname, ddir.fd, dname)
	if err == syscall.EXDEV {
		err = moveAcross(sdir, sname, ddir, dname)
	}
	if errno, ok := err.(syscall.Errno); ok {
		err = &os.PathError{Op: "rename", Path: src, Err: errno}
	}
	if err != nil {
		return Stat{}, createError(err)
	}
	return statAt(ddir, dname, dst)
}

// moveAcross moves sname to dname on another file system: copy beside dname, rename
// over it (so dst is never half-written), then remove the source.
func moveAcross(sdir dirRef, sname string, ddir dirRef, dname string) error {
	tmp, err := mkdirTemp(ddir, ".orchard-move-")
	if err != nil {
		return err
	}
	defer func() { _ = removeAllAt(ddir, tmp) }() // empty once renamed
	staged, err := (&walker{}).walk(ddir, tmp)
	if err != nil {
		return err
	}
	defer staged.close()
	if err := copyTreeAt(sdir, sname, staged, "x"); err != nil {
		return err
	}
	if err := renameat(staged.fd, "x", ddir.fd, dname); err != nil {
		return &os.PathError{Op: "rename", Path: ddir.join(dname), Err: err}
	}
	return removeAllAt(sdir, sname)
}
