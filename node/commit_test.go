package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// registryBinary is the upstream registry (distribution v3) that
// deploy/kubernetes/images/registry/build.sh builds, if it has been built here.
func registryBinary(t *testing.T) string {
	if p := os.Getenv("ORCHARD_REGISTRY_BIN"); p != "" {
		return p
	}
	matches, _ := filepath.Glob("/var/cache/orchard/registry-v*/registry")
	if len(matches) == 0 {
		t.Skip("no registry binary: run deploy/kubernetes/images/registry/build.sh once")
	}
	return matches[len(matches)-1]
}

// startRegistry runs the real registry on loopback; it returns its URL.
func startRegistry(t *testing.T) string {
	bin := registryBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yml")
	body := fmt.Sprintf("version: 0.1\nlog: {level: warn, accesslog: {disabled: true}}\n"+
		"storage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}}\nhttp: {addr: %q}\n",
		filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", config)
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(20 * time.Second); ; {
		if resp, err := http.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the registry did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "http://" + addr
}

func sha(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// putBlob writes a blob into a content store folder laid out as containerd's.
func putBlob(t *testing.T, store string, data []byte) string {
	d := sha(data)
	p := filepath.Join(store, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o444); err != nil {
		t.Fatal(err)
	}
	return d
}

// tarOf is an uncompressed layer tar of a folder (as `docker save` layers are).
func tarOf(t *testing.T, dir string) []byte {
	out, err := exec.Command("tar", "-C", dir, "--numeric-owner", "-cf", "-", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func get(t *testing.T, url string, accept string) []byte {
	req, _ := http.NewRequest("GET", url, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, data)
	}
	return data
}

// A real container-like setup on this host: an image in a containerd-shaped content store
// (one uncompressed layer, as an imported image has), a real overlay over that layer
// changed through its mount, and the real registry. Commit pushes the image with one
// layer more; pulled back and applied, that image is what the container saw.
func TestCommitPushesTheImageWithTheChangesOnTop(t *testing.T) {
	registryURL := startRegistry(t)
	root := t.TempDir() // stands in for the containerd root (the DaemonSet mounts it)
	store := filepath.Join(root, "io.containerd.content.v1.content")
	snaps := filepath.Join(root, "io.containerd.snapshotter.v1.overlayfs", "snapshots")
	lower, upper, work, merged := filepath.Join(snaps, "1", "fs"), filepath.Join(snaps, "2", "fs"),
		filepath.Join(snaps, "2", "work"), t.TempDir()
	for _, d := range []string{lower + "/etc", lower + "/opt/sub", upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, s := range map[string]string{"/etc/passwd": "root:x:0:0::/:/bin/sh\n", "/etc/group": "root:x:0:\n", "/opt/sub/x": "x"} {
		if err := os.WriteFile(lower+p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The image, in the content store: layer, config, manifest (Docker's schema 2 dialect).
	baseLayer := tarOf(t, lower)
	layerDigest := putBlob(t, store, baseLayer)
	configJSON, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config":  map[string]any{"Cmd": []string{"/bin/sh"}},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
		"history": []any{map[string]any{"created_by": "the base"}},
	})
	configDigest := putBlob(t, store, configJSON)
	manifestJSON, _ := json.Marshal(manifest{
		SchemaVersion: 2, MediaType: dockerManifest,
		Config: descriptor{MediaType: "application/vnd.docker.container.image.v1+json", Digest: configDigest, Size: int64(len(configJSON))},
		Layers: []descriptor{{MediaType: "application/vnd.docker.image.rootfs.diff.tar", Digest: layerDigest, Size: int64(len(baseLayer))}},
	})
	putBlob(t, store, manifestJSON)

	// The container: a real overlay, changed through its mount.
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := syscall.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("cannot mount an overlay here (needs root): %v", err)
	}
	defer func() { _ = syscall.Unmount(merged, syscall.MNT_DETACH) }()
	for i, err := range []error{
		os.WriteFile(merged+"/etc/passwd", []byte("changed\n"), 0o644),
		os.Remove(merged + "/etc/group"),
		os.RemoveAll(merged + "/opt"),
		os.Mkdir(merged+"/opt", 0o755),
		os.WriteFile(merged+"/opt/new", []byte("new"), 0o600),
		os.MkdirAll(merged+"/.orchard", 0o755), // a mount point in the container: left out
	} {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}

	// Stand-ins for the node's cgroup (a plain file) and /proc (one process's mountinfo).
	cg, proc := t.TempDir(), t.TempDir()
	ctrDir := filepath.Join(cg, "freezer", "kubepods", "pod"+testPod, testCtr)
	_ = os.MkdirAll(ctrDir, 0o755)
	_ = os.WriteFile(filepath.Join(ctrDir, "freezer.state"), []byte("THAWED\n"), 0o644)
	_ = os.WriteFile(filepath.Join(ctrDir, "cgroup.procs"), []byte("4242\n"), 0o644)
	_ = os.MkdirAll(filepath.Join(proc, "4242"), 0o755)
	_ = os.WriteFile(filepath.Join(proc, "4242", "mountinfo"), []byte(
		"1 0 0:1 / / rw - overlay overlay rw,"+opts+"\n2 1 0:2 /x /.orchard rw - ext4 /dev/vda rw\n"), 0o644)

	reg, err := newRegistry(registryURL)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{name: "node-a", token: nodeToken(testKey, "node-a"), cgroupRoot: cg, procRoot: proc,
		containerdRoot: root, containerdMount: root, freezeTimeout: time.Second,
		content: &contentStore{root: store}, registry: reg}

	commit := func(tag string) commitAnswer {
		body := fmt.Sprintf(`{"image": %q, "repository": "orchard/snapshots", "tag": %q}`, configDigest, tag)
		req := httptest.NewRequest("POST", route("commit"), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+nodeToken(testKey, "node-a"))
		rec := httptest.NewRecorder()
		n.routes().ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("commit: %d %s", rec.Code, rec.Body)
		}
		var ans commitAnswer
		if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil {
			t.Fatal(err)
		}
		return ans
	}
	ans := commit("snap-one")
	if ans.Base != sha(manifestJSON) {
		t.Fatalf("base %s, want the image's manifest", ans.Base)
	}
	// It thawed what it froze for the layer.
	if state, _ := os.ReadFile(filepath.Join(ctrDir, "freezer.state")); strings.TrimSpace(string(state)) != "THAWED" {
		t.Fatalf("left %q", state)
	}

	// Pull it back as a runtime would: the manifest by tag, then every blob by digest.
	raw := get(t, registryURL+"/v2/orchard/snapshots/manifests/snap-one", dockerManifest)
	if sha(raw) != ans.Digest {
		t.Fatal("the manifest by tag is not the one committed")
	}
	var m manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 2 || m.Layers[0].Digest != layerDigest || m.Layers[1].MediaType != dockerLayerGzip {
		t.Fatalf("layers %+v", m.Layers)
	}
	var cfg struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
		History []map[string]any `json:"history"`
	}
	if err := json.Unmarshal(get(t, registryURL+"/v2/orchard/snapshots/blobs/"+m.Config.Digest, ""), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.RootFS.DiffIDs) != 2 || cfg.RootFS.DiffIDs[1] != ans.Layer.DiffID || len(cfg.History) != 2 {
		t.Fatalf("config %+v", cfg)
	}
	applied := t.TempDir()
	base := get(t, registryURL+"/v2/orchard/snapshots/blobs/"+layerDigest, "")
	if err := untar(base, applied); err != nil {
		t.Fatal(err)
	}
	top := get(t, registryURL+"/v2/orchard/snapshots/blobs/"+m.Layers[1].Digest, "")
	if sha(top) != m.Layers[1].Digest {
		t.Fatal("the layer blob is not its digest")
	}
	applyLayer(t, top, applied)
	want, got := tree(t, merged), tree(t, applied)
	delete(want, "/.orchard")
	for p, d := range want {
		if got[p] != d {
			t.Errorf("%s: got %q, want %q", p, got[p], d)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: in the pulled image, not in the container", p)
		}
	}

	// A second snapshot of the same state: the same layer (content-addressed, sent once).
	if again := commit("snap-two"); again.Layer != ans.Layer {
		t.Fatalf("the same changes made another layer: %+v vs %+v", again.Layer, ans.Layer)
	}
}

func untar(data []byte, dest string) error {
	cmd := exec.Command("tar", "-C", dest, "-xf", "-")
	cmd.Stdin = bytes.NewReader(data)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("tar: %v %s", err, out)
	}
	return nil
}

func TestCommitErrors(t *testing.T) {
	n := &node{name: "node-a", token: nodeToken(testKey, "node-a"), cgroupRoot: t.TempDir(),
		content: &contentStore{root: t.TempDir()}}
	post := func(body string) (int, map[string]any) {
		req := httptest.NewRequest("POST", route("commit"), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+nodeToken(testKey, "node-a"))
		rec := httptest.NewRecorder()
		n.routes().ServeHTTP(rec, req)
		var out map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Code, out
	}
	cases := []struct {
		body   string
		status int
		code   string
	}{
		{"not json", 400, "invalid_request"},
		{`{"image": "sha256:00", "repository": "Bad/Repo", "tag": "t"}`, 400, "invalid_request"},
		{`{"image": "sha256:00", "repository": "orchard/snapshots", "tag": "../x"}`, 400, "invalid_request"},
		{`{"image": "sha256:00", "repository": "orchard/snapshots", "tag": "snap-1"}`, 501, "no_registry"},
	}
	for _, tc := range cases {
		if code, out := post(tc.body); code != tc.status || out["code"] != tc.code {
			t.Errorf("%s: %d %v", tc.body, code, out)
		}
	}
	// With a registry, a container that is not on this node.
	n.registry, _ = newRegistry("http://127.0.0.1:1")
	if code, out := post(`{"image": "sha256:00", "repository": "orchard/snapshots", "tag": "snap-1"}`); code != 404 {
		t.Errorf("no container: %d %v", code, out)
	}
}

// The gzip layer is readable by any tar reader (not only ours).
func TestLayerIsAPlainGzippedTar(t *testing.T) {
	upper := layer(t, "d /a", "f /a/b", "l /a/c")
	var blob bytes.Buffer
	if _, err := writeLayer(&blob, upper, nil); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(&blob)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, " ") != "a/ a/b a/c" {
		t.Fatalf("%q", names)
	}
}
