package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	testPod = "0f6c2a4e-1b7d-4c1e-9a51-3d7e8f9a0b1c"
	testCtr = "4f1d6a9e0b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6"
)

// Plain folders standing in for cgroupfs: where each cgroup driver and QoS class puts a
// container, in the v1 freezer hierarchy and in the v2 tree.
func TestFindContainerLayouts(t *testing.T) {
	u := strings.ReplaceAll(testPod, "-", "_")
	cases := []struct {
		v2  bool
		dir string
	}{
		{false, "freezer/kubepods/pod" + testPod + "/" + testCtr},
		{false, "freezer/kubepods/burstable/pod" + testPod + "/" + testCtr},
		{false, "freezer/kubepods/besteffort/pod" + testPod + "/" + testCtr},
		{false, "freezer/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + u + ".slice/cri-containerd-" + testCtr + ".scope"},
		{true, "kubepods.slice/kubepods-pod" + u + ".slice/cri-containerd-" + testCtr + ".scope"},
		{true, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + u + ".slice/crio-" + testCtr + ".scope"},
		{true, "kubepods/burstable/pod" + testPod + "/" + testCtr},
	}
	for _, tc := range cases {
		t.Run(tc.dir, func(t *testing.T) {
			root := t.TempDir()
			if tc.v2 {
				if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.MkdirAll(filepath.Join(root, tc.dir), 0o755); err != nil {
				t.Fatal(err)
			}
			n := &node{cgroupRoot: root}
			c, err := n.findContainer(testPod, testCtr)
			if err != nil || c.dir != filepath.Join(root, tc.dir) || c.v2 != tc.v2 {
				t.Fatalf("found %+v, %v", c, err)
			}
			other := "1" + testCtr[1:]
			if _, err := n.findContainer(testPod, other); err == nil || err.(*apiError).status != http.StatusNotFound {
				t.Fatalf("another container: %v", err)
			}
		})
	}
}

func TestCheckIDs(t *testing.T) {
	cases := []struct {
		pod, ctr string
		ok       bool
	}{
		{testPod, testCtr, true},
		{"../../..", testCtr, false},
		{testPod, "../" + testCtr[3:], false},
		{strings.ToUpper(testPod), testCtr, false},
		{testPod, testCtr[:63], false},
		{testPod, "containerd://" + testCtr, false},
	}
	for _, tc := range cases {
		err := checkIDs(tc.pod, tc.ctr)
		if (err == nil) != tc.ok {
			t.Errorf("checkIDs(%q, %q) = %v", tc.pod, tc.ctr, err)
		}
	}
}
