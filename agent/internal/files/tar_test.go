package files

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
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
			var res TarResult
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

// bombTar streams a gzip tar of files entries of size bytes each, all zeros, made as it
// is read: a 2 GiB entry compresses to about 2 MB, and only what the server reads is made.
func bombTar(files int, size int64) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		zw, _ := gzip.NewWriterLevel(pw, gzip.BestSpeed)
		tw := tar.NewWriter(zw)
		zeros := make([]byte, 1<<20)
		err := func() error {
			for i := 0; i < files; i++ {
				h := &tar.Header{Name: fmt.Sprintf("d/f%07d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size}
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
				for left := size; left > 0; {
					n := int64(len(zeros))
					if left < n {
						n = left
					}
					if _, err := tw.Write(zeros[:n]); err != nil {
						return err
					}
					left -= n
				}
			}
			if err := tw.Close(); err != nil {
				return err
			}
			return zw.Close()
		}()
		pw.CloseWithError(err)
	}()
	return pr
}

func (c *client) uploadStream(dir string, body io.Reader, query url.Values, header http.Header) (int, []byte) {
	c.t.Helper()
	q := url.Values{"path": {dir}}
	for k, v := range query {
		q[k] = v
	}
	req, err := http.NewRequest(http.MethodPut, c.base+"/files/tar?"+q.Encode(), body)
	must(c.t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	must(c.t, err)
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// written sums the sizes of the regular files under root.
func written(t *testing.T, root string) (files int, bytes int64) {
	t.Helper()
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			fi, _ := d.Info()
			files, bytes = files+1, bytes+fi.Size()
		}
		return nil
	})
	return files, bytes
}

// Issue 17, hole 8: what a tar upload writes is bounded (content bytes and entries),
// whatever its compressed size; past a limit extraction stops with 413
// upload_too_large and no partial file is left (earlier entries stay, as documented).
func TestTarUploadLimits(t *testing.T) {
	c := newClient(t)
	t.Run("a 2 GiB gzip bomb is refused at the default limit", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "x")
		start := time.Now()
		status, body := c.uploadStream(dir, bombTar(1, 2<<30), nil, nil)
		if status != 413 || errCode(t, body) != "upload_too_large" || !strings.Contains(string(body), "1073741824 bytes (max_bytes)") {
			t.Fatalf("%d %s", status, body)
		}
		if n, size := written(t, dir); n != 0 || size != 0 {
			t.Fatalf("wrote %d files, %d bytes", n, size)
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("took %v: the bomb was expanded", time.Since(start))
		}
	})
	cases := []struct {
		name      string
		files     int
		size      int64
		query     url.Values
		header    http.Header
		wantFiles int
		wantMsg   string
	}{
		{"many files past max_bytes", 100, 256 << 10, url.Values{"max_bytes": {"2621440"}}, nil, 10, "(max_bytes)"},
		{"the service's header sets the limit", 100, 256 << 10, nil, http.Header{"X-Orchard-Max-Bytes": {"1048576"}}, 4, "(max_bytes)"},
		{"the caller may lower, never raise it", 100, 256 << 10, url.Values{"max_bytes": {"1000000000"}},
			http.Header{"X-Orchard-Max-Bytes": {"524288"}}, 2, "(max_bytes)"},
		{"too many entries", 50, 0, url.Values{"max_entries": {"20"}}, nil, 20, "more than 20 entries (max_entries)"},
		{"entries from the header", 50, 0, nil, http.Header{"X-Orchard-Max-Entries": {"10"}}, 10, "(max_entries)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "x")
			status, body := c.uploadStream(dir, bombTar(tc.files, tc.size), tc.query, tc.header)
			if status != 413 || errCode(t, body) != "upload_too_large" || !strings.Contains(string(body), tc.wantMsg) {
				t.Fatalf("%d %s", status, body)
			}
			if n, size := written(t, dir); n != tc.wantFiles || size != int64(tc.wantFiles)*tc.size {
				t.Fatalf("wrote %d files, %d bytes; want %d whole files", n, size, tc.wantFiles)
			}
		})
	}
	t.Run("within the limits", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "x")
		status, body := c.uploadStream(dir, bombTar(10, 1000), url.Values{"max_bytes": {"10000"}, "max_entries": {"10"}}, nil)
		if status != 200 || string(body) != "{\"files\":10,\"bytes\":10000}\n" {
			t.Fatalf("%d %s", status, body)
		}
	})
	for _, bad := range []struct {
		query  url.Values
		header http.Header
	}{
		{url.Values{"max_bytes": {"-1"}}, nil}, {url.Values{"max_entries": {"lots"}}, nil},
		{nil, http.Header{"X-Orchard-Max-Bytes": {"1e9"}}},
	} {
		if status, body := c.uploadStream(t.TempDir(), bytes.NewReader(nil), bad.query, bad.header); status != 400 {
			t.Errorf("%v %v: %d %s", bad.query, bad.header, status, body)
		}
	}
}
