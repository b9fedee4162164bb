package files

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// tEntry describes one tar entry both for building archives and for comparing them.
type tEntry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
}

func buildTar(t *testing.T, entries []tEntry, gz bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	var out io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		out = zw
	}
	tw := tar.NewWriter(out)
	mtime := time.Date(2023, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, ModTime: mtime}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		must(t, tw.WriteHeader(h))
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	must(t, tw.Close())
	if zw != nil {
		must(t, zw.Close())
	}
	return buf.Bytes()
}

// readTar lists an archive as entries with names cleaned of a trailing slash, sorted.
func readTar(t *testing.T, r io.Reader) []tEntry {
	t.Helper()
	tr := tar.NewReader(r)
	var out []tEntry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		b, err := io.ReadAll(tr)
		must(t, err)
		out = append(out, tEntry{strings.TrimSuffix(h.Name, "/"), h.Linkname, h.Typeflag, h.Mode & 0o7777, string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func (c *client) upload(dir string, archive []byte) (int, []byte) {
	c.t.Helper()
	return c.do(http.MethodPut, "/files/tar", url.Values{"path": {dir}}, bytes.NewReader(archive))
}

func TestTarRoundTrip(t *testing.T) {
	long := strings.Repeat("long-name-", 15) // over ustar's 100 bytes
	entries := []tEntry{
		{name: "bin", typ: tar.TypeDir, mode: 0o750},
		{name: "bin/run.sh", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho hi\n"},
		{name: "data.bin", typ: tar.TypeReg, mode: 0o600, body: string(binaryData(5000))},
		{name: "empty", typ: tar.TypeReg, mode: 0o644},
		{name: "hard", typ: tar.TypeLink, link: "data.bin"},
		{name: "latest", typ: tar.TypeSymlink, link: "bin/run.sh", mode: 0o777},
		{name: "abs-link", typ: tar.TypeSymlink, link: "/usr/bin/env", mode: 0o777},
		{name: "ro", typ: tar.TypeDir, mode: 0o555},
		{name: "ro/inside", typ: tar.TypeReg, mode: 0o444, body: "read only"},
		{name: "sp ace/ünï ✓/new\nline", typ: tar.TypeReg, mode: 0o640, body: "odd names"},
		{name: "setuid", typ: tar.TypeReg, mode: 0o4755, body: "s"},
		{name: long + "/" + long, typ: tar.TypeReg, mode: 0o644, body: "deep"},
	}
	// Parents that the archive implies but does not list come back as folders.
	implied := []tEntry{
		{name: "sp ace", typ: tar.TypeDir, mode: 0o755},
		{name: "sp ace/ünï ✓", typ: tar.TypeDir, mode: 0o755},
		{name: long, typ: tar.TypeDir, mode: 0o755},
	}
	for _, gz := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gzip"}[gz], func(t *testing.T) {
			c := newClient(t)
			dir := filepath.Join(t.TempDir(), "new target")
			code, body := c.upload(dir, buildTar(t, entries, gz))
			if code != 200 {
				t.Fatalf("upload: %d %s", code, body)
			}
			var res tarResult
			mustJSON(t, body, &res)
			if res.Files != 10 || res.Bytes != int64(5000+len("#!/bin/sh\necho hi\n")+len("read only")+len("odd names")+1+4) {
				t.Fatalf("result %+v", res)
			}
			// On disk: modes, symlinks, hard link, mtimes.
			if fi, _ := os.Lstat(filepath.Join(dir, "ro")); fi.Mode() != fs.ModeDir|0o555 {
				t.Errorf("ro mode %v", fi.Mode())
			}
			if fi, _ := os.Lstat(filepath.Join(dir, "setuid")); fi.Mode() != fs.ModeSetuid|0o755 {
				t.Errorf("setuid mode %v", fi.Mode())
			}
			if l, _ := os.Readlink(filepath.Join(dir, "latest")); l != "bin/run.sh" {
				t.Errorf("symlink %q", l)
			}
			a, _ := os.Stat(filepath.Join(dir, "data.bin"))
			b, _ := os.Stat(filepath.Join(dir, "hard"))
			if !os.SameFile(a, b) {
				t.Error("hard link is not the same file")
			}
			if fi, _ := os.Stat(filepath.Join(dir, "bin")); fi.ModTime().Year() != 2023 {
				t.Errorf("dir mtime %v", fi.ModTime())
			}

			for _, dl := range []bool{false, true} {
				q := url.Values{"path": {dir}}
				if dl {
					q.Set("gzip", "true")
				}
				code, got := c.do(http.MethodGet, "/files/tar", q, nil)
				if code != 200 {
					t.Fatalf("download: %d %s", code, got)
				}
				var r io.Reader = bytes.NewReader(got)
				if dl {
					zr, err := gzip.NewReader(r)
					must(t, err)
					r = zr
				}
				gotEntries := readTar(t, r)
				wantEntries := append(append([]tEntry{}, entries...), implied...)
				for i := range wantEntries {
					if wantEntries[i].typ == tar.TypeLink {
						wantEntries[i].mode = 0o600 // a hard link entry carries its file's mode
					}
				}
				sort.Slice(wantEntries, func(i, j int) bool { return wantEntries[i].name < wantEntries[j].name })
				if len(gotEntries) != len(wantEntries) {
					t.Fatalf("download has %d entries, want %d: %q", len(gotEntries), len(wantEntries), gotEntries)
				}
				for i, w := range wantEntries {
					if g := gotEntries[i]; g != w {
						t.Errorf("entry %d:\n got %+q\nwant %+q", i, g, w)
					}
				}
			}
			must(t, os.Chmod(filepath.Join(dir, "ro"), 0o755)) // let TempDir clean up as non-root
		})
	}
}

func TestTarDownloadSingleFileAndSymlinkRoot(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "one.txt"), []byte("1"), 0o600))
	link := filepath.Join(t.TempDir(), "link-to-dir")
	must(t, os.Symlink(dir, link))
	for _, tc := range []struct {
		path string
		want []tEntry
	}{
		{filepath.Join(dir, "one.txt"), []tEntry{{name: "one.txt", typ: tar.TypeReg, mode: 0o600, body: "1"}}},
		{link, []tEntry{{name: "one.txt", typ: tar.TypeReg, mode: 0o600, body: "1"}}},
	} {
		code, got := c.do(http.MethodGet, "/files/tar", url.Values{"path": {tc.path}}, nil)
		if code != 200 {
			t.Fatalf("%s: %d", tc.path, code)
		}
		if entries := readTar(t, bytes.NewReader(got)); len(entries) != 1 || entries[0] != tc.want[0] {
			t.Fatalf("%s: %+q", tc.path, entries)
		}
	}
}

// snapshot records every path below root with its mode and size, to prove nothing changed.
func snapshot(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	must(t, filepath.Walk(root, func(p string, fi fs.FileInfo, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(p + " " + fi.Mode().String() + " " + fi.ModTime().String() + "\n")
		return nil
	}))
	return b.String()
}

func TestTarRejectsEscapes(t *testing.T) {
	reg := func(name string) tEntry { return tEntry{name: name, typ: tar.TypeReg, mode: 0o644, body: "pwned"} }
	sym := func(name, link string) tEntry {
		return tEntry{name: name, typ: tar.TypeSymlink, link: link, mode: 0o777}
	}
	cases := []struct {
		name    string
		entries func(outside string) []tEntry
	}{
		{"dotdot", func(string) []tEntry { return []tEntry{reg("../evil")} }},
		{"dotdot inside", func(string) []tEntry { return []tEntry{reg("a/../../evil")} }},
		{"dotdot folder", func(string) []tEntry { return []tEntry{{name: "../evil-dir/", typ: tar.TypeDir, mode: 0o755}} }},
		{"absolute", func(o string) []tEntry { return []tEntry{reg(o + "/evil")} }},
		{"symlink to outside then write through it", func(o string) []tEntry {
			return []tEntry{sym("link", o), reg("link/evil")}
		}},
		{"relative symlink out then write through it", func(string) []tEntry {
			return []tEntry{sym("link", "../outside"), reg("link/evil")}
		}},
		{"symlink chain out", func(o string) []tEntry {
			return []tEntry{sym("a", "b"), sym("b", o), reg("a/evil")}
		}},
		{"symlink out then folder through it", func(o string) []tEntry {
			return []tEntry{sym("link", o), {name: "link/sub/", typ: tar.TypeDir, mode: 0o777}}
		}},
		{"symlink out then symlink through it", func(o string) []tEntry {
			return []tEntry{sym("link", o), sym("link/evil", "/etc/passwd")}
		}},
		{"hard link to outside by dotdot", func(string) []tEntry {
			return []tEntry{{name: "h", typ: tar.TypeLink, link: "../outside/victim"}}
		}},
		{"hard link to absolute path", func(o string) []tEntry {
			return []tEntry{{name: "h", typ: tar.TypeLink, link: o + "/victim"}}
		}},
		{"hard link through a symlink out", func(o string) []tEntry {
			return []tEntry{sym("link", o), {name: "h", typ: tar.TypeLink, link: "link/victim"}}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t)
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			target := filepath.Join(base, "target")
			must(t, os.Mkdir(outside, 0o755))
			must(t, os.WriteFile(filepath.Join(outside, "victim"), []byte("original"), 0o644))
			before := snapshot(t, outside)
			code, body := c.upload(target, buildTar(t, tc.entries(outside), false))
			if code != 400 || errCode(t, body) != "bad_request" {
				t.Fatalf("upload: %d %s, want 400", code, body)
			}
			t.Logf("rejected: %s", body)
			if after := snapshot(t, outside); after != before {
				t.Fatalf("outside changed:\n%s\nwas\n%s", after, before)
			}
			if _, err := os.Lstat(filepath.Join(base, "evil")); err == nil {
				t.Fatal("evil written next to the target")
			}
		})
	}
}

// Entries that replace an earlier symlink must replace it, never write through it.
func TestTarReplacesSymlinksWithoutFollowing(t *testing.T) {
	c := newClient(t)
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	must(t, os.Mkdir(outside, 0o755))
	victim := filepath.Join(outside, "victim")
	must(t, os.WriteFile(victim, []byte("original"), 0o644))
	before := snapshot(t, outside)
	target := filepath.Join(base, "target")
	archive := buildTar(t, []tEntry{
		{name: "f", typ: tar.TypeSymlink, link: victim, mode: 0o777},
		{name: "f", typ: tar.TypeReg, mode: 0o666, body: "new"},
		{name: "d/", typ: tar.TypeDir, mode: 0o777},
		{name: "d", typ: tar.TypeSymlink, link: outside, mode: 0o777}, // then d's deferred chmod must not follow
		{name: "hl", typ: tar.TypeSymlink, link: victim, mode: 0o777},
		{name: "hard", typ: tar.TypeLink, link: "hl"}, // links the symlink itself
	}, false)
	code, body := c.upload(target, archive)
	if code != 200 {
		t.Fatalf("upload: %d %s", code, body)
	}
	if after := snapshot(t, outside); after != before {
		t.Fatalf("outside changed:\n%s\nwas\n%s", after, before)
	}
	if b, _ := os.ReadFile(filepath.Join(target, "f")); string(b) != "new" {
		t.Fatalf("f = %q", b)
	}
	if fi, _ := os.Lstat(filepath.Join(target, "hard")); fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatal("hard link to a symlink should be a symlink")
	}
}

func TestTarBadStreams(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	full := buildTar(t, []tEntry{{name: "f", typ: tar.TypeReg, mode: 0o644, body: strings.Repeat("x", 4000)}}, false)
	for name, archive := range map[string][]byte{
		"garbage":   []byte(strings.Repeat("not a tar ", 100)),
		"truncated": full[:1500],
		"bad gzip":  {0x1f, 0x8b, 0x08, 0, 0, 0},
		"xz":        {0xfd, '7', 'z', 'X', 'Z', 0, 0, 0},
	} {
		if code, body := c.upload(filepath.Join(dir, name), archive); code != 400 {
			t.Errorf("%s: %d %s", name, code, body)
		}
	}
	// An empty body is an empty archive: the folder is created.
	if code, body := c.upload(filepath.Join(dir, "empty"), nil); code != 200 || !bytes.Contains(body, []byte(`"files":0`)) {
		t.Errorf("empty: %d %s", code, body)
	}
}

// TestLargeFile streams 50 MB through write and read and checks the process did not
// hold it in memory.
func TestLargeFile(t *testing.T) {
	const size = 50 << 20
	c := newClient(t)
	p := filepath.Join(t.TempDir(), "big.bin")
	src := func() io.Reader { return io.LimitReader(&pattern{}, size) }
	want := sha256.New()
	_, _ = io.Copy(want, src())

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	req, err := http.NewRequest(http.MethodPut, c.base+"/files?path="+url.QueryEscape(p), src())
	must(t, err)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	var st Stat
	must(t, json.NewDecoder(resp.Body).Decode(&st))
	resp.Body.Close()
	if resp.StatusCode != 201 || st.Size != size {
		t.Fatalf("write: %d %+v", resp.StatusCode, st)
	}
	resp, err = http.Get(c.base + "/files?path=" + url.QueryEscape(p))
	must(t, err)
	got := sha256.New()
	n, err := io.Copy(got, resp.Body)
	resp.Body.Close()
	must(t, err)
	runtime.ReadMemStats(&after)
	if n != size || resp.ContentLength != size || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatalf("read back %d bytes (Content-Length %d), hash match %v", n, resp.ContentLength,
			bytes.Equal(got.Sum(nil), want.Sum(nil)))
	}
	// Client and server share this process: everything they allocated is counted.
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d KB while moving %d MB both ways", alloc>>10, size>>20)
	if alloc > size/4 {
		t.Fatalf("allocated %d MB moving a %d MB file: it was buffered", alloc>>20, size>>20)
	}
}

// pattern is an endless, non-repeating-per-block byte source.
type pattern struct{ n uint64 }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		p.n++
		b[i] = byte(p.n*2654435761>>13) ^ byte(p.n)
	}
	return len(b), nil
}

// Folders are resolved once per upload and remembered; a symlink entry must still
// never let a later entry through it to outside the target, and a second upload
// over the same files replaces every one of them.
func TestTarRemembersFoldersSafely(t *testing.T) {
	c := newClient(t)
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	must(t, os.Mkdir(outside, 0o755))
	before := snapshot(t, outside)
	target := filepath.Join(base, "target")
	var entries []tEntry
	for i := 0; i < 300; i++ {
		name := filepath.Join("d"+strings.Repeat("x", i%3), "sub", "f"+strings.Repeat("y", i%7)+string(rune('a'+i%26)))
		entries = append(entries, tEntry{name: name, typ: tar.TypeReg, mode: 0o644, body: name})
	}
	entries = append(entries,
		tEntry{name: "link", typ: tar.TypeSymlink, link: "d/sub", mode: 0o777},
		tEntry{name: "link/through", typ: tar.TypeReg, mode: 0o644, body: "inside"},
	)
	for round := 0; round < 2; round++ {
		if code, body := c.upload(target, buildTar(t, entries, false)); code != 200 {
			t.Fatalf("round %d: %d %s", round, code, body)
		}
	}
	for _, e := range entries[:300] {
		if b, err := os.ReadFile(filepath.Join(target, e.name)); err != nil || string(b) != e.body {
			t.Fatalf("%s = %q, %v", e.name, b, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(target, "d", "sub", "through")); string(b) != "inside" {
		t.Fatalf("through the inside link: %q", b)
	}
	evil := buildTar(t, []tEntry{
		{name: "d/sub/again", typ: tar.TypeReg, mode: 0o644, body: "x"}, // d and d/sub remembered
		{name: "d/out", typ: tar.TypeSymlink, link: outside, mode: 0o777},
		{name: "d/out/evil", typ: tar.TypeReg, mode: 0o644, body: "evil"},
	}, false)
	if code, body := c.upload(target, evil); code != 400 {
		t.Fatalf("escape through a link: %d %s", code, body)
	}
	if after := snapshot(t, outside); after != before {
		t.Fatalf("outside changed:\n%s", after)
	}
}
