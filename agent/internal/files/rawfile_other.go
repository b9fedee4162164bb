//go:build !linux

package files

import (
	"os"
	"time"
)

// setMtime goes by path off Linux (no futimens in package syscall there).
func (f *rawFile) setMtime(t time.Time) { _ = os.Chtimes(f.path, t, t) }
