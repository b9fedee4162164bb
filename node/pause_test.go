package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var testKey = []byte("a test key of at least 16 bytes")

// call sends one request to the helper's routes with this node's token.
func call(t *testing.T, n *node, method, path string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	req.Header.Set("Authorization", "Bearer "+nodeToken(testKey, n.name))
	rec := httptest.NewRecorder()
	n.routes().ServeHTTP(rec, req)
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s %s: not JSON: %q", method, path, rec.Body)
	}
	return rec.Code, body
}

func route(op string) string {
	return "/v1/pods/" + testPod + "/containers/" + testCtr + "/" + op
}

// cpuTicks is the process's user+system time so far (clock ticks).
func cpuTicks(t *testing.T, pid int) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(raw)[strings.LastIndexByte(string(raw), ')')+2:])
	user, _ := strconv.Atoi(fields[11])
	sys, _ := strconv.Atoi(fields[12])
	return user + sys
}

// A real busy loop in a real cgroup (v1 freezer, and the v2 tree where this host has
// one) laid out as the kubelet does: pause stops its CPU, resume lets it go on.
func TestPauseAndResumeARealProcess(t *testing.T) {
	roots := []struct {
		name, root, base string
	}{
		{"v1 freezer", "/sys/fs/cgroup", "/sys/fs/cgroup/freezer"},
		{"v2", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified"},
		{"v2 unified host", "/sys/fs/cgroup", "/sys/fs/cgroup"},
	}
	ran := 0
	for _, r := range roots {
		t.Run(r.name, func(t *testing.T) {
			_, errV2 := os.Stat(filepath.Join(r.root, "cgroup.controllers"))
			if (r.base == r.root) != (errV2 == nil) {
				t.Skipf("%s is not this kind of hierarchy", r.root)
			}
			parent := fmt.Sprintf("orchard-node-test-%d", os.Getpid())
			dir := filepath.Join(r.base, parent, "kubepods", "burstable", "pod"+testPod, testCtr)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Skipf("cannot make a cgroup here (needs root): %v", err)
			}
			defer func() {
				for d := dir; d != r.base; d = filepath.Dir(d) {
					_ = os.Remove(d)
				}
			}()
			busy := exec.Command("sh", "-c", "while :; do :; done")
			if err := busy.Start(); err != nil {
				t.Fatal(err)
			}
			n := &node{name: "node-a", token: nodeToken(testKey, "node-a"), cgroupRoot: r.root,
				cgroupParent: parent, freezeTimeout: 5 * time.Second}
			defer func() {
				_ = thaw(container{dir: dir, v2: r.base == r.root}, time.Second)
				_ = busy.Process.Kill()
				_ = busy.Wait()
				time.Sleep(50 * time.Millisecond) // the cgroup empties once it is reaped
			}()
			pid := busy.Process.Pid
			if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)

			code, body := call(t, n, "POST", route("pause"))
			if code != 200 || body["frozen"] != true {
				t.Fatalf("pause: %d %v", code, body)
			}
			t.Logf("pause took %v ms", body["took_ms"])
			before := cpuTicks(t, pid)
			time.Sleep(300 * time.Millisecond)
			if after := cpuTicks(t, pid); after != before {
				t.Fatalf("a paused process ran: %d -> %d ticks", before, after)
			}
			if code, body := call(t, n, "GET", route("state")); code != 200 || body["frozen"] != true {
				t.Fatalf("state: %d %v", code, body)
			}
			// Pausing again is no error (the service may retry).
			if code, _ := call(t, n, "POST", route("pause")); code != 200 {
				t.Fatalf("second pause: %d", code)
			}
			code, body = call(t, n, "POST", route("resume"))
			if code != 200 || body["frozen"] != false {
				t.Fatalf("resume: %d %v", code, body)
			}
			before = cpuTicks(t, pid)
			time.Sleep(300 * time.Millisecond)
			if after := cpuTicks(t, pid); after <= before {
				t.Fatalf("a resumed process did not run: %d -> %d ticks", before, after)
			}
			ran++
		})
	}
	if ran == 0 {
		t.Skip("no cgroup hierarchy this test can use")
	}
}

func TestPauseErrors(t *testing.T) {
	n := &node{name: "node-a", token: nodeToken(testKey, "node-a"), cgroupRoot: t.TempDir(),
		freezeTimeout: time.Second}
	cases := []struct {
		method, path string
		status       int
		code         string
	}{
		{"POST", route("pause"), 404, "container_not_found"},
		{"POST", route("resume"), 404, "container_not_found"},
		{"GET", route("diff"), 404, "container_not_found"},
		{"POST", "/v1/pods/x/containers/" + testCtr + "/pause", 400, "invalid_request"},
		{"POST", "/v1/pods/" + testPod + "/containers/abc/pause", 400, "invalid_request"},
	}
	for _, tc := range cases {
		code, body := call(t, n, tc.method, tc.path)
		if code != tc.status || body["code"] != tc.code {
			t.Errorf("%s %s: %d %v", tc.method, tc.path, code, body)
		}
	}
	// No route answers without the token, not even one that does not exist.
	for _, p := range []string{route("pause"), "/", "/healthz"} {
		rec := httptest.NewRecorder()
		n.routes().ServeHTTP(rec, httptest.NewRequest("POST", p, nil))
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("%s without a token: %d", p, rec.Code)
		}
	}
}
