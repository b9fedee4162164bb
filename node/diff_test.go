package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// layer builds a directory the way overlayfs and containerd's snapshotter leave one:
// "d /x" a directory, "f /x" a file, "l /x" a symlink, "w /x" a whiteout (a 0:0
// character device), "o /x" an opaque directory (trusted.overlay.opaque=y).
func layer(t *testing.T, entries ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, e := range entries {
		kind, p, _ := strings.Cut(e, " ")
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch kind {
		case "d":
			err = os.Mkdir(full, 0o755)
		case "f":
			err = os.WriteFile(full, []byte(p), 0o644)
		case "l":
			err = os.Symlink("/elsewhere", full)
		case "w":
			err = syscall.Mknod(full, syscall.S_IFCHR, 0)
		case "o":
			if err = os.Mkdir(full, 0o755); err == nil {
				err = syscall.Setxattr(full, "trusted.overlay.opaque", []byte("y"), 0)
			}
		default:
			t.Fatalf("unknown entry %q", e)
		}
		if err != nil {
			t.Skipf("cannot make %q here (needs root for whiteouts and opaque dirs): %v", e, err)
		}
	}
	return root
}

func TestDiffUpper(t *testing.T) {
	image := []string{"d /etc", "f /etc/passwd", "f /etc/group", "d /opt", "f /opt/a", "f /opt/b",
		"d /opt/sub", "f /opt/sub/x", "f /data", "l /link", "d /usr", "d /usr/bin", "f /usr/bin/tool"}
	cases := []struct {
		name   string
		upper  []string
		hidden []string
		want   changes
	}{
		{name: "nothing", upper: nil, want: changes{}},
		{name: "add a file", upper: []string{"d /etc", "f /etc/new"}, want: changes{Added: []string{"/etc/new"}}},
		{name: "modify a file", upper: []string{"d /etc", "f /etc/passwd"}, want: changes{Modified: []string{"/etc/passwd"}}},
		{name: "delete a file", upper: []string{"d /etc", "w /etc/group"}, want: changes{Deleted: []string{"/etc/group"}}},
		{name: "delete a tree", upper: []string{"w /usr"}, want: changes{Deleted: []string{"/usr"}}},
		{
			name:  "a new tree is added whole",
			upper: []string{"d /work", "f /work/a", "d /work/b", "f /work/b/c"},
			want:  changes{Added: []string{"/work", "/work/a", "/work/b", "/work/b/c"}},
		},
		{
			name:  "a directory made anew over the image's (rm -rf; mkdir)",
			upper: []string{"o /opt", "f /opt/a", "f /opt/c"},
			want:  changes{Added: []string{"/opt/c"}, Modified: []string{"/opt/a"}, Deleted: []string{"/opt/b", "/opt/sub"}},
		},
		{
			name:  "a file replaced by a directory",
			upper: []string{"d /data", "f /data/x"},
			want:  changes{Added: []string{"/data/x"}, Modified: []string{"/data"}},
		},
		{name: "a symlink changed", upper: []string{"l /link"}, want: changes{Modified: []string{"/link"}}},
		{name: "a whiteout of what the image lacked", upper: []string{"w /never"}, want: changes{}},
		{
			name:   "the runtime's mount points are no change, what is beside them is",
			upper:  []string{"d /etc", "f /etc/hosts", "f /etc/resolv.conf", "f /etc/mine", "d /.orchard", "d /dev", "f /dev/termination-log"},
			hidden: []string{"/etc", "/etc/hosts", "/etc/resolv.conf", "/.orchard", "/dev", "/dev/termination-log"},
			want:   changes{Added: []string{"/etc/mine"}},
		},
	}
	lower := layer(t, image...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hidden := map[string]bool{}
			for _, h := range tc.hidden {
				hidden[h] = true
			}
			got, err := diffUpper(layer(t, tc.upper...), []string{lower}, hidden)
			if err != nil {
				t.Fatal(err)
			}
			assertChanges(t, got, tc.want)
		})
	}
}

// Two image layers: what the top one deleted or hid was not in the image.
func TestDiffUpperOverLayeredImage(t *testing.T) {
	bottom := layer(t, "d /etc", "f /etc/old", "d /var", "f /var/x", "f /var/y", "d /srv", "f /srv/kept")
	top := layer(t, "d /etc", "w /etc/old", "f /etc/new", "o /var", "f /var/y", "d /srv")
	upper := layer(t, "d /etc", "f /etc/old", "f /etc/new", "d /var", "f /var/x", "w /var/y", "d /srv", "w /srv/kept")
	got, err := diffUpper(upper, []string{top, bottom}, nil)
	if err != nil {
		t.Fatal(err)
	}
	assertChanges(t, got, changes{
		Added:    []string{"/etc/old", "/var/x"},
		Modified: []string{"/etc/new"},
		Deleted:  []string{"/srv/kept", "/var/y"},
	})
}

func assertChanges(t *testing.T, got, want changes) {
	t.Helper()
	norm := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	want = changes{norm(want.Added), norm(want.Modified), norm(want.Deleted)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

// The kernel's own overlayfs makes the upper dir: changes made through a real mount
// (as a sandbox makes them) are what the diff reports.
func TestDiffOfARealOverlay(t *testing.T) {
	lower := layer(t, "d /etc", "f /etc/passwd", "f /etc/group", "d /opt", "f /opt/a", "d /opt/sub",
		"f /opt/sub/x", "d /usr", "f /usr/tool")
	upper, work, merged := t.TempDir(), t.TempDir(), t.TempDir()
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := syscall.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("cannot mount an overlay here (needs root): %v", err)
	}
	defer func() { _ = syscall.Unmount(merged, syscall.MNT_DETACH) }()
	in := func(p string) string { return filepath.Join(merged, p) }
	steps := []error{
		os.WriteFile(in("/etc/new"), []byte("new"), 0o644),
		os.WriteFile(in("/etc/passwd"), []byte("root::0:0::/:/bin/sh\n"), 0o644),
		os.Remove(in("/etc/group")),
		os.RemoveAll(in("/opt")),
		os.Mkdir(in("/opt"), 0o755), // made anew: the kernel marks it opaque
		os.WriteFile(in("/opt/a"), []byte("again"), 0o644),
		os.MkdirAll(in("/work/deep"), 0o755),
		os.WriteFile(in("/work/deep/f"), nil, 0o644),
		os.Chmod(in("/usr/tool"), 0o700), // a copy-up by metadata alone
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	got, err := diffUpper(upper, []string{lower}, nil)
	if err != nil {
		t.Fatal(err)
	}
	assertChanges(t, got, changes{
		Added:    []string{"/etc/new", "/work", "/work/deep", "/work/deep/f"},
		Modified: []string{"/etc/passwd", "/opt/a", "/usr/tool"},
		Deleted:  []string{"/etc/group", "/opt/sub"},
	})
}

// The diff route end to end over stand-ins for the node's folders: a cgroup folder whose
// cgroup.procs names a process, that process's mountinfo in a /proc folder, and the
// layers under a containerd root mounted elsewhere (as the DaemonSet mounts it).
func TestDiffRoute(t *testing.T) {
	hostRoot := "/var/lib/containerd"
	mnt := t.TempDir()
	snaps := filepath.Join(mnt, "io.containerd.snapshotter.v1.overlayfs", "snapshots")
	for _, d := range []string{"1/fs/etc", "7/fs/etc", "7/fs/.orchard"} {
		if err := os.MkdirAll(filepath.Join(snaps, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(snaps, "1/fs/etc/passwd"), "x")
	write(filepath.Join(snaps, "7/fs/etc/passwd"), "y")
	write(filepath.Join(snaps, "7/fs/etc/hosts"), "")
	write(filepath.Join(snaps, "7/fs/made"), "")

	cg := t.TempDir()
	ctrDir := filepath.Join(cg, "freezer", "kubepods", "pod"+testPod, testCtr)
	if err := os.MkdirAll(ctrDir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(ctrDir, "cgroup.procs"), "4242\n")
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "4242"), 0o755); err != nil {
		t.Fatal(err)
	}
	hs := hostRoot + "/io.containerd.snapshotter.v1.overlayfs/snapshots"
	write(filepath.Join(proc, "4242", "mountinfo"), strings.Join([]string{
		"1 0 0:1 / / rw - overlay overlay rw,lowerdir=" + hs + "/1/fs,upperdir=" + hs + "/7/fs,workdir=" + hs + "/7/work",
		"2 1 0:2 /x /.orchard rw - ext4 /dev/vda rw",
		"3 1 0:2 /y /etc/hosts rw - ext4 /dev/vda rw",
	}, "\n")+"\n")

	n := &node{name: "node-a", token: nodeToken(testKey, "node-a"), cgroupRoot: cg, procRoot: proc,
		containerdRoot: hostRoot, containerdMount: mnt}
	code, body := call(t, n, "GET", route("diff"))
	want := map[string]any{"added": []any{"/made"}, "modified": []any{"/etc/passwd"}, "deleted": []any{}}
	if code != 200 || !reflect.DeepEqual(body, want) {
		t.Fatalf("diff: %d %v", code, body)
	}

	// Layers outside the containerd root the helper has mounted: a clear 501.
	n.containerdRoot = "/elsewhere"
	if code, body := call(t, n, "GET", route("diff")); code != 501 || body["code"] != "outside_containerd_root" {
		t.Fatalf("outside: %d %v", code, body)
	}
	// A container with no process left (it exited): 409.
	write(filepath.Join(ctrDir, "cgroup.procs"), "")
	if code, body := call(t, n, "GET", route("diff")); code != 409 || body["code"] != "container_not_running" {
		t.Fatalf("no process: %d %v", code, body)
	}
}
