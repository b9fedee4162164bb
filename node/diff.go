package main

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// changes is the answer of a diff: absolute paths inside the container, each sorted. The
// service's diff (docs/state.md) has the same three lists on every backend.
type changes struct {
	Added    []string `json:"added"`
	Modified []string `json:"modified"`
	Deleted  []string `json:"deleted"`
}

// isWhiteout: overlayfs marks a deleted name with a 0:0 character device.
func isWhiteout(fi fs.FileInfo) bool {
	if fi.Mode()&fs.ModeCharDevice == 0 || fi.Mode()&fs.ModeDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Rdev == 0
}

// isOpaque: a directory made anew over a deleted one hides everything below it. The
// trusted.* name needs CAP_SYS_ADMIN to read; user.* is the unprivileged snapshotter's.
func isOpaque(dir string) bool {
	buf := make([]byte, 8)
	for _, name := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := syscall.Getxattr(dir, name, buf); err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// lowerView answers what the image showed at a path: the merged view of the lower layers,
// top first, with their whiteouts and opaque directories.
type lowerView struct {
	layers []string
	hides  []map[string]bool // per layer: does its entry at this dir hide the layers below?
}

func newLowerView(layers []string) *lowerView {
	v := &lowerView{layers: layers, hides: make([]map[string]bool, len(layers))}
	for i := range v.hides {
		v.hides[i] = map[string]bool{}
	}
	return v
}

// lookup is the image's entry at p, if it had one.
func (v *lowerView) lookup(p string) (fs.FileInfo, bool) {
	for i, layer := range v.layers {
		fi, err := os.Lstat(filepath.Join(layer, p))
		if err == nil {
			return fi, !isWhiteout(fi)
		}
		if v.hidden(i, p) {
			return nil, false
		}
	}
	return nil, false
}

// hidden: whether layer i hides p from the layers below it by an ancestor that is whited
// out, opaque or not a directory (p itself being absent from layer i).
func (v *lowerView) hidden(i int, p string) bool {
	for a := path.Dir(p); a != "/" && a != "."; a = path.Dir(a) {
		h, ok := v.hides[i][a]
		if !ok {
			fi, err := os.Lstat(filepath.Join(v.layers[i], a))
			switch {
			case err != nil:
				h = false
			case isWhiteout(fi) || !fi.IsDir():
				h = true
			default:
				h = isOpaque(filepath.Join(v.layers[i], a))
			}
			v.hides[i][a] = h
		}
		if h {
			return true
		}
	}
	return false
}

// children are the names the image had in directory p.
func (v *lowerView) children(p string) []string {
	seen := map[string]bool{}
	var out []string
	for i, layer := range v.layers {
		entries, _ := os.ReadDir(filepath.Join(layer, p))
		for _, e := range entries {
			if !seen[e.Name()] {
				seen[e.Name()] = true
				if _, ok := v.lookup(path.Join(p, e.Name())); ok {
					out = append(out, e.Name())
				}
			}
		}
		if isOpaque(filepath.Join(layer, p)) || v.hidden(i, path.Join(p, "x")) {
			break
		}
	}
	return out
}

// diffUpper lists what the container changed: every entry of its upper dir against the
// image's layers. A whiteout is a deletion (if the image had the name); a name the image
// lacked is added; one it had is modified, but for a directory that stayed one (changes
// inside it are listed themselves); an opaque directory also deletes every name the image
// had there that it does not hold. The runtime's mount points (`hidden`) are never a
// change, but what is beside them in the same directory is.
func diffUpper(upper string, lowers []string, hidden map[string]bool) (changes, error) {
	view := newLowerView(lowers)
	c := changes{Added: []string{}, Modified: []string{}, Deleted: []string{}}
	stack := []string{"/"}
	for len(stack) > 0 {
		dir := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		entries, err := os.ReadDir(filepath.Join(upper, dir))
		if err != nil {
			if dir == "/" {
				return c, err
			}
			continue // removed while we walk: the sandbox runs on
		}
		names := map[string]bool{}
		for _, e := range entries {
			names[e.Name()] = true
			p := path.Join(dir, e.Name())
			fi, err := os.Lstat(filepath.Join(upper, p))
			if err != nil {
				continue
			}
			if hidden[p] {
				if fi.IsDir() {
					stack = append(stack, p)
				}
				continue
			}
			if isWhiteout(fi) {
				if _, had := view.lookup(p); had {
					c.Deleted = append(c.Deleted, p)
				}
				continue
			}
			was, had := view.lookup(p)
			switch {
			case !had:
				c.Added = append(c.Added, p)
			case !fi.IsDir() || !was.IsDir():
				c.Modified = append(c.Modified, p)
			}
			if fi.IsDir() {
				stack = append(stack, p)
			}
		}
		if dir != "/" && isOpaque(filepath.Join(upper, dir)) {
			for _, name := range view.children(dir) {
				if !names[name] {
					c.Deleted = append(c.Deleted, path.Join(dir, name))
				}
			}
		}
	}
	sort.Strings(c.Added)
	sort.Strings(c.Modified)
	sort.Strings(c.Deleted)
	return c, nil
}

// GET /v1/pods/{pod}/containers/{container}/diff
func (n *node) diff(w http.ResponseWriter, r *http.Request) {
	c, err := n.containerChanges(r.PathValue("pod"), r.PathValue("container"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (n *node) containerChanges(pod, ctr string) (changes, error) {
	root, hidden, err := n.containerRoot(pod, ctr)
	if err != nil {
		return changes{}, err
	}
	return diffUpper(root.upper, root.lowers, hidden)
}

// containerRoot finds the container's overlay (as paths this helper can read) and its
// mount points, from the mountinfo of one of its processes.
func (n *node) containerRoot(pod, ctr string) (overlayRoot, map[string]bool, error) {
	cg, err := n.findContainer(pod, ctr)
	if err != nil {
		return overlayRoot{}, nil, err
	}
	pids, err := cg.pids()
	if err != nil {
		return overlayRoot{}, nil, err
	}
	var mounts []mount
	for _, pid := range pids {
		if mounts, err = readMountinfo(filepath.Join(n.procRoot, itoa(pid), "mountinfo")); err == nil {
			break
		}
	}
	if mounts == nil {
		return overlayRoot{}, nil, fail(http.StatusConflict, "container_not_running",
			"container "+ctr[:12]+" has no process to read its mounts from")
	}
	root, hidden, err := rootOverlay(mounts)
	if err != nil {
		return overlayRoot{}, nil, err
	}
	if root.upper, err = n.hostPath(root.upper); err != nil {
		return overlayRoot{}, nil, err
	}
	for i, l := range root.lowers {
		if root.lowers[i], err = n.hostPath(l); err != nil {
			return overlayRoot{}, nil, err
		}
	}
	return root, hidden, nil
}

// hostPath maps a path on the node to where this helper sees it: the containerd root is
// mounted read-only into the helper (--containerd-root, --containerd-root-mount).
func (n *node) hostPath(p string) (string, error) {
	rel, err := filepath.Rel(n.containerdRoot, filepath.Clean(p))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fail(http.StatusNotImplemented, "outside_containerd_root",
			"the container's layers ("+p+") are not under "+n.containerdRoot+
				", the containerd root this helper has mounted")
	}
	out := filepath.Join(n.containerdMount, rel)
	if _, err := os.Stat(out); errors.Is(err, fs.ErrNotExist) {
		return "", fail(http.StatusNotImplemented, "outside_containerd_root",
			"the container's layer "+p+" is not visible at "+out)
	}
	return out, nil
}
