// Command orchard-registry runs the upstream registry (distribution v3) behind a small gate
// that makes garbage collection safe while it serves.
//
// The registry cannot collect garbage online: `registry garbage-collect` run beside a
// serving registry can sweep the blobs of a manifest pushed during its mark phase. So this
// program, the image's entrypoint, starts `registry serve` on a loopback address, proxies
// the registry API to it, and holds every write (blob upload, manifest put or delete)
// while a collection runs; a collection first waits for the registry to be write-quiet,
// so it does not fall between a pusher's blobs and its manifest. A push that still
// straddles one fails cleanly (the registry answers MANIFEST_BLOB_UNKNOWN to a manifest
// whose blobs are gone) and is retried; no manifest is ever left without its blobs.
//
//	orchard-registry -config /etc/registry/config.yml -root /var/lib/registry -gc-interval 15m
//
// Routes besides the registry's own /v2/: GET /healthz (the registry answers),
// POST /orchard/gc (collect now; answers what it removed), GET /orchard/gc (the last run).
// Standard library only.
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", ":5000", "address to serve the registry API on")
	upstream := flag.String("upstream", "127.0.0.1:5001", "loopback address for `registry serve`")
	bin := flag.String("registry", "/registry", "the upstream registry binary")
	config := flag.String("config", "/etc/registry/config.yml", "the registry's configuration")
	root := flag.String("root", "/var/lib/registry", "the filesystem driver's root (for blob counts)")
	interval := flag.Duration("gc-interval", 15*time.Minute, "collect garbage this often (0: only on POST /orchard/gc)")
	quiet := flag.Duration("gc-quiet", 10*time.Second, "a collection waits until no write for this long")
	maxWait := flag.Duration("gc-max-wait", 2*time.Minute, "then goes ahead anyway after this long (writes queue)")
	untagged := flag.Bool("gc-untagged", true, "also delete manifests no tag points to (push with a tag)")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.LUTC)
	for _, p := range []string{*bin, *config} {
		if !exists(p) {
			log.Fatalf("orchard-registry: %s does not exist", p)
		}
	}

	target := &url.URL{Scheme: "http", Host: *upstream}
	g := newGate(target)
	g.collect = registryCollect(*bin, *config, *untagged)
	g.root, g.quiet, g.maxWait = *root, *quiet, *maxWait

	child := exec.Command(*bin, "serve", *config)
	child.Env = append(os.Environ(), "REGISTRY_HTTP_ADDR="+*upstream)
	child.Stdout, child.Stderr = os.Stdout, os.Stderr
	if err := child.Start(); err != nil {
		log.Fatalf("orchard-registry: start the registry: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	srv := &http.Server{Addr: *listen, Handler: g, ReadHeaderTimeout: 30 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	log.Printf("orchard-registry: serving %s -> %s, gc every %v", *listen, *upstream, *interval)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *interval > 0 {
		go func() {
			t := time.NewTicker(*interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					g.runGC(ctx)
				}
			}
		}()
	}

	code, childDone := 0, false
	select {
	case <-ctx.Done():
		log.Printf("orchard-registry: stopping")
	case err := <-exited:
		log.Printf("orchard-registry: the registry exited: %v", err)
		code, childDone = 1, true
	case err := <-served:
		log.Printf("orchard-registry: serve: %v", err)
		code = 1
	}
	shut, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Printf("orchard-registry: shutdown: %v", err)
	}
	if !childDone {
		_ = child.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-shut.Done():
			_ = child.Process.Kill()
		}
	}
	os.Exit(code)
}
