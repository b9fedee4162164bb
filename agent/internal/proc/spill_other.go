//go:build !linux

package proc

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// spillHandle off Linux checks each component with Lstat; the agent runs on Linux,
// where spill_linux.go holds the folder open instead, so nothing can swap it.
type spillHandle struct{ path string }

func (d *SpillDir) open(create bool) (*spillHandle, error) {
	if d.path == "/" {
		return nil, d.notAFolder("/")
	}
	p := ""
	parts := strings.Split(strings.TrimPrefix(d.path, "/"), "/")
	for i, part := range parts {
		p += "/" + part
		fi, err := os.Lstat(p)
		if os.IsNotExist(err) && create {
			mode := os.FileMode(0o755)
			if i == len(parts)-1 {
				mode = 0o700
			}
			if err = os.Mkdir(p, mode); err == nil || os.IsExist(err) {
				fi, err = os.Lstat(p)
			}
		}
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			return nil, d.notAFolder(p)
		}
		if i == len(parts)-1 {
			st, _ := fi.Sys().(*syscall.Stat_t)
			if st == nil {
				return nil, d.notAFolder(p)
			}
			if err := d.checkPrivate(st.Uid, uint32(st.Mode)); err != nil {
				return nil, err
			}
		}
	}
	return &spillHandle{path: d.path}, nil
}

func (h *spillHandle) create(name string) (*os.File, error) {
	return os.OpenFile(filepath.Join(h.path, name), os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
}

func (h *spillHandle) remove(name string) { _ = os.Remove(filepath.Join(h.path, name)) }

func (h *spillHandle) close() {}
