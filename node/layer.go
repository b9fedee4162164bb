package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"syscall"
	"time"
)

// Whiteouts in an image layer (the OCI image spec's "Representing Changes"): a deleted
// name is an empty file ".wh.<name>" beside it; a directory made anew, which hides what
// the layers below had in it, holds an empty ".wh..wh..opq".
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// layerInfo is what an image manifest and config say of a layer.
type layerInfo struct {
	Digest string `json:"digest"`  // sha256 of the gzipped tar (the blob)
	DiffID string `json:"diff_id"` // sha256 of the tar itself (the config's rootfs)
	Size   int64  `json:"size"`    // the blob's bytes
}

// countingHash hashes and counts what is written through it.
type countingHash struct {
	h hash.Hash
	n int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

func (c *countingHash) sum() string { return "sha256:" + hex.EncodeToString(c.h.Sum(nil)) }

// writeLayer writes the container's changes, its upper dir, as a gzipped image layer to
// w: overlayfs's whiteouts become ".wh." files and its opaque directories ".wh..wh..opq"
// markers, hard links stay links, owners, modes and times are kept. The runtime's mount
// points (`skip`: /etc/hosts, /.orchard, /dev, ...) are left out with what is under them,
// as the diff leaves them out. Entries come in name order, so the same upper dir makes
// the same layer.
func writeLayer(w io.Writer, upper string, skip map[string]bool) (layerInfo, error) {
	blob := &countingHash{h: sha256.New()}
	zw, err := gzip.NewWriterLevel(io.MultiWriter(w, blob), gzip.BestSpeed)
	if err != nil {
		return layerInfo{}, err
	}
	diff := &countingHash{h: sha256.New()}
	tw := tar.NewWriter(io.MultiWriter(zw, diff))
	lw := &layerWriter{tw: tw, upper: upper, skip: skip, links: map[[2]uint64]string{}}
	if err := lw.dir("/"); err != nil {
		return layerInfo{}, err
	}
	if err := tw.Close(); err != nil {
		return layerInfo{}, err
	}
	if err := zw.Close(); err != nil {
		return layerInfo{}, err
	}
	return layerInfo{Digest: blob.sum(), DiffID: diff.sum(), Size: blob.n}, nil
}

type layerWriter struct {
	tw    *tar.Writer
	upper string
	skip  map[string]bool
	links map[[2]uint64]string // (device, inode) -> the first name written for it
}

// dir writes the entries of one directory of the upper dir, depth first, in name order.
func (lw *layerWriter) dir(dir string) error {
	entries, err := os.ReadDir(filepath.Join(lw.upper, dir))
	if err != nil {
		return err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	if dir != "/" && isOpaque(filepath.Join(lw.upper, dir)) {
		if err := lw.empty(path.Join(dir, opaqueMarker)); err != nil {
			return err
		}
	}
	for _, e := range entries {
		p := path.Join(dir, e.Name())
		if lw.skip[p] {
			continue
		}
		fi, err := os.Lstat(filepath.Join(lw.upper, p))
		if err != nil {
			if os.IsNotExist(err) {
				continue // gone while we walk: the container runs on (a frozen one does not)
			}
			return err
		}
		if isWhiteout(fi) {
			if err := lw.empty(path.Join(dir, whiteoutPrefix+e.Name())); err != nil {
				return err
			}
			continue
		}
		if err := lw.entry(p, fi); err != nil {
			return err
		}
		if fi.IsDir() {
			if err := lw.dir(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// empty writes an empty regular file: a whiteout or the opaque marker.
func (lw *layerWriter) empty(name string) error {
	return lw.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name[1:], Mode: 0o600, Format: tar.FormatPAX})
}

func (lw *layerWriter) entry(p string, fi fs.FileInfo) error {
	full := filepath.Join(lw.upper, p)
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(full); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name, hdr.Format = p[1:], tar.FormatPAX
	hdr.Uname, hdr.Gname = "", ""                             // ids only: names are the image's /etc/passwd's business
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{} // reading changes them
	if fi.IsDir() {
		hdr.Name += "/"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
		id := [2]uint64{uint64(st.Dev), st.Ino}
		if first, seen := lw.links[id]; seen {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			return lw.tw.WriteHeader(hdr)
		}
		lw.links[id] = hdr.Name
	}
	if err := lw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(full)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyN(lw.tw, f, hdr.Size)
	return err
}
