package main

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard-env/orchard/agent/internal/proc"
)

func (a *testAgent) startProc(req map[string]any) procInfo {
	a.t.Helper()
	var info procInfo
	a.call("POST", "/processes", req, 201, &info)
	if info.Status != "running" || info.ExitCode != nil || !strings.HasPrefix(info.ID, "p-") || info.PID <= 0 {
		a.t.Fatalf("start: %+v", info)
	}
	return info
}

func (a *testAgent) output(id, query string) outputResult {
	a.t.Helper()
	var out outputResult
	a.call("GET", "/processes/"+id+"/output?"+query, nil, 200, &out)
	return out
}

func (a *testAgent) waitProc(id string, timeout float64) procInfo {
	a.t.Helper()
	var info procInfo
	a.call("GET", fmt.Sprintf("/processes/%s/wait?timeout_s=%g", id, timeout), nil, 200, &info)
	return info
}

// waitOutput polls until the stream holds want, returning everything read.
func (a *testAgent) waitOutput(id, want string) string {
	a.t.Helper()
	var text string
	eventually(a.t, fmt.Sprintf("output %q", want), func() bool {
		text = a.output(id, "limit=0").Data
		return strings.Contains(text, want)
	})
	return text
}

func TestProcessStdinAndResumableOutput(t *testing.T) {
	a := startAgent(t, agentOpts{})
	p := a.startProc(map[string]any{"cmd": "echo start; cat; echo done >&2", "tag": "cat", "stdin": "one "})
	a.call("POST", "/processes/"+p.ID+"/stdin", map[string]any{"data": "two\n"}, 204, nil)
	a.call("POST", "/processes/"+p.ID+"/stdin", map[string]any{"data": base64.StdEncoding.EncodeToString([]byte("three\n")), "encoding": "base64"}, 204, nil)
	a.waitOutput(p.ID, "three\n")

	// A client reads part, "disconnects", and resumes from next_offset.
	first := a.output(p.ID, "offset=0&limit=8")
	if first.Data != "start\non" || first.NextOffset != 8 || first.EOF {
		t.Fatalf("first read %+v", first)
	}
	rest := a.output(p.ID, fmt.Sprintf("offset=%d", first.NextOffset))
	if rest.Offset != 8 || rest.Data != "e two\nthree\n" || rest.EOF {
		t.Fatalf("resumed read %+v", rest)
	}
	if info := a.waitProc(p.ID, 0.2); info.Status != "running" || info.ExitCode != nil || !info.StdinOpen {
		t.Fatalf("cat must still run: %+v", info)
	}
	a.call("POST", "/processes/"+p.ID+"/stdin", map[string]any{"close": true}, 204, nil)
	info := a.waitProc(p.ID, 10)
	if info.Status != "exited" || info.ExitCode == nil || *info.ExitCode != 0 || info.EndedAt == nil || info.StdinOpen ||
		info.StdoutBytes != 20 || info.StderrBytes != 5 || info.Tag == nil || *info.Tag != "cat" {
		t.Fatalf("after close: %+v", info)
	}
	end := a.output(p.ID, fmt.Sprintf("offset=%d", rest.NextOffset))
	if end.Data != "" || !end.EOF || end.NextOffset != 20 {
		t.Fatalf("end read %+v", end)
	}
	if errOut := a.output(p.ID, "stream=stderr&encoding=base64"); errOut.Data != base64.StdEncoding.EncodeToString([]byte("done\n")) || !errOut.EOF {
		t.Fatalf("stderr %+v", errOut)
	}
	status, body := a.do("POST", "/processes/"+p.ID+"/stdin", map[string]any{"data": "late"})
	if status != 409 || errorCode(t, body) != "conflict" {
		t.Fatalf("stdin after exit: %d %s", status, body)
	}
}

func TestProcessRoutesErrors(t *testing.T) {
	a := startAgent(t, agentOpts{})
	p := a.startProc(map[string]any{"cmd": []string{"sleep", "100"}})
	defer a.do("DELETE", "/processes/"+p.ID, nil)
	cases := []struct {
		name, method, path string
		body               any
		status             int
		code               string
	}{
		{"unknown id", "GET", "/processes/p-nope", nil, 404, "not_found"},
		{"unknown action", "GET", "/processes/" + p.ID + "/nope", nil, 404, "not_found"},
		{"bad stream", "GET", "/processes/" + p.ID + "/output?stream=both", nil, 400, "bad_request"},
		{"offset past end", "GET", "/processes/" + p.ID + "/output?offset=99", nil, 400, "bad_request"},
		{"bad offset", "GET", "/processes/" + p.ID + "/output?offset=-1", nil, 400, "bad_request"},
		{"follow past end", "GET", "/processes/" + p.ID + "/follow?stderr_offset=5", nil, 400, "bad_request"},
		{"bad signal", "POST", "/processes/" + p.ID + "/signal", map[string]any{"signal": "NOPE"}, 400, "bad_request"},
		{"resize without pty", "POST", "/processes/" + p.ID + "/resize", map[string]any{"rows": 10, "cols": 10}, 409, "conflict"},
		{"bad wait timeout", "GET", "/processes/" + p.ID + "/wait?timeout_s=x", nil, 400, "bad_request"},
		{"wrong method", "POST", "/processes/" + p.ID + "/wait", nil, 405, "method_not_allowed"},
		{"start with unknown program", "POST", "/processes", map[string]any{"cmd": []string{"no-such-program-xyz"}}, 422, "exec_failed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := a.do(c.method, c.path, c.body)
			if status != c.status || errorCode(t, body) != c.code {
				t.Fatalf("status %d %s, want %d %s", status, body, c.status, c.code)
			}
		})
	}
}

func TestProcessFollow(t *testing.T) {
	a := startAgent(t, agentOpts{})
	gate := filepath.Join(t.TempDir(), "gate")
	p := a.startProc(map[string]any{"cmd": "echo one; echo e1 >&2; while [ ! -e " + gate + " ]; do sleep 0.01; done; echo two; exit 4"})
	a.waitOutput(p.ID, "one\n")
	_, sc := a.stream("GET", "/processes/"+p.ID+"/follow?stdout_offset=0&stderr_offset=0", nil)
	seen := map[string]string{}
	for !strings.Contains(seen["stdout"], "one\n") || !strings.Contains(seen["stderr"], "e1\n") {
		ev := nextEvent(t, sc)
		if ev.Offset != int64(len(seen[ev.Type])) {
			t.Fatalf("%s chunk at %d, have %d", ev.Type, ev.Offset, len(seen[ev.Type]))
		}
		seen[ev.Type] += ev.Data
	}
	// Live: the rest is produced only now.
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, sc)
	for ; ev.Type != "exit"; ev = nextEvent(t, sc) {
		seen[ev.Type] += ev.Data
	}
	if seen["stdout"] != "one\ntwo\n" || seen["stderr"] != "e1\n" || ev.ExitCode != 4 {
		t.Fatalf("follow saw %q, exit %+v", seen, ev)
	}
	// Resuming from offsets replays only what comes after them.
	_, sc = a.stream("GET", "/processes/"+p.ID+"/follow?stdout_offset=4&stderr_offset=3", nil)
	if ev := nextEvent(t, sc); ev.Type != "stdout" || ev.Data != "two\n" || ev.Offset != 4 {
		t.Fatalf("resumed follow %+v", ev)
	}
	if ev := nextEvent(t, sc); ev.Type != "exit" || ev.ExitCode != 4 {
		t.Fatalf("resumed follow end %+v", ev)
	}
}

func TestProcessSignals(t *testing.T) {
	a := startAgent(t, agentOpts{})
	cases := []struct {
		signal any
		group  *bool
		name   string
		code   int
	}{
		{"TERM", nil, "TERM", 143},
		{"SIGKILL", nil, "KILL", 137},
		{2, nil, "INT", 130},
		{"hup", new(bool), "HUP", 129},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.signal), func(t *testing.T) {
			p := a.startProc(map[string]any{"cmd": []string{"sleep", "100"}})
			body := map[string]any{"signal": c.signal}
			if c.group != nil {
				body["group"] = *c.group
			}
			a.call("POST", "/processes/"+p.ID+"/signal", body, 204, nil)
			info := a.waitProc(p.ID, 10)
			if info.Status != "exited" || info.ExitCode == nil || *info.ExitCode != c.code || info.Signal == nil || *info.Signal != c.name {
				t.Fatalf("after %v: %+v", c.signal, info)
			}
			status, _ := a.do("POST", "/processes/"+p.ID+"/signal", body)
			if status != 409 {
				t.Fatalf("signal to an exited process: %d", status)
			}
		})
	}
}

func TestProcessWaitTimeoutKeepsRunning(t *testing.T) {
	a := startAgent(t, agentOpts{})
	p := a.startProc(map[string]any{"cmd": []string{"sleep", "100"}})
	start := time.Now()
	info := a.waitProc(p.ID, 0.3)
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("wait returned after %v", d)
	}
	if info.Status != "running" || info.ExitCode != nil || info.EndedAt != nil || info.Signal != nil {
		t.Fatalf("a running process must not look finished: %+v", info)
	}
	var list struct{ Processes []procInfo }
	a.call("GET", "/processes", nil, 200, &list)
	if len(list.Processes) != 1 || list.Processes[0].ID != p.ID || list.Processes[0].Status != "running" {
		t.Fatalf("list %+v", list)
	}
	// DELETE kills it and forgets it.
	a.call("DELETE", "/processes/"+p.ID, nil, 204, nil)
	eventually(t, "deleted process killed", func() bool { return procGone(p.PID) })
	if status, _ := a.do("GET", "/processes/"+p.ID, nil); status != 404 {
		t.Fatalf("deleted process still known: %d", status)
	}
}

func TestProcessTimeout(t *testing.T) {
	a := startAgent(t, agentOpts{})
	p := a.startProc(map[string]any{"cmd": "sleep 100 & sleep 100", "timeout_s": 0.3})
	info := a.waitProc(p.ID, 10)
	if info.Status != "exited" || info.ExitCode == nil || *info.ExitCode != 124 || !info.TimedOut {
		t.Fatalf("timed-out process %+v", info)
	}
}

func TestProcessOutputSpillsToDisk(t *testing.T) {
	a := startAgent(t, agentOpts{})
	data := make([]byte, proc.OutputLimit+(1<<20)+123)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	p := a.startProc(map[string]any{"cmd": []string{"cat", file}})
	a.waitProc(p.ID, 10)
	var got []byte
	for off := int64(0); ; {
		out := a.output(p.ID, fmt.Sprintf("offset=%d&limit=%d&encoding=base64", off, 1<<20))
		b, err := base64.StdEncoding.DecodeString(out.Data)
		if err != nil || out.Offset != off || out.Dropped {
			t.Fatalf("read at %d: %v %+v", off, err, out.Offset)
		}
		got = append(got, b...)
		off = out.NextOffset
		if out.EOF {
			break
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d of %d bytes, or different", len(got), len(data))
	}
	spills, _ := filepath.Glob(filepath.Join(a.spill, "proc-*"))
	if len(spills) != 1 {
		t.Fatalf("spill files %v", spills)
	}
	a.call("DELETE", "/processes/"+p.ID, nil, 204, nil)
	if _, err := os.Stat(spills[0]); !os.IsNotExist(err) {
		t.Fatalf("spill file kept after delete: %v", err)
	}
}

func TestPTY(t *testing.T) {
	a := startAgent(t, agentOpts{})
	p := a.startProc(map[string]any{"cmd": "sh", "pty": true, "rows": 24, "cols": 80, "env": map[string]string{"PS1": "$ "}})
	if !p.PTY {
		t.Fatalf("info %+v", p)
	}
	send := func(s string) {
		a.call("POST", "/processes/"+p.ID+"/stdin", map[string]any{"data": s}, 204, nil)
	}
	send("echo hel''lo\n")
	text := a.waitOutput(p.ID, "hello\r\n")
	if !strings.Contains(text, "echo hel''lo") {
		t.Fatalf("the terminal must echo input: %q", text)
	}
	send("stty size\n")
	a.waitOutput(p.ID, "24 80\r\n")
	a.call("POST", "/processes/"+p.ID+"/resize", map[string]any{"rows": 40, "cols": 120}, 204, nil)
	send("stty size\n")
	a.waitOutput(p.ID, "40 120\r\n")
	send("tty; exit 3\n")
	info := a.waitProc(p.ID, 10)
	if info.ExitCode == nil || *info.ExitCode != 3 {
		t.Fatalf("exit %+v", info)
	}
	out := a.output(p.ID, "limit=0")
	if !strings.Contains(out.Data, "/dev/pts/") || !out.EOF {
		t.Fatalf("final output %+v", out)
	}
	if errOut := a.output(p.ID, "stream=stderr"); errOut.Data != "" || !errOut.EOF {
		t.Fatalf("a PTY has one stream: %+v", errOut)
	}
	if status, _ := a.do("POST", "/processes/"+p.ID+"/resize", map[string]any{"rows": 10, "cols": 10}); status != 409 {
		t.Fatalf("resize after exit: %d", status)
	}
}

func TestPTYCloseSendsEOF(t *testing.T) {
	a := startAgent(t, agentOpts{})
	p := a.startProc(map[string]any{"cmd": []string{"cat"}, "pty": true})
	a.call("POST", "/processes/"+p.ID+"/stdin", map[string]any{"data": "abc\n", "close": true}, 204, nil)
	info := a.waitProc(p.ID, 10)
	if info.ExitCode == nil || *info.ExitCode != 0 {
		sig := ""
		if info.Signal != nil {
			sig = *info.Signal
		}
		t.Fatalf("cat should end on ^D: %+v code %v sig %v", info, *info.ExitCode, sig)
	}
	// The terminal echoes the line, then cat prints it back.
	if out := a.output(p.ID, ""); out.Data != "abc\r\nabc\r\n" {
		t.Fatalf("output %q", out.Data)
	}
}

func TestProcessDeleteKillsWhatAnExitedLeaderLeftBehind(t *testing.T) {
	a := startAgent(t, agentOpts{})
	// The leader starts a background child in its own group, prints its pid and exits.
	p := a.startProc(map[string]any{"cmd": "sleep 100 & echo $!"})
	if info := a.waitProc(p.ID, 10); info.Status != "exited" {
		t.Fatalf("leader: %+v", info)
	}
	var child int
	if _, err := fmt.Sscan(a.output(p.ID, "limit=0").Data, &child); err != nil || child <= 0 {
		t.Fatalf("child pid: %v", err)
	}
	if procGone(child) {
		t.Fatalf("the background child %d should outlive its leader", child)
	}
	a.call("DELETE", "/processes/"+p.ID, nil, 204, nil)
	eventually(t, "the leftover child killed", func() bool { return procGone(child) })
}
