package main

import (
	"reflect"
	"testing"
)

const snaps = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots"

// A sandbox container's mountinfo as containerd and runc leave it (trimmed).
var sandboxMountinfo = []string{
	"1386 1283 0:140 / / rw,relatime master:412 - overlay overlay rw,lowerdir=" + snaps + "/3/fs:" + snaps + "/2/fs,upperdir=" + snaps + "/9/fs,workdir=" + snaps + "/9/work",
	"1387 1386 0:143 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw",
	"1388 1386 0:144 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755",
	"1395 1386 254:0 /var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/orchard-agent /.orchard rw,relatime - ext4 /dev/vda rw",
	"1396 1386 254:0 /var/lib/kubelet/pods/u/etc-hosts /etc/hosts rw,relatime - ext4 /dev/vda rw",
	"1397 1388 254:0 /var/lib/kubelet/pods/u/containers/sandbox/x /dev/termination-log rw,relatime - ext4 /dev/vda rw",
	"1398 1386 254:0 /some\\040dir /my\\040data rw,relatime shared:1 master:2 - ext4 /dev/vda rw",
}

func TestParseMountLine(t *testing.T) {
	cases := []struct {
		line   string
		point  string
		fstype string
		opts   map[string][]string
		bad    bool
	}{
		{line: sandboxMountinfo[1], point: "/proc", fstype: "proc", opts: map[string][]string{"rw": {""}}},
		{line: sandboxMountinfo[6], point: "/my data", fstype: "ext4", opts: map[string][]string{"rw": {""}}},
		{
			line:   "1 0 0:1 / / rw - overlay overlay rw,lowerdir+=/a\\054b,lowerdir+=/c,upperdir=/u",
			point:  "/",
			fstype: "overlay",
			opts:   map[string][]string{"rw": {""}, "lowerdir+": {"/a,b", "/c"}, "upperdir": {"/u"}},
		},
		{line: "1 0 0:1 / / rw", bad: true},
		{line: "", bad: true},
	}
	for _, tc := range cases {
		m, err := parseMountLine(tc.line)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: parsed, want an error", tc.line)
			}
			continue
		}
		if err != nil || m.point != tc.point || m.fstype != tc.fstype || !reflect.DeepEqual(m.options, tc.opts) {
			t.Errorf("%q: got %+v, %v", tc.line, m, err)
		}
	}
}

func TestSplitLower(t *testing.T) {
	cases := map[string][]string{
		"/a":          {"/a"},
		"/a:/b:/c":    {"/a", "/b", "/c"},
		`/a\:x:/b`:    {"/a:x", "/b"},
		"/a:/b::/dat": {"/a", "/b"},
		"3/fs:2/fs":   {"3/fs", "2/fs"},
	}
	for in, want := range cases {
		if got := splitLower(in); !reflect.DeepEqual(got, want) {
			t.Errorf("splitLower(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRootOverlay(t *testing.T) {
	var mounts []mount
	for _, l := range sandboxMountinfo {
		m, err := parseMountLine(l)
		if err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, m)
	}
	root, hidden, err := rootOverlay(mounts)
	if err != nil {
		t.Fatal(err)
	}
	if root.upper != snaps+"/9/fs" || !reflect.DeepEqual(root.lowers, []string{snaps + "/3/fs", snaps + "/2/fs"}) {
		t.Fatalf("root %+v", root)
	}
	for _, p := range []string{"/proc", "/dev", "/.orchard", "/etc", "/etc/hosts", "/dev/termination-log", "/my data"} {
		if !hidden[p] {
			t.Errorf("%s is not hidden", p)
		}
	}
	if hidden["/"] || hidden["/etc/passwd"] {
		t.Errorf("too much hidden: %v", hidden)
	}

	// containerd's short form for many layers: lowers relative to the snapshots folder.
	short, _ := parseMountLine("1 0 0:1 / / rw - overlay overlay rw,lowerdir=3/fs:2/fs,upperdir=" + snaps + "/9/fs,workdir=w")
	root, _, err = rootOverlay([]mount{short})
	if err != nil || !reflect.DeepEqual(root.lowers, []string{snaps + "/3/fs", snaps + "/2/fs"}) {
		t.Fatalf("short form: %+v %v", root, err)
	}

	// Not an overlay root (another snapshotter): a clear 501.
	plain, _ := parseMountLine("1 0 0:1 / / rw - ext4 /dev/vda rw")
	if _, _, err := rootOverlay([]mount{plain}); err == nil || err.(*apiError).status != 501 {
		t.Fatalf("ext4 root: %v", err)
	}
}
