package files

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/orchard-env/orchard/agent/internal/api"
)

// client talks to a real agent file server built from Register.
type client struct {
	t    *testing.T
	base string
}

func newClient(t *testing.T) *client {
	t.Helper()
	mux := http.NewServeMux()
	Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &client{t: t, base: srv.URL}
}

// do sends a request and returns the status and body.
func (c *client) do(method, route string, query url.Values, body io.Reader) (int, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+route+"?"+query.Encode(), body)
	if err != nil {
		c.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, out
}

func (c *client) post(route string, v any) (int, []byte) {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.do(http.MethodPost, route, nil, bytes.NewReader(b))
}

func (c *client) write(p string, data []byte, extra ...string) (int, []byte) {
	c.t.Helper()
	q := url.Values{"path": {p}}
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	return c.do(http.MethodPut, "/files", q, bytes.NewReader(data))
}

func (c *client) read(p string, extra ...string) (int, []byte) {
	c.t.Helper()
	q := url.Values{"path": {p}}
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	return c.do(http.MethodGet, "/files", q, nil)
}

func (c *client) stat(p string) (int, Stat) {
	c.t.Helper()
	code, body := c.do(http.MethodGet, "/files/stat", url.Values{"path": {p}}, nil)
	var st Stat
	if code == http.StatusOK {
		mustJSON(c.t, body, &st)
	}
	return code, st
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("bad JSON %q: %v", b, err)
	}
}

// errCode extracts the stable error code from an error body.
func errCode(t *testing.T, b []byte) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string }
	}
	mustJSON(t, b, &e)
	return e.Error.Code
}

func binaryData(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/256)
	}
	return b
}

func TestWriteThenRead(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	cases := []struct {
		name string
		data []byte
	}{
		{"plain.txt", []byte("hello\n")},
		{"empty", nil},
		{"binary.bin", binaryData(70000)},
		{"with space and ünïcödé ✓.txt", []byte("unicode name")},
		{"new\nline", []byte("newline in the name")},
		{"deep/er/still/file", []byte("parents created")},
		{"-dash", []byte("leading dash")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			code, body := c.write(p, tc.data)
			if code != http.StatusCreated {
				t.Fatalf("write: %d %s", code, body)
			}
			var st Stat
			mustJSON(t, body, &st)
			if st.Path != p || st.Type != "file" || st.Size != int64(len(tc.data)) || st.Mode != 0o644 {
				t.Fatalf("stat after write: %+v", st)
			}
			code, got := c.read(p)
			if code != http.StatusOK || !bytes.Equal(got, tc.data) {
				t.Fatalf("read back: %d, %d bytes, want %d", code, len(got), len(tc.data))
			}
			onDisk, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(onDisk, tc.data) {
				t.Fatalf("on disk: %v", err)
			}
		})
	}
	// No temporary files are left beside the targets.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".orchard-") {
			t.Fatalf("temporary file left: %s", e.Name())
		}
	}
}

func TestReadRanges(t *testing.T) {
	c := newClient(t)
	p := filepath.Join(t.TempDir(), "r.bin")
	data := binaryData(1000)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		offset, length string
		code           int
		want           []byte
	}{
		{"", "", 200, data},
		{"0", "10", 200, data[:10]},
		{"990", "", 200, data[990:]},
		{"500", "100", 200, data[500:600]},
		{"900", "500", 200, data[900:]},
		{"1000", "", 200, []byte{}},
		{"5000", "10", 200, []byte{}},
		{"10", "0", 200, []byte{}},
		{"-1", "", 400, nil},
		{"", "x", 400, nil},
	}
	for _, tc := range cases {
		t.Run(tc.offset+"+"+tc.length, func(t *testing.T) {
			var extra []string
			if tc.offset != "" {
				extra = append(extra, "offset", tc.offset)
			}
			if tc.length != "" {
				extra = append(extra, "length", tc.length)
			}
			code, got := c.read(p, extra...)
			if code != tc.code {
				t.Fatalf("status %d, want %d (%s)", code, tc.code, got)
			}
			if tc.code == 200 && !bytes.Equal(got, tc.want) {
				t.Fatalf("got %d bytes, want %d", len(got), len(tc.want))
			}
		})
	}
	// Files whose size is unknown (procfs reports 0) are streamed to the end.
	code, got := c.read("/proc/self/status")
	if code != 200 || !bytes.Contains(got, []byte("Pid:")) {
		t.Fatalf("procfs read: %d %q", code, got)
	}
}

func TestWriteOptions(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "f")

	if code, body := c.write(p, []byte("one"), "mode", "0600"); code != 201 {
		t.Fatalf("write with mode: %d %s", code, body)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode())
	}
	// Overwriting without a mode keeps the file's mode.
	if code, _ := c.write(p, []byte("two")); code != 201 {
		t.Fatal("overwrite failed")
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("overwrite changed mode to %v", fi.Mode())
	}
	if code, body := c.write(p, []byte("three"), "overwrite", "false"); code != 409 || errCode(t, body) != "conflict" {
		t.Fatalf("overwrite=false on existing: %d %s", code, body)
	}
	if b, _ := os.ReadFile(p); string(b) != "two" {
		t.Fatalf("content after refused write: %q", b)
	}
	if code, _ := c.write(filepath.Join(dir, "fresh"), []byte("x"), "overwrite", "false"); code != 201 {
		t.Fatal("overwrite=false on a new path must succeed")
	}
	if code, _ := c.write(filepath.Join(dir, "suid"), []byte("x"), "mode", "4755"); code != 201 {
		t.Fatal("setuid write failed")
	}
	if _, st := c.stat(filepath.Join(dir, "suid")); st.Mode != 0o4755 {
		t.Fatalf("setuid mode: %o", st.Mode)
	}

	// Writing to a symlink writes the file it points at.
	if err := os.Symlink("f", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if code, _ := c.write(filepath.Join(dir, "link"), []byte("via link")); code != 201 {
		t.Fatal("write via symlink failed")
	}
	if b, _ := os.ReadFile(p); string(b) != "via link" {
		t.Fatalf("target content %q", b)
	}
	if fi, _ := os.Lstat(filepath.Join(dir, "link")); fi.Mode()&os.ModeSymlink == 0 {
		t.Fatal("symlink was replaced")
	}

	for _, tc := range []struct{ path, mode string }{
		{dir, ""},                            // a directory
		{filepath.Join(p, "child"), ""},      // parent is a file
		{filepath.Join(dir, "g"), "999"},     // not octal
		{filepath.Join(dir, "g"), "0o17777"}, // out of range
	} {
		var extra []string
		if tc.mode != "" {
			extra = []string{"mode", tc.mode}
		}
		code, body := c.write(tc.path, []byte("x"), extra...)
		want := 409
		if tc.mode != "" {
			want = 400
		}
		if code != want {
			t.Errorf("write %q mode %q: %d %s, want %d", tc.path, tc.mode, code, body, want)
		}
	}
}

func TestBadPaths(t *testing.T) {
	c := newClient(t)
	for _, p := range []string{"", "relative/path", "./x", "/tmp/a\x00b"} {
		for _, route := range []string{"/files", "/files/stat", "/files/list", "/files/tar"} {
			code, body := c.do(http.MethodGet, route, url.Values{"path": {p}}, nil)
			if code != 400 || errCode(t, body) != "bad_request" {
				t.Errorf("GET %s path=%q: %d %s", route, p, code, body)
			}
		}
		code, body := c.write(p, []byte("x"))
		if code != 400 {
			t.Errorf("PUT path=%q: %d %s", p, code, body)
		}
		for _, op := range []struct {
			route string
			body  any
		}{
			{"/files/mkdir", map[string]any{"path": p}},
			{"/files/remove", map[string]any{"path": p}},
			{"/files/move", map[string]any{"src": p, "dst": "/tmp/x"}},
			{"/files/move", map[string]any{"src": "/tmp/x", "dst": p}},
		} {
			if code, body := c.post(op.route, op.body); code != 400 {
				t.Errorf("POST %s %v: %d %s", op.route, op.body, code, body)
			}
		}
	}
	if code, body := c.do(http.MethodPost, "/files/mkdir", nil, strings.NewReader("{")); code != 400 {
		t.Errorf("bad JSON: %d %s", code, body)
	}
}

func TestErrorStatuses(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	cases := []struct {
		name   string
		method string
		route  string
		path   string
		code   int
		errc   string
	}{
		{"read missing", "GET", "/files", missing, 404, "not_found"},
		{"read under a file", "GET", "/files", file + "/x", 404, "not_found"},
		{"read a directory", "GET", "/files", dir, 400, "bad_request"},
		{"stat missing", "GET", "/files/stat", missing, 404, "not_found"},
		{"list missing", "GET", "/files/list", missing, 404, "not_found"},
		{"list a file", "GET", "/files/list", file, 400, "bad_request"},
		{"tar missing", "GET", "/files/tar", missing, 404, "not_found"},
		{"tar into a file", "PUT", "/files/tar", file, 409, "conflict"},
		{"wrong method", "DELETE", "/files", file, 405, "method_not_allowed"},
		{"wrong method stat", "POST", "/files/stat", file, 405, "method_not_allowed"},
		{"unknown route", "GET", "/files/nope", file, 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := c.do(tc.method, tc.route, url.Values{"path": {tc.path}}, strings.NewReader(""))
			if code != tc.code || errCode(t, body) != tc.errc {
				t.Fatalf("%d %s, want %d %s", code, body, tc.code, tc.errc)
			}
		})
	}
}

func TestPermissionDenied(t *testing.T) {
	c := newClient(t)
	// procfs refuses to unlink its files even for root: a real EPERM.
	code, body := c.post("/files/remove", map[string]any{"path": "/proc/version"})
	if code != 403 || errCode(t, body) != "forbidden" {
		t.Fatalf("remove /proc/version: %d %s", code, body)
	}
	if os.Geteuid() != 0 {
		p := filepath.Join(t.TempDir(), "secret")
		if err := os.WriteFile(p, []byte("x"), 0o000); err != nil {
			t.Fatal(err)
		}
		if code, body := c.read(p); code != 403 {
			t.Fatalf("read mode-000 file: %d %s", code, body)
		}
	}
	// The errno mapping as a table, for errors a root test cannot provoke.
	for errno, want := range map[syscall.Errno]int{
		syscall.EACCES: 403, syscall.EPERM: 403, syscall.EROFS: 403,
		syscall.ENOENT: 404, syscall.EEXIST: 409, syscall.ENOTEMPTY: 409,
		syscall.ENAMETOOLONG: 400, syscall.ENOSPC: 413,
	} {
		status := statusOf(fsError(&os.PathError{Op: "open", Path: "/x", Err: errno}))
		if status != want {
			t.Errorf("%v → %d, want %d", errno, status, want)
		}
	}
	if statusOf(createError(&os.PathError{Op: "mkdir", Path: "/x", Err: syscall.ENOTDIR})) != 409 {
		t.Error("ENOTDIR while creating must be 409")
	}
}

func statusOf(err error) int {
	rec := httptest.NewRecorder()
	api.WriteError(rec, err)
	return rec.Code
}

func TestStatAndList(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "b file"), []byte("12345"), 0o640))
	must(t, os.Mkdir(filepath.Join(dir, "a-dir"), 0o750))
	must(t, os.Symlink("b file", filepath.Join(dir, "c-link")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "d-fifo"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "Z\nnewline"), nil, 0o600))

	code, body := c.do("GET", "/files/list", url.Values{"path": {dir}}, nil)
	if code != 200 {
		t.Fatalf("list: %d %s", code, body)
	}
	var l Listing
	mustJSON(t, body, &l)
	var names []string
	for _, e := range l.Entries {
		names = append(names, e.Name)
	}
	want := []string{"Z\nnewline", "a-dir", "b file", "c-link", "d-fifo"}
	if l.Path != dir || fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("list names %q, want %q", names, want)
	}
	byName := map[string]Stat{}
	for _, e := range l.Entries {
		byName[e.Name] = e
	}
	checks := []struct {
		name, typ string
		size      int64
		mode      uint32
		link      string
	}{
		{"a-dir", "dir", -1, 0o750, ""},
		{"b file", "file", 5, 0o640, ""},
		{"c-link", "symlink", -1, 0o777, "b file"},
		{"d-fifo", "other", 0, 0o600, ""},
	}
	for _, ck := range checks {
		e := byName[ck.name]
		if e.Type != ck.typ || e.Mode != ck.mode || (ck.size >= 0 && e.Size != ck.size) ||
			e.Path != filepath.Join(dir, ck.name) || e.Mtime < 1e9 {
			t.Errorf("%s: %+v", ck.name, e)
		}
		if (ck.link == "") != (e.LinkTarget == nil) || (e.LinkTarget != nil && *e.LinkTarget != ck.link) {
			t.Errorf("%s link_target %v", ck.name, e.LinkTarget)
		}
		code, st := c.stat(filepath.Join(dir, ck.name))
		if code != 200 || fmt.Sprint(st.Path, st.Type, st.Size, st.Mode, st.Mtime) !=
			fmt.Sprint(e.Path, e.Type, e.Size, e.Mode, e.Mtime) {
			t.Errorf("stat %s: %d %+v, list said %+v", ck.name, code, st, e)
		}
	}
	// The raw JSON has the documented keys, link_target null for non-links.
	_, raw := c.do("GET", "/files/stat", url.Values{"path": {filepath.Join(dir, "b file")}}, nil)
	var m map[string]any
	mustJSON(t, raw, &m)
	for _, k := range []string{"path", "name", "type", "size", "mode", "mtime", "link_target"} {
		if _, ok := m[k]; !ok {
			t.Errorf("stat JSON lacks %q: %s", k, raw)
		}
	}
	if m["link_target"] != nil {
		t.Errorf("link_target should be null: %s", raw)
	}
	// Listing through a symlink to a folder lists the folder.
	link := filepath.Join(t.TempDir(), "l")
	must(t, os.Symlink(dir, link))
	code, body = c.do("GET", "/files/list", url.Values{"path": {link}}, nil)
	var viaLink Listing
	mustJSON(t, body, &viaLink)
	if code != 200 || len(viaLink.Entries) != len(want) || viaLink.Entries[1].Path != filepath.Join(link, "a-dir") {
		t.Fatalf("list via symlink: %d %s", code, body)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestMkdir(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	must(t, os.WriteFile(file, nil, 0o644))
	f := false
	cases := []struct {
		name    string
		req     map[string]any
		code    int
		mode    uint32
		errCode string
	}{
		{"nested with parents", map[string]any{"path": dir + "/a/b/c"}, 201, 0o755, ""},
		{"exists, parents", map[string]any{"path": dir + "/a/b/c"}, 200, 0o755, ""},
		{"exists, no parents", map[string]any{"path": dir + "/a/b/c", "parents": f}, 409, 0, "conflict"},
		{"exact mode despite umask", map[string]any{"path": dir + "/m", "mode": 0o777}, 201, 0o777, ""},
		{"sticky mode", map[string]any{"path": dir + "/s", "mode": 0o1777}, 201, 0o1777, ""},
		{"missing parent, no parents", map[string]any{"path": dir + "/x/y", "parents": f}, 404, 0, "not_found"},
		{"exists as a file", map[string]any{"path": file}, 409, 0, "conflict"},
		{"under a file", map[string]any{"path": file + "/sub"}, 409, 0, "conflict"},
		{"bad mode", map[string]any{"path": dir + "/bad", "mode": 0o17777}, 400, 0, "bad_request"},
		{"unicode name", map[string]any{"path": dir + "/dossier ✓"}, 201, 0o755, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := c.post("/files/mkdir", tc.req)
			if code != tc.code {
				t.Fatalf("%d %s, want %d", code, body, tc.code)
			}
			if tc.errCode != "" {
				if errCode(t, body) != tc.errCode {
					t.Fatalf("code %s", body)
				}
				return
			}
			var st Stat
			mustJSON(t, body, &st)
			if st.Type != "dir" || st.Mode != tc.mode {
				t.Fatalf("stat %+v, want mode %o", st, tc.mode)
			}
		})
	}
}

func TestRemove(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	outside := t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, "keep"), nil, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "f"), nil, 0o644))
	must(t, os.Mkdir(filepath.Join(dir, "empty"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "full/sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "full/sub/x"), nil, 0o644))
	must(t, os.Symlink(outside, filepath.Join(dir, "link")))
	cases := []struct {
		path      string
		recursive bool
		code      int
		gone      bool
	}{
		{"f", false, 204, true},
		{"f", false, 404, true},
		{"empty", false, 204, true},
		{"full", false, 409, false},
		{"full", true, 204, true},
		{"link", true, 204, true},
	}
	for _, tc := range cases {
		p := filepath.Join(dir, tc.path)
		code, body := c.post("/files/remove", map[string]any{"path": p, "recursive": tc.recursive})
		if code != tc.code {
			t.Fatalf("remove %s recursive=%v: %d %s, want %d", tc.path, tc.recursive, code, body, tc.code)
		}
		if _, err := os.Lstat(p); os.IsNotExist(err) != tc.gone {
			t.Fatalf("remove %s: gone=%v", tc.path, !tc.gone)
		}
	}
	// Removing a symlink to a folder removes the link, not the folder's contents.
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatal("removing a symlink touched its target")
	}
	if code, _ := c.post("/files/remove", map[string]any{"path": "/", "recursive": true}); code != 400 {
		t.Fatal("removing / must be refused")
	}
}

func TestMove(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	put := func(name, content string) {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	put("a", "A")
	put("b", "B")
	put("tree/x", "X")
	put("other/y", "Y")
	cases := []struct {
		name      string
		src, dst  string
		overwrite bool
		code      int
	}{
		{"rename file", "a", "a2", false, 200},
		{"into new parents", "a2", "new/deep/a3", false, 200},
		{"dst exists", "b", "new/deep/a3", false, 409},
		{"dst exists, overwrite", "b", "new/deep/a3", true, 200},
		{"missing src", "nope", "z", false, 404},
		{"folder", "tree", "tree2", false, 200},
		{"folder into itself", "tree2", "tree2/inner", false, 400},
		{"folder over non-empty folder", "tree2", "other", true, 409},
		{"file over folder", "new/deep/a3", "other", true, 409},
		{"to unicode name", "tree2", "arbre ✓", false, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := c.post("/files/move", map[string]any{
				"src": filepath.Join(dir, tc.src), "dst": filepath.Join(dir, tc.dst), "overwrite": tc.overwrite,
			})
			if code != tc.code {
				t.Fatalf("%d %s, want %d", code, body, tc.code)
			}
			if code == 200 {
				var st Stat
				mustJSON(t, body, &st)
				if st.Path != filepath.Join(dir, tc.dst) {
					t.Fatalf("stat path %s", st.Path)
				}
				if _, err := os.Lstat(filepath.Join(dir, tc.src)); !os.IsNotExist(err) {
					t.Fatal("src still exists")
				}
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "new/deep/a3")); string(b) != "B" {
		t.Fatalf("overwritten content %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "arbre ✓/x")); string(b) != "X" {
		t.Fatalf("moved folder content %q", b)
	}
}

// TestMoveAcross exercises the copy used when rename(2) says EXDEV.
func TestMoveAcross(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	dst := filepath.Join(t.TempDir(), "dst")
	must(t, os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "sub/exe"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "data"), binaryData(100000), 0o600))
	must(t, os.Symlink("sub/exe", filepath.Join(src, "link")))
	must(t, os.Chmod(filepath.Join(src, "sub"), 0o500))
	sdir, sname, err := parentOf(src, false)
	must(t, err)
	defer sdir.close()
	ddir, dname, err := parentOf(dst, false)
	must(t, err)
	defer ddir.close()
	if err := moveAcross(sdir, sname, ddir, dname); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(src); !os.IsNotExist(err) {
		t.Fatal("src still exists")
	}
	checks := map[string]os.FileMode{"sub": os.ModeDir | 0o500, "sub/exe": 0o755, "data": 0o600, "link": os.ModeSymlink | 0o777}
	for name, mode := range checks {
		fi, err := os.Lstat(filepath.Join(dst, name))
		if err != nil || fi.Mode() != mode {
			t.Errorf("%s: %v %v, want %v", name, err, fi.Mode(), mode)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "data")); !bytes.Equal(b, binaryData(100000)) {
		t.Error("data differs")
	}
	if l, _ := os.Readlink(filepath.Join(dst, "link")); l != "sub/exe" {
		t.Errorf("link target %q", l)
	}
	must(t, os.Chmod(filepath.Join(dst, "sub"), 0o755))
}
