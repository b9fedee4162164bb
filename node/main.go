// Command orchard-node is Orchard's node helper on Kubernetes: the one part of Orchard
// with rights on a node, run as a DaemonSet (deploy/kubernetes/base/node.yaml). The
// service calls it for what the pod API cannot do: freeze and thaw a sandbox's container
// (its cgroup freezer), list the changes in its writable layer (the overlay upper dir),
// and commit those changes as an image layer to the in-cluster registry (snapshots).
//
// Every request needs this node's token (auth.go); the helper listens on its pod IP,
// which a NetworkPolicy opens to the service's pods only. Routes, one file each:
//
//	POST /v1/pods/{pod}/containers/{container}/pause   pause.go
//	POST /v1/pods/{pod}/containers/{container}/resume  resume.go
//	GET  /v1/pods/{pod}/containers/{container}/state   pause.go
//	GET  /v1/pods/{pod}/containers/{container}/diff    diff.go
//	POST /v1/pods/{pod}/containers/{container}/commit  commit.go (layer.go, content.go, push.go)
//
// {pod} is the pod's UID, {container} its container ID (without "containerd://").
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// version is set at build time: -ldflags "-X main.version=...".
var version = "dev"

// node is the helper's configuration: where it finds this node's cgroups, processes and
// container layers.
type node struct {
	name            string
	token           string // this node's token, fixed (tests); else read from keyFile
	keyFile         string
	cgroupRoot      string // the node's /sys/fs/cgroup, mounted
	cgroupParent    string // the kubelet's --cgroup-root, if not "/"
	procRoot        string // a /proc of the host's PID namespace
	containerdRoot  string // containerd's root folder, as the node names it
	containerdMount string // ... and where this helper has it mounted
	freezeTimeout   time.Duration
	content         *contentStore // containerd's content store (images' blobs)
	registry        *registry     // where commits go; nil: commit answers 501
}

func (n *node) routes() http.Handler {
	mux := http.NewServeMux()
	const c = "/v1/pods/{pod}/containers/{container}/"
	mux.HandleFunc("POST "+c+"pause", n.pause)
	mux.HandleFunc("POST "+c+"resume", n.resume)
	mux.HandleFunc("GET "+c+"state", n.state)
	mux.HandleFunc("GET "+c+"diff", n.diff)
	mux.HandleFunc("POST "+c+"commit", n.commit)
	return requireToken(&tokens{file: n.keyFile, node: n.name, token: n.token}, mux)
}

// loadConfig reads flags, each defaulting to an ORCHARD_NODE_* variable.
func loadConfig(args []string, getenv func(string) string) (*node, string, error) {
	env := func(name, def string) string {
		if v := getenv("ORCHARD_NODE_" + name); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("orchard-node", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := &node{}
	listen := fs.String("listen", env("LISTEN", ":9091"), "address to listen on")
	keyFile := fs.String("key-file", env("KEY_FILE", "/etc/orchard-node/key"), "the shared key")
	fs.StringVar(&n.name, "node", env("NAME", ""), "this node's name (the downward API's spec.nodeName)")
	fs.StringVar(&n.cgroupRoot, "cgroup-root", env("CGROUP_ROOT", "/sys/fs/cgroup"), "the node's cgroup mount")
	fs.StringVar(&n.cgroupParent, "cgroup-parent", env("CGROUP_PARENT", ""), "the kubelet's cgroup root")
	fs.StringVar(&n.procRoot, "proc", env("PROC", "/proc"), "a proc of the host's PID namespace")
	fs.StringVar(&n.containerdRoot, "containerd-root", env("CONTAINERD_ROOT", "/var/lib/containerd"),
		"containerd's root folder on the node")
	fs.StringVar(&n.containerdMount, "containerd-root-mount", env("CONTAINERD_ROOT_MOUNT", ""),
		"where that folder is mounted here (default: the same path)")
	timeout := fs.Duration("freeze-timeout", 5*time.Second, "how long a freeze may take")
	registryURL := fs.String("registry", env("REGISTRY", ""), "the in-cluster registry commits go to (http://host:port)")
	if err := fs.Parse(args); err != nil {
		return nil, "", err
	}
	n.freezeTimeout = *timeout
	if n.containerdMount == "" {
		n.containerdMount = n.containerdRoot
	}
	n.content = &contentStore{root: filepath.Join(n.containerdMount, "io.containerd.content.v1.content")}
	if *registryURL != "" {
		var err error
		if n.registry, err = newRegistry(*registryURL); err != nil {
			return nil, "", err
		}
	}
	if n.name == "" {
		return nil, "", errors.New("the node's name is required (--node or ORCHARD_NODE_NAME)")
	}
	key, err := readKey(*keyFile)
	if err != nil {
		return nil, "", fmt.Errorf("reading the key: %w", err)
	}
	n.token, n.keyFile = nodeToken(key, n.name), *keyFile
	return n, *listen, nil
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println(version)
		return
	}
	n, listen, err := loadConfig(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "orchard-node:", err)
		os.Exit(2)
	}
	srv := &http.Server{
		Addr:              listen,
		Handler:           n.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	log.Printf("orchard-node %s on node %s, listening on %s", version, n.name, listen)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
