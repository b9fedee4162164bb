package main

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("not an error body: %s", body)
	}
	return e.Error.Code
}

func TestExec(t *testing.T) {
	a := startAgent(t, agentOpts{})
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "mytool"), []byte("#!/bin/sh\necho tool:$1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		req    map[string]any
		stdout string
		stderr string
		code   int
		signal string
	}{
		{"shell string", map[string]any{"cmd": "echo hello"}, "hello\n", "", 0, ""},
		{"shell features", map[string]any{"cmd": "for i in 1 2; do echo $i; done | tr 12 ab"}, "a\nb\n", "", 0, ""},
		{"argv list", map[string]any{"cmd": []string{"printf", "%s|", "a b", "c"}}, "a b|c|", "", 0, ""},
		{"argv is not shell-expanded", map[string]any{"cmd": []string{"echo", "$HOME", "*"}}, "$HOME *\n", "", 0, ""},
		{"stderr apart", map[string]any{"cmd": "echo out; echo err >&2"}, "out\n", "err\n", 0, ""},
		{"exit code", map[string]any{"cmd": "exit 7"}, "", "", 7, ""},
		{"killed by a signal", map[string]any{"cmd": "kill -TERM $$"}, "", "", 143, "TERM"},
		{"stdin text", map[string]any{"cmd": "cat", "stdin": "abc\ndef"}, "abc\ndef", "", 0, ""},
		{"stdin base64", map[string]any{"cmd": []string{"od", "-An", "-tx1"}, "stdin_b64": base64.StdEncoding.EncodeToString([]byte{0, 255})}, " 00 ff\n", "", 0, ""},
		{"no stdin reads EOF", map[string]any{"cmd": "cat; echo end"}, "end\n", "", 0, ""},
		{"cwd", map[string]any{"cmd": "pwd", "cwd": "/usr"}, "/usr\n", "", 0, ""},
		{"env added", map[string]any{"cmd": "echo $FOO-$HOME", "env": map[string]string{"FOO": "bar", "HOME": "/h"}}, "bar-/h\n", "", 0, ""},
		{"PATH from the request env", map[string]any{"cmd": []string{"mytool", "x"}, "env": map[string]string{"PATH": bin + ":/bin:/usr/bin"}}, "tool:x\n", "", 0, ""},
		{"user by name", map[string]any{"cmd": "id -u; id -g; echo $HOME", "user": "nobody"}, "65534\n65534\n/nonexistent\n", "", 0, ""},
		{"user by uid:gid", map[string]any{"cmd": "id -u; id -g", "user": "65534:65534"}, "65534\n65534\n", "", 0, ""},
		{"unknown uid is allowed", map[string]any{"cmd": "id -u; id -g", "user": "4321"}, "4321\n4321\n", "", 0, ""},
		{"children ignore no signals", map[string]any{"cmd": []string{"grep", "SigIgn", "/proc/self/status"}}, "SigIgn:\t0000000000000000\n", "", 0, ""},
		{"SIGPIPE ends a writer", map[string]any{"cmd": "yes | head -1"}, "y\n", "", 0, ""},
		{"invalid UTF-8 replaced", map[string]any{"cmd": `printf 'a\377b'`}, "a\uFFFDb", "", 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var res execResult
			a.call("POST", "/exec", c.req, 200, &res)
			if res.Stdout != c.stdout || res.Stderr != c.stderr || res.ExitCode != c.code {
				t.Fatalf("got stdout %q stderr %q exit %d; want %q %q %d", res.Stdout, res.Stderr, res.ExitCode, c.stdout, c.stderr, c.code)
			}
			sig := ""
			if res.Signal != nil {
				sig = *res.Signal
			}
			if sig != c.signal || res.TimedOut || res.Encoding != "text" || res.DurationS <= 0 {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	a := startAgent(t, agentOpts{})
	cases := []struct {
		name   string
		body   any
		status int
		code   string
	}{
		{"not JSON", []byte("{"), 400, "bad_request"},
		{"empty body", []byte(""), 400, "bad_request"},
		{"no cmd", map[string]any{}, 400, "bad_request"},
		{"blank cmd", map[string]any{"cmd": "  "}, 400, "bad_request"},
		{"empty argv", map[string]any{"cmd": []string{}}, 400, "bad_request"},
		{"cmd of wrong type", map[string]any{"cmd": 5}, 400, "bad_request"},
		{"both stdins", map[string]any{"cmd": "cat", "stdin": "a", "stdin_b64": "YQ=="}, 400, "bad_request"},
		{"bad base64 stdin", map[string]any{"cmd": "cat", "stdin_b64": "!!"}, 400, "bad_request"},
		{"bad encoding", map[string]any{"cmd": "true", "output_encoding": "hex"}, 400, "bad_request"},
		{"negative timeout", map[string]any{"cmd": "true", "timeout_s": -1}, 400, "bad_request"},
		{"unknown user", map[string]any{"cmd": "true", "user": "no-such-user"}, 400, "bad_request"},
		{"unknown group", map[string]any{"cmd": "true", "user": "nobody:no-such-group"}, 400, "bad_request"},
		{"bad env name", map[string]any{"cmd": "true", "env": map[string]string{"A=B": "c"}}, 400, "bad_request"},
		{"program not found", map[string]any{"cmd": []string{"no-such-program-xyz"}}, 422, "exec_failed"},
		{"path not found", map[string]any{"cmd": []string{"/no/such/program"}}, 422, "exec_failed"},
		{"missing cwd", map[string]any{"cmd": "true", "cwd": "/no/such/dir"}, 422, "exec_failed"},
		{"unknown field", map[string]any{"cmd": "true", "timeout": 5}, 400, "bad_request"},
		{"a process-only field", map[string]any{"cmd": "true", "pty": true}, 400, "bad_request"},
		{"wrong method", nil, 405, "method_not_allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			method := "POST"
			if c.body == nil {
				method = "GET"
			}
			for _, path := range []string{"/exec", "/exec/stream"} {
				status, body := a.do(method, path, c.body)
				if status != c.status || errorCode(t, body) != c.code {
					t.Fatalf("%s: status %d %s, want %d %s", path, status, body, c.status, c.code)
				}
			}
		})
	}
}

// TestExecWithoutShell runs the agent chrooted into a folder holding only
// itself, like a distroless image: a string cmd fails clearly, argv works.
func TestExecWithoutShell(t *testing.T) {
	root, err := os.MkdirTemp("", "oaroot")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	bin, err := os.ReadFile(agentBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "agent"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	a := &testAgent{t: t, dir: root, sock: filepath.Join(root, "a.sock"), exited: make(chan struct{})}
	a.cmd = exec.Command("/agent", "--socket", "/a.sock", "--spill-dir", "/spill")
	a.cmd.Env = []string{"ORCHARD_AGENT_TOKEN=" + testToken}
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	a.cmd.Dir = "/"
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("chroot needs root: %v", err)
	}
	go func() { _ = a.cmd.Wait(); a.state = a.cmd.ProcessState; close(a.exited) }()
	defer a.stop()
	a.client = unixClient(a.sock)
	eventually(t, "chrooted agent serving", func() bool {
		resp, err := a.client.Get("http://agent/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	status, body := a.do("POST", "/exec", map[string]any{"cmd": "echo hi"})
	if status != 422 || errorCode(t, body) != "no_shell" {
		t.Fatalf("string cmd without /bin/sh: %d %s", status, body)
	}
	// argv needs no shell: the agent binary itself is the only program.
	var res execResult
	a.call("POST", "/exec", map[string]any{"cmd": []string{"/agent", "--socket", "/x"}}, 200, &res)
	if res.ExitCode != 2 || !strings.Contains(res.Stderr, "no token") {
		t.Fatalf("argv run without a shell: %+v", res)
	}
}

func TestExecTimeoutKillsGrandchildren(t *testing.T) {
	a := startAgent(t, agentOpts{})
	for _, path := range []string{"/exec", "/exec/stream"} {
		t.Run(path, func(t *testing.T) {
			req := map[string]any{"cmd": "sleep 100 & echo $!; sleep 100", "timeout_s": 0.5}
			start := time.Now()
			var stdout string
			var res struct {
				ExitCode int
				TimedOut bool
				Signal   *string
			}
			if path == "/exec" {
				var r execResult
				a.call("POST", path, req, 200, &r)
				stdout, res.ExitCode, res.TimedOut, res.Signal = r.Stdout, r.ExitCode, r.TimedOut, r.Signal
			} else {
				_, sc := a.stream("POST", path, req)
				for ev := nextEvent(t, sc); ; ev = nextEvent(t, sc) {
					if ev.Type == "exit" {
						res.ExitCode, res.TimedOut, res.Signal = ev.ExitCode, ev.TimedOut, ev.Signal
						break
					}
					stdout += ev.Data
				}
			}
			if d := time.Since(start); d > 4*time.Second {
				t.Fatalf("timeout of 0.5 s took %v", d)
			}
			if res.ExitCode != 124 || !res.TimedOut || res.Signal == nil || *res.Signal != "KILL" {
				t.Fatalf("result %+v", res)
			}
			gc, err := strconv.Atoi(strings.TrimSpace(stdout))
			if err != nil {
				t.Fatalf("stdout %q", stdout)
			}
			eventually(t, "grandchild killed and reaped", func() bool { return procGone(gc) })
		})
	}
}

func TestExecDoesNotWaitForBackgroundedGrandchild(t *testing.T) {
	a := startAgent(t, agentOpts{})
	start := time.Now()
	var res execResult
	// The grandchild keeps stdout open for 3 s after sh has exited.
	a.call("POST", "/exec", map[string]any{"cmd": "sleep 3 & echo started"}, 200, &res)
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Fatalf("exec waited %v for a backgrounded grandchild", d)
	}
	if res.Stdout != "started\n" || res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
}

func TestExecLargeAndBinaryOutput(t *testing.T) {
	a := startAgent(t, agentOpts{})
	data := make([]byte, 3<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("whole under the cap", func(t *testing.T) {
		var res execResult
		a.call("POST", "/exec", map[string]any{"cmd": []string{"cat", file}, "output_encoding": "base64", "max_output_bytes": 4 << 20}, 200, &res)
		got, err := base64.StdEncoding.DecodeString(res.Stdout)
		if err != nil || !bytes.Equal(got, data) || res.StdoutTruncated || res.StdoutFile != nil || res.Encoding != "base64" {
			t.Fatalf("binary round trip failed (%d bytes, err %v, truncated %v)", len(got), err, res.StdoutTruncated)
		}
	})
	t.Run("capped with spill file", func(t *testing.T) {
		var res execResult
		limit := 64 << 10
		a.call("POST", "/exec", map[string]any{"cmd": []string{"cat", file}, "output_encoding": "base64", "max_output_bytes": limit}, 200, &res)
		got, err := base64.StdEncoding.DecodeString(res.Stdout)
		if err != nil || !res.StdoutTruncated || res.StdoutFile == nil {
			t.Fatalf("err %v result truncated=%v file=%v", err, res.StdoutTruncated, res.StdoutFile)
		}
		if !bytes.HasPrefix(got, data[:limit/2]) || !bytes.HasSuffix(got, data[len(data)-limit/2:]) {
			t.Fatal("capped output must keep the head and the tail")
		}
		marker := "[orchard: " + strconv.Itoa(len(data)-limit) + " bytes omitted; full output in " + *res.StdoutFile + "]"
		if !bytes.Contains(got, []byte(marker)) {
			t.Fatalf("marker %q missing", marker)
		}
		full, err := os.ReadFile(*res.StdoutFile)
		if err != nil || !bytes.Equal(full, data) {
			t.Fatalf("spill file must hold the full output (%d of %d bytes, %v)", len(full), len(data), err)
		}
		if !strings.HasPrefix(*res.StdoutFile, a.spill+"/") {
			t.Fatalf("spill file %s outside --spill-dir", *res.StdoutFile)
		}
	})
	t.Run("stderr capped in text", func(t *testing.T) {
		var res execResult
		a.call("POST", "/exec", map[string]any{"cmd": "seq 1 200000 >&2; echo small", "max_output_bytes": 1024}, 200, &res)
		want, _ := exec.Command("seq", "1", "200000").Output()
		full, err := os.ReadFile(*res.StderrFile)
		if err != nil || !bytes.Equal(full, want) || !res.StderrTruncated || res.StdoutTruncated || res.Stdout != "small\n" {
			t.Fatalf("stderr spill: %v, %d bytes; %+v", err, len(full), res)
		}
		if !strings.HasPrefix(res.Stderr, "1\n2\n3\n") || !strings.HasSuffix(res.Stderr, "199999\n200000\n") {
			t.Fatalf("head/tail wrong: %q", res.Stderr)
		}
	})
}

func TestMaxOutputFlag(t *testing.T) {
	a := startAgent(t, agentOpts{args: []string{"--max-output", "4096"}})
	var res execResult
	a.call("POST", "/exec", map[string]any{"cmd": "seq 1 10000"}, 200, &res)
	if !res.StdoutTruncated || len(res.Stdout) > 4096+200 {
		t.Fatalf("flag cap not applied: truncated=%v len=%d", res.StdoutTruncated, len(res.Stdout))
	}
	a.call("POST", "/exec", map[string]any{"cmd": "seq 1 10000", "max_output_bytes": 1 << 20}, 200, &res)
	if res.StdoutTruncated {
		t.Fatal("per-request cap must override the flag")
	}
}

func TestExecStream(t *testing.T) {
	a := startAgent(t, agentOpts{})
	gate := filepath.Join(t.TempDir(), "gate")
	// The command blocks until the test has seen the first line, which
	// proves output is flushed as it happens, not at exit.
	resp, sc := a.stream("POST", "/exec/stream", map[string]any{
		"cmd": "echo first; while [ ! -e " + gate + " ]; do sleep 0.01; done; echo second; echo oops >&2; exit 3",
	})
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("content type %q", ct)
	}
	ev := nextEvent(t, sc)
	if ev.Type != "stdout" || ev.Data != "first\n" || ev.Offset != 0 {
		t.Fatalf("first event %+v", ev)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	streams := map[string]string{}
	offsets := map[string]int64{"stdout": 6}
	for ev = nextEvent(t, sc); ev.Type != "exit"; ev = nextEvent(t, sc) {
		if ev.Offset != offsets[ev.Type] {
			t.Fatalf("%s chunk at offset %d, want %d", ev.Type, ev.Offset, offsets[ev.Type])
		}
		offsets[ev.Type] += int64(len(ev.Data))
		streams[ev.Type] += ev.Data
	}
	if streams["stdout"] != "second\n" || streams["stderr"] != "oops\n" || ev.ExitCode != 3 || ev.TimedOut {
		t.Fatalf("streams %q exit %+v", streams, ev)
	}
	if sc.Scan() {
		t.Fatalf("line after exit: %s", sc.Text())
	}
}

func TestExecStreamBinaryAndUTF8(t *testing.T) {
	a := startAgent(t, agentOpts{})
	t.Run("base64 chunks reassemble", func(t *testing.T) {
		_, sc := a.stream("POST", "/exec/stream", map[string]any{"cmd": "head -c 300000 /dev/zero | tr '\\0' '\\377'", "output_encoding": "base64"})
		var got []byte
		for ev := nextEvent(t, sc); ev.Type != "exit"; ev = nextEvent(t, sc) {
			b, err := base64.StdEncoding.DecodeString(ev.Data)
			if err != nil || ev.Offset != int64(len(got)) {
				t.Fatalf("chunk at %d (have %d): %v", ev.Offset, len(got), err)
			}
			got = append(got, b...)
		}
		if !bytes.Equal(got, bytes.Repeat([]byte{0xff}, 300000)) {
			t.Fatalf("got %d bytes", len(got))
		}
	})
	t.Run("characters split across writes stay whole", func(t *testing.T) {
		// é is c3 a9: the two bytes arrive in separate writes.
		_, sc := a.stream("POST", "/exec/stream", map[string]any{"cmd": `printf 'a\303'; sleep 0.2; printf '\251b'`})
		var text string
		for ev := nextEvent(t, sc); ev.Type != "exit"; ev = nextEvent(t, sc) {
			text += ev.Data
		}
		if text != "aéb" {
			t.Fatalf("text %q", text)
		}
	})
}

func TestExecClientDisconnectKillsCommand(t *testing.T) {
	a := startAgent(t, agentOpts{})
	resp, sc := a.stream("POST", "/exec/stream", map[string]any{"cmd": "echo $$; exec sleep 100"})
	ev := nextEvent(t, sc)
	pid, err := strconv.Atoi(strings.TrimSpace(ev.Data))
	if err != nil {
		t.Fatalf("event %+v", ev)
	}
	resp.Body.Close()
	a.client.CloseIdleConnections()
	eventually(t, "command killed after the client left", func() bool { return procGone(pid) })
}

// Issue 17, hole 11: the spill folder is the agent's own (0700, files 0600), made at
// start; one a sandbox user linked elsewhere (as `ln -s /etc /tmp/orchard` did) is
// refused, and the output is reported as not saved rather than written through it.
func TestSpillFolderIsPrivateAndNeverFollowsLinks(t *testing.T) {
	a := startAgent(t, agentOpts{})
	if fi, err := os.Stat(a.spill); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("spill folder made at start with mode 0700: %v %v", fi, err)
	}
	var res execResult
	a.call("POST", "/exec", map[string]any{"cmd": "seq 1 3000", "max_output_bytes": 1024}, 200, &res)
	if fi, err := os.Lstat(*res.StdoutFile); err != nil || fi.Mode() != 0o600 {
		t.Fatalf("spill file %s: %v %v", *res.StdoutFile, fi, err)
	}

	dir := t.TempDir()
	target := filepath.Join(dir, "etc")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "orchard")); err != nil {
		t.Fatal(err)
	}
	for _, spill := range []string{filepath.Join(dir, "orchard"), filepath.Join(dir, "orchard", "spill")} {
		b := startAgent(t, agentOpts{args: []string{"--spill-dir", spill}})
		b.call("POST", "/exec", map[string]any{"cmd": "seq 1 3000", "max_output_bytes": 1024}, 200, &res)
		if !res.StdoutTruncated || res.StdoutFile != nil || !strings.Contains(res.Stdout, "full output not saved: spill folder") {
			t.Fatalf("%s: %+v", spill, res)
		}
		if names, _ := filepath.Glob(filepath.Join(target, "*")); len(names) != 0 {
			t.Fatalf("%s: written through the link: %v", spill, names)
		}
		if !strings.Contains(b.log(), "spill folder") {
			t.Fatalf("no warning at start: %s", b.log())
		}
	}
}
