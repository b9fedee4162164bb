package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orchard-env/orchard/agent/internal/proc"
	"github.com/orchard-env/orchard/agent/internal/testutil"
)

const (
	testToken   = "s3cret-token"
	testVersion = "test-version"
)

// agentBin is the real binary, built once; the HTTP tests run it as a
// separate process so its reaper owns its children, as in a sandbox.
var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "orchard-agent-bin")
	if err != nil {
		panic(err)
	}
	agentBin = filepath.Join(dir, "orchard-agent")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version="+testVersion, "-o", agentBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the agent: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type testAgent struct {
	t      *testing.T
	cmd    *exec.Cmd
	dir    string
	sock   string
	spill  string
	client *http.Client
	exited chan struct{}
	state  *os.ProcessState
}

type agentOpts struct {
	args  []string // extra flags
	env   []string // extra environment
	entry []string // after --
	sock  string   // socket path, default a fresh one
}

// startAgent runs the binary on a fresh Unix socket and waits until it serves.
func startAgent(t *testing.T, o agentOpts) *testAgent {
	t.Helper()
	dir, err := os.MkdirTemp("", "oa") // short: Unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	a := &testAgent{t: t, dir: dir, sock: o.sock, spill: filepath.Join(dir, "spill"), exited: make(chan struct{})}
	if a.sock == "" {
		a.sock = filepath.Join(dir, "run", "agent.sock")
	}
	args := append([]string{"--socket", a.sock, "--spill-dir", a.spill}, o.args...)
	if len(o.entry) > 0 {
		args = append(append(args, "--"), o.entry...)
	}
	a.cmd = exec.Command(agentBin, args...)
	a.cmd.Dir = dir
	a.cmd.Env = append(append(os.Environ(), "ORCHARD_AGENT_TOKEN="+testToken), o.env...)
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = a.cmd.Wait()
		a.state = a.cmd.ProcessState
		close(a.exited)
	}()
	t.Cleanup(func() {
		a.stop()
		_ = logf.Close()
		_ = os.RemoveAll(dir)
	})
	a.client = unixClient(a.sock)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := a.client.Get("http://agent/health")
		if err == nil {
			resp.Body.Close()
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not serve: %v; log: %s", err, a.log())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func unixClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

func (a *testAgent) log() string {
	b, _ := os.ReadFile(filepath.Join(a.dir, "agent.log"))
	return string(b)
}

// stop sends SIGTERM and waits for the agent to exit.
func (a *testAgent) stop() {
	select {
	case <-a.exited:
		return
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exited
		a.t.Errorf("agent ignored SIGTERM")
	}
}

// do sends a request with the token; body may be nil, []byte or a value to
// encode as JSON. It returns the status and the raw body.
func (a *testAgent) do(method, path string, body any) (int, []byte) {
	a.t.Helper()
	return a.doAuth(method, path, body, "Bearer "+testToken)
}

func (a *testAgent) doAuth(method, path string, body any, auth string) (int, []byte) {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequest(method, "http://agent"+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, out
}

// call is do plus a status check and JSON decoding into out (if not nil).
func (a *testAgent) call(method, path string, body any, want int, out any) {
	a.t.Helper()
	status, raw := a.do(method, path, body)
	if status != want {
		a.t.Fatalf("%s %s: status %d, want %d: %s", method, path, status, want, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			a.t.Fatalf("%s %s: decoding %s: %v", method, path, raw, err)
		}
	}
}

// stream opens an NDJSON response and returns a line reader.
func (a *testAgent) stream(method, path string, body any) (*http.Response, *bufio.Scanner) {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		enc, _ := json.Marshal(body)
		rd = bytes.NewReader(enc)
	}
	req, _ := http.NewRequest(method, "http://agent"+path, rd)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := a.client.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { resp.Body.Close() })
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	return resp, sc
}

type event struct {
	Type     string  `json:"type"`
	Data     string  `json:"data"`
	Offset   int64   `json:"offset"`
	ExitCode int     `json:"exit_code"`
	TimedOut bool    `json:"timed_out"`
	Signal   *string `json:"signal"`
	Code     string  `json:"code"`
}

func nextEvent(t *testing.T, sc *bufio.Scanner) event {
	t.Helper()
	if !sc.Scan() {
		t.Fatalf("stream ended early: %v", sc.Err())
	}
	var ev event
	if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
		t.Fatalf("bad NDJSON line %q: %v", sc.Bytes(), err)
	}
	return ev
}

// eventually polls cond until it holds or the deadline passes.
var eventually = testutil.Eventually

// procGone is true when pid no longer exists, not even as a zombie.
func procGone(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return os.IsNotExist(err)
}

// parentOf reads the PPid line of /proc/pid/status.
func parentOf(t *testing.T, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "PPid:") {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "PPid:")))
			return n
		}
	}
	t.Fatalf("no PPid in /proc/%d/status", pid)
	return 0
}

func TestAuth(t *testing.T) {
	a := startAgent(t, agentOpts{})
	cases := []struct {
		name   string
		method string
		path   string
		auth   string
		body   any
		want   int
	}{
		{"health needs no token", "GET", "/health", "", nil, 200},
		{"health with a wrong token still works", "GET", "/health", "Bearer nope", nil, 200},
		{"exec without header", "POST", "/exec", "", map[string]any{"cmd": "true"}, 401},
		{"exec with wrong token", "POST", "/exec", "Bearer nope", map[string]any{"cmd": "true"}, 401},
		{"exec with token as prefix", "POST", "/exec", "Bearer " + testToken + "x", map[string]any{"cmd": "true"}, 401},
		{"exec with wrong scheme", "POST", "/exec", "Basic " + testToken, map[string]any{"cmd": "true"}, 401},
		{"exec with bare token", "POST", "/exec", testToken, map[string]any{"cmd": "true"}, 401},
		{"processes without header", "GET", "/processes", "", nil, 401},
		{"files without header", "GET", "/files/stat?path=/", "", nil, 401},
		{"proxy without header", "GET", "/proxy/80/", "", nil, 401},
		{"unknown route without header", "GET", "/nope", "", nil, 401},
		{"health by POST is not open", "POST", "/health", "", nil, 401},
		{"exec with token", "POST", "/exec", "Bearer " + testToken, map[string]any{"cmd": "true"}, 200},
		{"unknown route with token", "GET", "/nope", "Bearer " + testToken, nil, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := a.doAuth(c.method, c.path, c.body, c.auth)
			if status != c.want {
				t.Fatalf("status %d, want %d: %s", status, c.want, body)
			}
			if status == 401 {
				var e struct {
					Error struct{ Code string } `json:"error"`
				}
				if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != "unauthorized" {
					t.Fatalf("401 body %s", body)
				}
			}
		})
	}
}

func TestHealth(t *testing.T) {
	a := startAgent(t, agentOpts{})
	var h struct {
		Status  string  `json:"status"`
		Version string  `json:"version"`
		UptimeS float64 `json:"uptime_s"`
		PID     int     `json:"pid"`
	}
	a.call("GET", "/health", nil, 200, &h)
	if h.Status != "ok" || h.Version != testVersion || h.PID != a.cmd.Process.Pid || h.UptimeS <= 0 {
		t.Fatalf("health %+v", h)
	}
}

func TestTCPListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	startAgent(t, agentOpts{args: []string{"--listen", addr}})
	for _, c := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer " + testToken, 200}} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/processes", nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("auth %q: status %d, want %d", c.auth, resp.StatusCode, c.want)
		}
	}
}

func TestStartupRefusals(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		env  []string
		msg  string
	}{
		{"no token", []string{"--socket", sock}, nil, "no token"},
		{"empty token", []string{"--socket", sock}, []string{"ORCHARD_AGENT_TOKEN="}, "no token"},
		{"blank token file", []string{"--socket", sock, "--token-file", empty}, nil, "no token"},
		{"missing token file", []string{"--socket", sock, "--token-file", filepath.Join(dir, "nope")}, nil, "token file"},
		{"nothing to listen on", nil, []string{"ORCHARD_AGENT_TOKEN=x"}, "nothing to listen on"},
		{"bad max output", []string{"--socket", sock, "--max-output", "lots"}, []string{"ORCHARD_AGENT_TOKEN=x"}, "max-output"},
		{"unknown flag", []string{"--nope"}, []string{"ORCHARD_AGENT_TOKEN=x"}, "nope"},
		{"bad cpus", []string{"--socket", sock, "--cpus", "0"}, []string{"ORCHARD_AGENT_TOKEN=x"}, "--cpus"},
		{"cpus not a number", []string{"--socket", sock, "--cpus", "NaN"}, []string{"ORCHARD_AGENT_TOKEN=x"}, "--cpus"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(agentBin, c.args...)
			cmd.Env = append(proc.ScrubbedEnv(os.Environ()), c.env...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("want exit status 2, got %v: %s", err, out)
			}
			if !strings.Contains(string(out), c.msg) {
				t.Fatalf("message %q lacks %q", out, c.msg)
			}
		})
	}
}

// TestOwnDirClosed: --own-dir makes a world-writable folder (a fresh emptyDir) 0755 before
// the agent serves, and a path that is not a folder stops the start.
func TestOwnDirClosed(t *testing.T) {
	own := t.TempDir()
	if err := os.Chmod(own, 0o777); err != nil {
		t.Fatal(err)
	}
	startAgent(t, agentOpts{args: []string{"--own-dir", own}})
	st, err := os.Stat(own)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o755 {
		t.Fatalf("own folder mode %o, want 755", st.Mode().Perm())
	}
	file := filepath.Join(own, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(agentBin, "--socket", filepath.Join(own, "a.sock"), "--own-dir", file)
	cmd.Env = append(proc.ScrubbedEnv(os.Environ()), "ORCHARD_AGENT_TOKEN=x")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "not a folder") {
		t.Fatalf("want exit 1 for a file as own folder, got %v: %s", err, out)
	}
}

func TestCPUsSetMaxProcs(t *testing.T) {
	for _, c := range []struct {
		cpus string
		want int
	}{{"0.5", 1}, {"1", 1}, {"1.2", 2}, {"3", 3}} {
		cfg, err := loadConfig([]string{"--socket", "s", "--cpus", c.cpus}, func(k string) string {
			if k == "ORCHARD_AGENT_TOKEN" {
				return "x"
			}
			return ""
		})
		if err != nil || cfg.maxProcs != c.want {
			t.Fatalf("--cpus %s: got %v, %v; want %d", c.cpus, cfg, err, c.want)
		}
	}
}

func TestTokenFileAndEnvScrub(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, agentOpts{
		args: []string{"--token-file", tokenFile},
		env:  []string{"ORCHARD_AGENT_EXTRA=also-secret", "KEEP_ME=1"},
	})
	if status, _ := a.do("POST", "/exec", map[string]any{"cmd": "true"}); status != 401 {
		t.Fatalf("the env token must not work when a token file is given: %d", status)
	}
	status, body := a.doAuth("POST", "/exec", map[string]any{"cmd": []string{"env"}}, "Bearer from-file")
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	var res execResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Stdout, "ORCHARD_AGENT_") || strings.Contains(res.Stdout, testToken) {
		t.Fatalf("agent settings leaked into the child env:\n%s", res.Stdout)
	}
	if !strings.Contains(res.Stdout, "KEEP_ME=1") {
		t.Fatalf("ordinary variables must pass through:\n%s", res.Stdout)
	}
}

func TestSocketIsReplacedAndRemoved(t *testing.T) {
	a := startAgent(t, agentOpts{})
	// A second agent on the same path replaces the stale socket.
	b := startAgent(t, agentOpts{sock: a.sock})
	eventually(t, "second agent serving", func() bool {
		var h struct{ PID int }
		b.client.CloseIdleConnections() // a pooled connection still reaches the first agent
		b.call("GET", "/health", nil, 200, &h)
		return h.PID == b.cmd.Process.Pid
	})
	b.stop()
	if _, err := os.Stat(a.sock); !os.IsNotExist(err) {
		t.Fatalf("socket not removed on exit: %v %v %s", err, b.state, b.log())
	}
}

func TestReadyQuickly(t *testing.T) {
	start := time.Now()
	a := startAgent(t, agentOpts{})
	t.Logf("ready %v after start (includes fork/exec of the binary)", time.Since(start))
	a.call("GET", "/health", nil, 200, nil)
}

func TestSIGTERMStopsChildrenAndExits(t *testing.T) {
	a := startAgent(t, agentOpts{})
	var info procInfo
	a.call("POST", "/processes", map[string]any{"cmd": []string{"sleep", "100"}}, 201, &info)
	var trapped procInfo
	a.call("POST", "/processes", map[string]any{
		"cmd": "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
	}, 201, &trapped)
	eventually(t, "trap installed", func() bool {
		var out outputResult
		a.call("GET", "/processes/"+trapped.ID+"/output", nil, 200, &out)
		return strings.Contains(out.Data, "ready")
	})
	start := time.Now()
	a.stop()
	if !a.state.Success() {
		t.Fatalf("agent exit: %v; log: %s", a.state, a.log())
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("shutdown took %v, children should stop at once", d)
	}
	eventually(t, "children gone", func() bool { return procGone(info.PID) && procGone(trapped.PID) })
}

// POST /retire kills every process and leaves the agent up, answering /health only.
func TestRetireKillsEverythingAndRefusesAfter(t *testing.T) {
	a := startAgent(t, agentOpts{entry: []string{"sleep", "100"}})
	var info procInfo
	a.call("POST", "/processes", map[string]any{"cmd": []string{"sleep", "100"}}, 201, &info)
	a.call("POST", "/retire", nil, 204, nil)
	eventually(t, "children gone", func() bool { return procGone(info.PID) })
	for _, path := range []string{"/exec", "/processes"} {
		if code, body := a.do("POST", path, map[string]any{"cmd": "true"}); code != 410 {
			t.Fatalf("%s after retire: %d %s", path, code, body)
		}
	}
	if code, _ := a.do("GET", "/health", nil); code != 200 {
		t.Fatalf("health after retire: %d", code)
	}
	a.call("POST", "/retire", nil, 204, nil) // again: nothing left, still fine
	select {
	case <-a.exited:
		t.Fatalf("the agent exited on retire: %s", a.log())
	default:
	}
}

func TestEntrypointSupervised(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	a := startAgent(t, agentOpts{entry: []string{"sh", "-c",
		`echo "pid=$$ token=[$ORCHARD_AGENT_TOKEN]" > ` + out + `.tmp && mv ` + out + `.tmp ` + out + `; exec sleep 100`}})
	var text string
	eventually(t, "entrypoint ran", func() bool {
		b, err := os.ReadFile(out)
		text = string(b)
		return err == nil
	})
	if !strings.Contains(text, "token=[]") {
		t.Fatalf("token visible to the entrypoint: %s", text)
	}
	var pid int
	if _, err := fmt.Sscanf(text, "pid=%d", &pid); err != nil {
		t.Fatal(err)
	}
	if parentOf(t, pid) != a.cmd.Process.Pid {
		t.Fatalf("entrypoint is not the agent's child")
	}
	a.stop()
	if !a.state.Success() {
		t.Fatalf("agent exit: %v", a.state)
	}
	eventually(t, "entrypoint stopped", func() bool { return procGone(pid) })
}

func TestReapsOrphanedZombies(t *testing.T) {
	a := startAgent(t, agentOpts{})
	var res execResult
	// sh exits at once; its background sleep is orphaned onto the agent.
	a.call("POST", "/exec", map[string]any{"cmd": "sleep 0.5 >/dev/null 2>&1 & echo $!"}, 200, &res)
	pid, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil {
		t.Fatalf("stdout %q", res.Stdout)
	}
	if ppid := parentOf(t, pid); ppid != a.cmd.Process.Pid {
		t.Fatalf("orphan reparented to %d, not the agent %d", ppid, a.cmd.Process.Pid)
	}
	// Unreaped, it would stay a zombie under the agent forever.
	eventually(t, "orphan reaped", func() bool { return procGone(pid) })
}

// The image's USER (--user) applies to the entrypoint and to requests that name no user.
func TestDefaultUser(t *testing.T) {
	dir, err := os.MkdirTemp("", "du") // t.TempDir's parent is 0700: nobody could not write
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "entry-uid")
	a := startAgent(t, agentOpts{args: []string{"--user", "65534:65534"},
		entry: []string{"sh", "-c", "id -u > " + out + ".tmp && mv " + out + ".tmp " + out + "; exec sleep 100"}})
	eventually(t, "entrypoint ran", func() bool { _, err := os.Stat(out); return err == nil })
	if b, _ := os.ReadFile(out); strings.TrimSpace(string(b)) != "65534" {
		t.Fatalf("entrypoint uid %q, want 65534", b)
	}
	for _, tc := range []struct{ user, want string }{{"", "65534"}, {"0", "0"}} {
		var res struct {
			Stdout string `json:"stdout"`
		}
		a.call("POST", "/exec", map[string]any{"cmd": "id -u", "user": tc.user}, 200, &res)
		if strings.TrimSpace(res.Stdout) != tc.want {
			t.Errorf("user %q: uid %q, want %s", tc.user, res.Stdout, tc.want)
		}
	}
}
