package main

import (
	"net"
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
