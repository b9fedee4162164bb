package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// applyLayer extracts an image layer onto a folder as a runtime does: ".wh." files delete,
// ".wh..wh..opq" empties the directory of what the layers below put there.
func applyLayer(t *testing.T, blob []byte, dest string) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(dest, hdr.Name)
		dir, base := filepath.Split(name)
		switch {
		case base == opaqueMarker:
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				_ = os.RemoveAll(filepath.Join(dir, e.Name()))
			}
			continue
		case strings.HasPrefix(base, whiteoutPrefix):
			if err := os.RemoveAll(filepath.Join(dir, strings.TrimPrefix(base, whiteoutPrefix))); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if hdr.Typeflag != tar.TypeDir {
			_ = os.RemoveAll(name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if st, err := os.Lstat(name); err != nil || !st.IsDir() {
				_ = os.RemoveAll(name)
				if err := os.Mkdir(name, 0o755); err != nil {
					t.Fatal(err)
				}
			}
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			if err := os.WriteFile(name, data, 0o600); err != nil {
				t.Fatal(err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, name); err != nil {
				t.Fatal(err)
			}
		case tar.TypeLink:
			if err := os.Link(filepath.Join(dest, hdr.Linkname), name); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected entry %q type %c", hdr.Name, hdr.Typeflag)
		}
		if hdr.Typeflag != tar.TypeSymlink {
			if err := os.Chmod(name, fs.FileMode(hdr.Mode).Perm()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// tree describes a folder: each path's type, mode, size, content hash and link target.
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			sum := sha256.Sum256(data)
			desc += " " + hex.EncodeToString(sum[:8])
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		}
		out[strings.TrimPrefix(p, root)] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The layer of a real overlay's upper dir, applied to the image, is what the container
// saw: the merged view, file for file (whiteouts, an opaque directory, links, modes).
func TestWriteLayerOfARealOverlay(t *testing.T) {
	lower := layer(t, "d /etc", "f /etc/passwd", "f /etc/group", "d /opt", "f /opt/a", "d /opt/sub",
		"f /opt/sub/x", "d /usr", "f /usr/tool", "l /usr/link", "d /var", "f /var/old")
	upper, work, merged := t.TempDir(), t.TempDir(), t.TempDir()
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := syscall.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("cannot mount an overlay here (needs root): %v", err)
	}
	defer func() { _ = syscall.Unmount(merged, syscall.MNT_DETACH) }()
	in := func(p string) string { return filepath.Join(merged, p) }
	for i, err := range []error{
		os.WriteFile(in("/etc/new"), []byte("new"), 0o640),
		os.WriteFile(in("/etc/passwd"), []byte("root::0:0::/:/bin/sh\n"), 0o644),
		os.Remove(in("/etc/group")),
		os.RemoveAll(in("/opt")),
		os.Mkdir(in("/opt"), 0o750),
		os.WriteFile(in("/opt/a"), []byte("again"), 0o644),
		os.MkdirAll(in("/work/deep"), 0o755),
		os.WriteFile(in("/work/deep/f"), bytes.Repeat([]byte("x"), 1<<20), 0o644),
		os.Link(in("/work/deep/f"), in("/work/hard")),
		os.Symlink("/work/deep/f", in("/work/soft")),
		os.Chmod(in("/usr/tool"), 0o700),
		os.Remove(in("/usr/link")),
		os.RemoveAll(in("/var")),
		os.WriteFile(in("/var"), []byte("a file now"), 0o644),
	} {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	var blob bytes.Buffer
	info, err := writeLayer(&blob, upper, nil)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(blob.Len()) || !strings.HasPrefix(info.Digest, "sha256:") || info.Digest == info.DiffID {
		t.Fatalf("layer info %+v for %d bytes", info, blob.Len())
	}
	sum := sha256.Sum256(blob.Bytes())
	if info.Digest != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatal("the digest is not the blob's")
	}
	applied := t.TempDir()
	if out, err := exec.Command("cp", "-a", lower+"/.", applied).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	applyLayer(t, blob.Bytes(), applied)
	want, got := tree(t, merged), tree(t, applied)
	for p, d := range want {
		if got[p] != d {
			t.Errorf("%s: got %q, want %q", p, got[p], d)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: in the applied layer, not in the container", p)
		}
	}
	// Deterministic: the same upper dir makes the same blob.
	var again bytes.Buffer
	if info2, err := writeLayer(&again, upper, nil); err != nil || info2 != info {
		t.Fatalf("second layer %+v %v, first %+v", info2, err, info)
	}
}

func TestWriteLayerLeavesTheMountPointsOut(t *testing.T) {
	upper := layer(t, "d /etc", "f /etc/hosts", "f /etc/mine", "d /.orchard", "f /.orchard/agent.log",
		"d /dev", "w /gone")
	var blob bytes.Buffer
	if _, err := writeLayer(&blob, upper, map[string]bool{"/etc/hosts": true, "/.orchard": true, "/dev": true}); err != nil {
		t.Fatal(err)
	}
	zr, _ := gzip.NewReader(&blob)
	tr := tar.NewReader(zr)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
	if strings.Join(names, " ") != "etc/ etc/mine .wh.gone" {
		t.Fatalf("entries %q", names)
	}
}
