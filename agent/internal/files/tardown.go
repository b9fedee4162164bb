package files

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"syscall"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// GET /files/tar: a read, so it follows symlinks as the kernel does (docs/agent-api.md).

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
