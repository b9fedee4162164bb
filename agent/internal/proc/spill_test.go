package proc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	if names, _ := filepath.Glob(filepath.Join(dir, "*")); len(names) != 0 {
		t.Fatalf("%s got %v", dir, names)
	}
}

// Issue 17, hole 11: a spill folder (or one above it) prepared by a sandbox user is
// refused, never followed.
func TestSpillDirRefusesLinksAndSharedFolders(t *testing.T) {
	cases := []struct {
		name    string
		prepare func(t *testing.T, base, target string) string // returns the spill path
		want    string
	}{
		{"symlink at the folder", func(t *testing.T, base, target string) string {
			p := filepath.Join(base, "spill")
			must(t, os.Symlink(target, p))
			return p
		}, "symlink"},
		{"symlink above the folder", func(t *testing.T, base, target string) string {
			must(t, os.Symlink(target, filepath.Join(base, "up")))
			return filepath.Join(base, "up", "spill")
		}, "symlink"},
		{"a file at the folder", func(t *testing.T, base, target string) string {
			p := filepath.Join(base, "spill")
			must(t, os.WriteFile(p, nil, 0o600))
			return p
		}, "not a folder"},
		{"a folder others may write", func(t *testing.T, base, target string) string {
			p := filepath.Join(base, "spill")
			must(t, os.Mkdir(p, 0o700))
			must(t, os.Chmod(p, 0o777))
			return p
		}, "not private"},
		{"someone else's folder", func(t *testing.T, base, target string) string {
			if os.Geteuid() != 0 {
				t.Skip("chown needs root")
			}
			p := filepath.Join(base, "spill")
			must(t, os.Mkdir(p, 0o700))
			must(t, os.Chown(p, 65534, 65534))
			return p
		}, "not private"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			target := filepath.Join(base, "etc")
			must(t, os.Mkdir(target, 0o755))
			d := NewSpillDir(c.prepare(t, base, target))
			if err := d.Prepare(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Prepare: %v, want %q", err, c.want)
			}
			if f, err := d.Create("exec-*.stdout"); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Create: %v %v, want %q", f, err, c.want)
			}
			assertEmpty(t, target)
		})
	}
}

func TestSpillDirFiles(t *testing.T) {
	base := t.TempDir()
	d := NewSpillDir(filepath.Join(base, "a", "spill"))
	f, err := d.Create("exec-*.stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for p, want := range map[string]os.FileMode{d.Path(): 0o700 | os.ModeDir, f.Name(): 0o600} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode() != want {
			t.Fatalf("%s: %v %v, want %v", p, fi.Mode(), err, want)
		}
	}
	if filepath.Dir(f.Name()) != d.Path() || !strings.HasPrefix(filepath.Base(f.Name()), "exec-") {
		t.Fatalf("name %s", f.Name())
	}
	if _, err := d.Create("../x*"); err == nil {
		t.Fatal("a pattern with a slash must be refused")
	}
	// O_EXCL|O_NOFOLLOW: a link already at a name is never written through.
	h, err := d.open(false)
	must(t, err)
	defer h.close()
	outside := filepath.Join(base, "outside")
	must(t, os.Symlink(outside, filepath.Join(d.Path(), "planted")))
	if _, err := h.create("planted"); !os.IsExist(err) {
		t.Fatalf("create over a symlink: %v", err)
	}
	if _, err := os.Lstat(outside); !os.IsNotExist(err) {
		t.Fatalf("file made through a symlink: %v", err)
	}
	// Remove deletes only inside the folder.
	must(t, os.WriteFile(outside, nil, 0o600))
	d.Remove(outside)
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("Remove reached outside the folder: %v", err)
	}
	d.Remove(f.Name())
	if _, err := os.Lstat(f.Name()); !os.IsNotExist(err) {
		t.Fatalf("spill file kept: %v", err)
	}
	// A folder removed meanwhile is made again.
	must(t, os.RemoveAll(d.Path()))
	g, err := d.Create("proc-*.stderr")
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
