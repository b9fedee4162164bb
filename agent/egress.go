package main

import (
	"fmt"
	"net"
	"time"
)

// egressWait bounds how long the agent waits for the sandbox's network policy.
const egressWait = 60 * time.Second

// waitClosed returns once a TCP connection to addr fails (refused, unreachable or timed
// out after dialTimeout), or an error if addr still answers after limit.
//
// On Kubernetes a pod's NetworkPolicy is programmed by the network plugin after the pod
// starts, so a sandbox's first instants could reach what its policy denies. The service
// names an address every policy of Orchard's denies (the API server), and the agent
// serves nothing and starts no entrypoint while that address answers.
func waitClosed(addr string, limit, dialTimeout time.Duration) error {
	deadline := time.Now().Add(limit)
	// 20 ms, doubling to 250 ms: a burst of pods must not flood the address while the
	// network plugin works through them (a policy often lands within the first tries).
	pause := 20 * time.Millisecond
	for {
		c, err := net.DialTimeout("tcp", addr, dialTimeout)
		if err != nil {
			return nil
		}
		c.Close()
		if time.Now().After(deadline) {
			return fmt.Errorf("the sandbox's network policy is not in force: %s still answers after %s (does the cluster enforce NetworkPolicy?)", addr, limit)
		}
		time.Sleep(pause)
		if pause *= 2; pause > 250*time.Millisecond {
			pause = 250 * time.Millisecond
		}
	}
}
