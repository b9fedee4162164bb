// Package testutil holds helpers the agent's tests share across packages.
package testutil

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds or 10 s pass.
func Eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
