package main

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// answering is a local address that accepts and closes connections, as a reachable API
// server would, until the returned listener is closed.
func answering(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l
}

func TestWaitClosedReturnsOnceTheAddressStopsAnswering(t *testing.T) {
	l := answering(t)
	time.AfterFunc(300*time.Millisecond, func() { l.Close() })
	start := time.Now()
	if err := waitClosed(l.Addr().String(), 10*time.Second, time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 250*time.Millisecond || took > 5*time.Second {
		t.Fatalf("returned after %s: want once the listener closed (300 ms)", took)
	}
}

func TestWaitClosedGivesUpOnAnAddressThatStaysOpen(t *testing.T) {
	err := waitClosed(answering(t).Addr().String(), 200*time.Millisecond, time.Second)
	if err == nil || !strings.Contains(err.Error(), "not in force") {
		t.Fatalf("err = %v, want the policy reported not in force", err)
	}
}

func TestWaitClosedPassesAClosedAddressAtOnce(t *testing.T) {
	l := answering(t)
	addr := l.Addr().String()
	l.Close()
	start := time.Now()
	if err := waitClosed(addr, time.Second, time.Second); err != nil || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("err = %v after %s", err, time.Since(start))
	}
}

// A /health sent while the agent waits for the policy is held, not refused, and answered
// once the address closes (the service sends one request per start instead of polling);
// the entrypoint starts only then.
func TestHealthDuringTheWaitIsAnsweredOnceThePolicyHolds(t *testing.T) {
	l := answering(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	marker := filepath.Join(dir, "started")
	cmd := exec.Command(agentBin, "--socket", sock, "--spill-dir", filepath.Join(dir, "spill"),
		"--wait-closed", l.Addr().String(), "--", "sh", "-c", "touch "+marker+"; exec sleep 60")
	cmd.Env = append(os.Environ(), "ORCHARD_AGENT_TOKEN="+testToken)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(5 * time.Second)
	for { // the socket appears before the wait ends
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent never listened")
		}
		time.Sleep(5 * time.Millisecond)
	}
	closeAt := time.Now().Add(400 * time.Millisecond)
	time.AfterFunc(time.Until(closeAt), func() { l.Close() })
	resp, err := unixClient(sock).Get("http://agent/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || time.Now().Before(closeAt) {
		t.Fatalf("health %d before the address closed", resp.StatusCode)
	}
	if _, err := os.Stat(marker); err != nil && time.Since(closeAt) < 2*time.Second {
		time.Sleep(500 * time.Millisecond) // the entrypoint is started right after
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("the entrypoint did not start once the policy held")
	}
}

// Before the address closes, the entrypoint has not run.
func TestNoEntrypointWhileTheAddressAnswers(t *testing.T) {
	l := answering(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "started")
	cmd := exec.Command(agentBin, "--socket", filepath.Join(dir, "a.sock"), "--spill-dir",
		filepath.Join(dir, "spill"), "--wait-closed", l.Addr().String(), "--", "touch", marker)
	cmd.Env = append(os.Environ(), "ORCHARD_AGENT_TOKEN="+testToken)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	time.Sleep(500 * time.Millisecond)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the entrypoint ran while the address still answered")
	}
}
