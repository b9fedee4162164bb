package files

import (
	"archive/tar"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Issue 31, hole 7: writes never follow a symlink a less privileged user of the sandbox
// planted. The tests run as root and make the links belong to nobody (uid 65534) with
// Lchown, which is what `ln -s` run by nobody leaves behind.
const nobody = 65534

// plantedFixture is a sticky, world-writable folder (like /tmp) and a root-owned folder
// standing for /etc, holding a passwd file.
type plantedFixture struct {
	pub, etc, passwd string
	before           string
}

func newPlanted(t *testing.T) *plantedFixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("planting a link owned by another user needs root (Lchown)")
	}
	base := t.TempDir()
	f := &plantedFixture{pub: filepath.Join(base, "tmp"), etc: filepath.Join(base, "etc")}
	must(t, os.Mkdir(f.pub, 0o755))
	must(t, os.Chmod(f.pub, 0o1777))
	must(t, os.Mkdir(f.etc, 0o755))
	f.passwd = filepath.Join(f.etc, "passwd")
	must(t, os.WriteFile(f.passwd, []byte("root:x:0:0::/root:/bin/sh\n"), 0o644))
	f.before = snapshot(t, f.etc)
	return f
}

// plant makes a symlink at name (below pub) to target, owned by uid.
func (f *plantedFixture) plant(t *testing.T, name, target string, uid int) string {
	t.Helper()
	p := filepath.Join(f.pub, name)
	must(t, os.MkdirAll(filepath.Dir(p), 0o777))
	must(t, os.Symlink(target, p))
	must(t, os.Lchown(p, uid, uid))
	return p
}

// nobodyDir makes a folder below pub that nobody owns.
func (f *plantedFixture) nobodyDir(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(f.pub, name)
	must(t, os.Mkdir(p, 0o755))
	must(t, os.Lchown(p, nobody, nobody))
	return p
}

func (f *plantedFixture) unchanged(t *testing.T) {
	t.Helper()
	if after := snapshot(t, f.etc); after != f.before {
		t.Fatalf("the root-owned folder changed:\n%s\nwas\n%s", after, f.before)
	}
}

func tarUpload(c *client, dir string, entries []tEntry) (int, []byte) {
	c.t.Helper()
	return c.upload(dir, buildTar(c.t, entries, false))
}

func TestWritesRefuseLinksPlantedByAnotherUser(t *testing.T) {
	reg := func(name string) tEntry { return tEntry{name: name, typ: tar.TypeReg, mode: 0o644, body: "pwned"} }
	cases := []struct {
		name string
		do   func(c *client, f *plantedFixture) (int, []byte)
		want int
	}{
		{"PUT through a planted last component", func(c *client, f *plantedFixture) (int, []byte) {
			return c.write(f.plant(c.t, "report.txt", f.passwd, nobody), []byte("pwned\n"))
		}, 403},
		{"PUT through a planted relative link", func(c *client, f *plantedFixture) (int, []byte) {
			rel, err := filepath.Rel(f.pub, f.passwd)
			must(c.t, err)
			return c.write(f.plant(c.t, "rel.txt", rel, nobody), []byte("pwned\n"))
		}, 403},
		{"PUT through a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			return c.write(f.plant(c.t, "d/cfg", f.etc, nobody)+"/evil.conf", []byte("pwned\n"))
		}, 403},
		{"PUT over a file through a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			return c.write(f.plant(c.t, "d/cfg", f.etc, nobody)+"/passwd", []byte("pwned\n"))
		}, 403},
		{"PUT with new parents through a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			return c.write(f.plant(c.t, "d/cfg", f.etc, nobody)+"/a/b/evil", []byte("pwned\n"))
		}, 403},
		{"PUT through nobody's link to a root link out", func(c *client, f *plantedFixture) (int, []byte) {
			root := f.plant(c.t, "rootlink", f.etc, 0)
			return c.write(f.plant(c.t, "chain", root, nobody)+"/evil.conf", []byte("pwned\n"))
		}, 403},
		{"PUT through a root link to nobody's link out", func(c *client, f *plantedFixture) (int, []byte) {
			planted := f.plant(c.t, "planted", f.etc, nobody)
			return c.write(f.plant(c.t, "byroot", planted, 0)+"/evil.conf", []byte("pwned\n"))
		}, 403},
		{"PUT through a link in nobody's own folder", func(c *client, f *plantedFixture) (int, []byte) {
			home := f.nobodyDir(c.t, "home")
			must(c.t, os.Symlink(f.etc, filepath.Join(home, "cfg")))
			must(c.t, os.Lchown(filepath.Join(home, "cfg"), nobody, nobody))
			return c.write(filepath.Join(home, "cfg", "evil.conf"), []byte("pwned\n"))
		}, 403},
		{"mkdir through a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			return c.post("/files/mkdir", map[string]any{"path": f.plant(c.t, "d/cfg", f.etc, nobody) + "/evil.d"})
		}, 403},
		{"mkdir -p through a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			return c.post("/files/mkdir", map[string]any{"path": f.plant(c.t, "d/cfg", f.etc, nobody) + "/x/y/z"})
		}, 403},
		{"mkdir without parents through a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			p := f.plant(c.t, "d/cfg", f.etc, nobody) + "/evil.d"
			return c.post("/files/mkdir", map[string]any{"path": p, "parents": false})
		}, 403},
		{"remove through a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			return c.post("/files/remove", map[string]any{"path": f.plant(c.t, "d/cfg", f.etc, nobody) + "/passwd"})
		}, 403},
		{"move out through a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			src := f.plant(c.t, "d/cfg", f.etc, nobody) + "/passwd"
			return c.post("/files/move", map[string]any{"src": src, "dst": filepath.Join(f.pub, "stolen")})
		}, 403},
		{"move in through a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			src := filepath.Join(f.pub, "mine")
			must(c.t, os.WriteFile(src, []byte("pwned\n"), 0o644))
			dst := f.plant(c.t, "d/cfg", f.etc, nobody) + "/passwd"
			return c.post("/files/move", map[string]any{"src": src, "dst": dst, "overwrite": true})
		}, 403},
		{"tar into a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			return tarUpload(c, f.plant(c.t, "d/cfg", f.etc, nobody), []tEntry{reg("evil.conf"), reg("passwd")})
		}, 403},
		{"tar below a planted folder", func(c *client, f *plantedFixture) (int, []byte) {
			return tarUpload(c, f.plant(c.t, "d/cfg", f.etc, nobody)+"/new", []tEntry{reg("evil.conf")})
		}, 403},
		{"tar through a planted folder in the target", func(c *client, f *plantedFixture) (int, []byte) {
			f.plant(c.t, "up/cfg", f.etc, nobody)
			return tarUpload(c, filepath.Join(f.pub, "up"), []tEntry{reg("cfg/evil.conf")})
		}, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t)
			f := newPlanted(t)
			code, body := tc.do(c, f)
			if code != tc.want {
				t.Errorf("%d %s, want %d", code, body, tc.want)
			} else if tc.want == 403 && errCode(t, body) != "forbidden" {
				t.Errorf("code %s, want forbidden", body)
			}
			f.unchanged(t)
		})
	}
}

// What images and users need keeps working: links root owns (Debian's /bin → usr/bin,
// /var/run → /run) are followed; a user's link into what that user owns is followed; a
// dangling planted link is replaced, not written through.
func TestWritesFollowLinksTheirOwnersCouldWriteThrough(t *testing.T) {
	c := newClient(t)
	f := newPlanted(t)

	// A root link in a root folder, and a root link in nobody's folder.
	usr := filepath.Join(f.pub, "usr")
	must(t, os.MkdirAll(filepath.Join(usr, "bin"), 0o755))
	f.plant(t, "bin", "usr/bin", 0)
	if code, body := c.write(filepath.Join(f.pub, "bin", "tool"), []byte("#!/bin/sh\n"), "mode", "0755"); code != 201 {
		t.Fatalf("write through a root link: %d %s", code, body)
	}
	if b, _ := os.ReadFile(filepath.Join(usr, "bin", "tool")); string(b) != "#!/bin/sh\n" {
		t.Fatalf("tool = %q", b)
	}
	if code, body := c.post("/files/mkdir", map[string]any{"path": filepath.Join(f.pub, "bin", "sub", "deep")}); code != 201 {
		t.Fatalf("mkdir through a root link: %d %s", code, body)
	}

	reg := tEntry{name: "from-tar", typ: tar.TypeReg, mode: 0o644, body: "tar"}
	if code, body := tarUpload(c, filepath.Join(f.pub, "bin"), []tEntry{reg}); code != 200 {
		t.Fatalf("tar through a root link: %d %s", code, body)
	}
	if b, _ := os.ReadFile(filepath.Join(usr, "bin", "from-tar")); string(b) != "tar" {
		t.Fatalf("from-tar = %q", b)
	}

	// nobody's link to nobody's own folder and file.
	home := f.nobodyDir(t, "home")
	proj := filepath.Join(home, "proj")
	must(t, os.Mkdir(proj, 0o755))
	must(t, os.Lchown(proj, nobody, nobody))
	must(t, os.WriteFile(filepath.Join(proj, "README"), []byte("old"), 0o644))
	must(t, os.Lchown(filepath.Join(proj, "README"), nobody, nobody))
	for name, target := range map[string]string{"current": "proj", "README": "proj/README"} {
		must(t, os.Symlink(target, filepath.Join(home, name)))
		must(t, os.Lchown(filepath.Join(home, name), nobody, nobody))
	}
	if code, body := c.write(filepath.Join(home, "current", "new.txt"), []byte("new")); code != 201 {
		t.Fatalf("write through nobody's link to nobody's folder: %d %s", code, body)
	}
	if b, _ := os.ReadFile(filepath.Join(proj, "new.txt")); string(b) != "new" {
		t.Fatalf("new.txt = %q", b)
	}
	code, body := c.write(filepath.Join(home, "README"), []byte("edited"))
	if code != 201 {
		t.Fatalf("write through nobody's link to nobody's file: %d %s", code, body)
	}
	var st Stat
	mustJSON(t, body, &st)
	if st.Path != filepath.Join(proj, "README") || st.Type != "file" {
		t.Fatalf("stat of the written file: %+v", st)
	}
	if b, _ := os.ReadFile(filepath.Join(proj, "README")); string(b) != "edited" {
		t.Fatalf("README = %q", b)
	}
	if fi, _ := os.Lstat(filepath.Join(home, "README")); fi.Mode()&os.ModeSymlink == 0 {
		t.Fatal("the link was replaced, not written through")
	}
	var sys = statT(t, filepath.Join(proj, "README"))
	if sys.Uid != nobody {
		t.Fatalf("the file's owner became %d, want nobody's", sys.Uid)
	}

	// A dangling planted link is replaced by the file; nothing appears where it pointed.
	dangling := f.plant(t, "dangling", filepath.Join(f.etc, "shadow"), nobody)
	if code, body := c.write(dangling, []byte("data")); code != 201 {
		t.Fatalf("write over a dangling planted link: %d %s", code, body)
	}
	if fi, err := os.Lstat(dangling); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("dangling link not replaced: %v %v", fi, err)
	}
	// Removing, moving and tar-replacing a planted link act on the link itself.
	victim := f.plant(t, "victim", f.passwd, nobody)
	if code, body := c.post("/files/remove", map[string]any{"path": victim}); code != 204 {
		t.Fatalf("remove a planted link: %d %s", code, body)
	}
	cfg := f.plant(t, "cfg", f.etc, nobody)
	if code, body := c.post("/files/move", map[string]any{"src": cfg, "dst": cfg + ".moved"}); code != 200 {
		t.Fatalf("move a planted link: %d %s", code, body)
	}
	if code, body := c.post("/files/remove", map[string]any{"path": cfg + ".moved", "recursive": true}); code != 204 {
		t.Fatalf("remove a planted folder link recursively: %d %s", code, body)
	}
	// A recursive remove of a tree holding planted links removes the links only.
	f.plant(t, "tree/a/etc", f.etc, nobody)
	f.plant(t, "tree/passwd", f.passwd, nobody)
	if code, body := c.post("/files/remove", map[string]any{"path": filepath.Join(f.pub, "tree"), "recursive": true}); code != 204 {
		t.Fatalf("remove a tree of planted links: %d %s", code, body)
	}
	f.plant(t, "up/passwd", f.passwd, nobody)
	reg = tEntry{name: "passwd", typ: tar.TypeReg, mode: 0o644, body: "tar"}
	if code, body := tarUpload(c, filepath.Join(f.pub, "up"), []tEntry{reg}); code != 200 {
		t.Fatalf("tar over a planted link: %d %s", code, body)
	}
	f.unchanged(t)
}

// A link loop on the way is a 400 (ELOOP), as the kernel would say.
func TestWriteThroughALinkLoop(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	must(t, os.Symlink("b", filepath.Join(dir, "a")))
	must(t, os.Symlink("a", filepath.Join(dir, "b")))
	if code, body := c.write(filepath.Join(dir, "a", "x"), []byte("x")); code != 400 || errCode(t, body) != "bad_request" {
		t.Fatalf("write through a loop: %d %s", code, body)
	}
}

// A refusal says which link and why, in words a caller can act on.
func TestPlantedLinkRefusalMessage(t *testing.T) {
	c := newClient(t)
	f := newPlanted(t)
	link := f.plant(t, "d/cfg", f.etc, nobody)
	code, body := c.write(link+"/evil.conf", []byte("x"))
	if code != http.StatusForbidden {
		t.Fatalf("%d %s", code, body)
	}
	for _, want := range []string{link, "uid 65534", "owned by root"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("message %s lacks %q", body, want)
		}
	}
	// Reads still follow it: root may read anything in its sandbox, and the bytes go to
	// the caller, not to whoever planted the link.
	code, got := c.read(link + "/passwd")
	if code != 200 || !strings.HasPrefix(string(got), "root:") {
		t.Fatalf("read through a planted link: %d %q", code, got)
	}
	if code, _ := c.do(http.MethodGet, "/files/list", url.Values{"path": {link}}, nil); code != 200 {
		t.Fatalf("list through a planted link: %d", code)
	}
}

func statT(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	must(t, err)
	return fi.Sys().(*syscall.Stat_t)
}
