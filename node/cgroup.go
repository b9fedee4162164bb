package main

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

var (
	podUIDRe      = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	containerIDRe = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// container is one container's cgroup: in the v1 freezer hierarchy, or the v2 tree.
type container struct {
	dir string
	v2  bool
}

// checkIDs keeps request paths to what the kubelet names (and out of ".." games).
func checkIDs(pod, ctr string) error {
	if !podUIDRe.MatchString(pod) {
		return fail(http.StatusBadRequest, "invalid_request", "the pod id is not a pod UID")
	}
	if !containerIDRe.MatchString(ctr) {
		return fail(http.StatusBadRequest, "invalid_request", "the container id is not 64 hex digits")
	}
	return nil
}

// podDirs are where the kubelet puts a pod's cgroup, for each QoS class, with the cgroupfs
// driver (kubepods/burstable/pod<uid>) and the systemd one (kubepods.slice/...slice).
func podDirs(uid string) []string {
	u := strings.ReplaceAll(uid, "-", "_")
	return []string{
		"kubepods/pod" + uid,
		"kubepods/burstable/pod" + uid,
		"kubepods/besteffort/pod" + uid,
		"kubepods.slice/kubepods-pod" + u + ".slice",
		"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + u + ".slice",
		"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + u + ".slice",
	}
}

// containerDirs are the names a runtime gives a container's cgroup inside its pod's.
func containerDirs(id string) []string {
	return []string{id, "cri-containerd-" + id + ".scope", "crio-" + id + ".scope"}
}

// findContainer locates a running container's cgroup on this node.
func (n *node) findContainer(pod, ctr string) (container, error) {
	if err := checkIDs(pod, ctr); err != nil {
		return container{}, err
	}
	base, v2 := filepath.Join(n.cgroupRoot, "freezer"), false
	if _, err := os.Stat(filepath.Join(n.cgroupRoot, "cgroup.controllers")); err == nil {
		base, v2 = n.cgroupRoot, true
	}
	base = filepath.Join(base, n.cgroupParent)
	for _, p := range podDirs(pod) {
		for _, c := range containerDirs(ctr) {
			dir := filepath.Join(base, p, c)
			if st, err := os.Stat(dir); err == nil && st.IsDir() {
				return container{dir: dir, v2: v2}, nil
			}
		}
	}
	return container{}, fail(http.StatusNotFound, "container_not_found",
		"no cgroup of container "+ctr[:12]+" in pod "+pod+" on this node")
}

// frozen says whether the container's cgroup is frozen (v1 FROZEN; v2 "frozen 1").
// A v1 cgroup still FREEZING is not.
func (c container) frozen() (bool, error) {
	if c.v2 {
		raw, err := os.ReadFile(filepath.Join(c.dir, "cgroup.events"))
		if err != nil {
			return false, err
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "frozen "); ok {
				return strings.TrimSpace(v) == "1", nil
			}
		}
		return false, nil
	}
	raw, err := os.ReadFile(filepath.Join(c.dir, "freezer.state"))
	return strings.TrimSpace(string(raw)) == "FROZEN", err
}

// setFreeze asks the kernel to freeze (or thaw) every task of the cgroup.
func (c container) setFreeze(on bool) error {
	if c.v2 {
		v := "0"
		if on {
			v = "1"
		}
		return os.WriteFile(filepath.Join(c.dir, "cgroup.freeze"), []byte(v), 0)
	}
	v := "THAWED"
	if on {
		v = "FROZEN"
	}
	return os.WriteFile(filepath.Join(c.dir, "freezer.state"), []byte(v), 0)
}

// pids are the container's processes, as this helper's PID namespace numbers them (the
// host's: the DaemonSet has hostPID).
func (c container) pids() ([]int, error) {
	raw, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(raw)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	return out, nil
}
