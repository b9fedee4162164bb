package proc

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultSpillDir is outside /tmp, where any sandbox user could prepare the path.
const DefaultSpillDir = "/.orchard/spill"

// SpillDir is the folder for the full outputs of capped streams.
//
// Commands run as root may spill while a less privileged user of the sandbox has
// prepared the path (a symlink at it, or at a folder above it, as with `ln -s /etc
// /tmp/orchard`). So the folder is reached one component at a time without following
// links (missing ones are created), must belong to the agent's user with no access
// for anyone else (0700, never chmod-ed into shape: a folder that is not private is
// refused), and files are created relative to that open folder with O_EXCL|O_NOFOLLOW.
// The walk is repeated per file, so a folder removed meanwhile is made again.
type SpillDir struct{ path string }

// NewSpillDir names the folder; nothing is created until Prepare or the first spill.
func NewSpillDir(path string) *SpillDir {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return &SpillDir{path: filepath.Clean(path)}
}

// Path is the folder's absolute path.
func (d *SpillDir) Path() string { return d.path }

// Prepare creates and checks the folder now: at start, before any command runs.
func (d *SpillDir) Prepare() error {
	h, err := d.open(true)
	if err != nil {
		return err
	}
	h.close()
	return nil
}

// Create makes a new file, mode 0600, named after pattern with its "*" replaced by a
// random string; its Name() is the full path.
func (d *SpillDir) Create(pattern string) (*os.File, error) {
	if strings.Contains(pattern, "/") {
		return nil, fmt.Errorf("spill file name %q has a slash", pattern)
	}
	if !strings.Contains(pattern, "*") {
		pattern += "*"
	}
	h, err := d.open(true)
	if err != nil {
		return nil, err
	}
	defer h.close()
	for try := 0; ; try++ {
		var b [8]byte
		_, _ = rand.Read(b[:])
		name := strings.Replace(pattern, "*", hex.EncodeToString(b[:]), 1)
		f, err := h.create(name)
		if os.IsExist(err) && try < 10 {
			continue
		}
		return f, err
	}
}

// Remove deletes a file Create returned (by its Name()), inside the folder only.
func (d *SpillDir) Remove(path string) {
	if filepath.Dir(path) != d.path {
		return
	}
	if h, err := d.open(false); err == nil {
		h.remove(filepath.Base(path))
		h.close()
	}
}

// checkPrivate refuses a folder anyone but the agent's user may enter or change.
func (d *SpillDir) checkPrivate(uid, mode uint32) error {
	if int(uid) != os.Geteuid() || mode&0o077 != 0 {
		return fmt.Errorf("spill folder %s is not private to the agent (owner uid %d, mode %#o; want uid %d, mode 0700)",
			d.path, uid, mode&0o7777, os.Geteuid())
	}
	return nil
}

func (d *SpillDir) notAFolder(p string) error {
	return fmt.Errorf("spill folder: %s is a symlink or not a folder (links are never followed)", p)
}
