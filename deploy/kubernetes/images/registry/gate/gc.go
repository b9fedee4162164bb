package main

import (
	"context"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// gcResult is what one collection did, as POST/GET /orchard/gc answer it.
type gcResult struct {
	Started      time.Time `json:"started"`
	WaitedS      float64   `json:"waited_s"` // waiting for the registry to be write-quiet
	Forced       bool      `json:"forced"`   // true: it never was, and writes queued instead
	Seconds      float64   `json:"seconds"`  // the mark-and-sweep itself (writes held)
	BlobsBefore  int       `json:"blobs_before"`
	BlobsAfter   int       `json:"blobs_after"`
	BlobsRemoved int       `json:"blobs_removed"`
	BytesRemoved int64     `json:"bytes_removed"`
	Error        string    `json:"error,omitempty"`
}

// runGC waits for quiet (bounded by ctx and g.maxWait), then runs one collection with every
// write held. The collection itself is not tied to ctx: a caller that goes away does not
// cut a sweep short.
func (g *gate) runGC(ctx context.Context) *gcResult {
	g.gcMu.Lock()
	defer g.gcMu.Unlock()
	res := &gcResult{Started: time.Now().UTC()}
	waited, forced := g.waitQuiet(ctx)
	res.WaitedS, res.Forced = waited.Seconds(), forced

	g.mu.Lock()
	defer g.mu.Unlock()
	t0 := time.Now()
	before, bytesBefore := countBlobs(g.root)
	runCtx, cancel := context.WithTimeout(context.Background(), g.gcTime)
	out, err := g.collect(runCtx)
	cancel()
	after, bytesAfter := countBlobs(g.root)
	res.Seconds = time.Since(t0).Seconds()
	res.BlobsBefore, res.BlobsAfter = before, after
	res.BlobsRemoved, res.BytesRemoved = before-after, bytesBefore-bytesAfter
	if err != nil {
		res.Error = strings.TrimSpace(err.Error() + ": " + tail(out, 2000))
	}
	log.Printf("gc: removed %d blobs (%d bytes) of %d in %.2fs, waited %.1fs for quiet (forced %v) %s",
		res.BlobsRemoved, res.BytesRemoved, before, res.Seconds, res.WaitedS, res.Forced, res.Error)
	g.res.Store(res)
	return res
}

// registryCollect runs the upstream `registry garbage-collect` on the same storage.
func registryCollect(bin, config string, untagged bool) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		args := []string{"garbage-collect", "--quiet"}
		if untagged {
			args = append(args, "--delete-untagged")
		}
		out, err := exec.CommandContext(ctx, bin, append(args, config)...).CombinedOutput()
		return string(out), err
	}
}

// countBlobs counts the blobs in a filesystem-driver store and the bytes they hold:
// <root>/docker/registry/v2/blobs/<algorithm>/<2 hex>/<digest>/data.
func countBlobs(root string) (n int, size int64) {
	if root == "" {
		return 0, 0
	}
	base := filepath.Join(root, "docker", "registry", "v2", "blobs")
	_ = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "data" {
			return nil
		}
		if info, err := d.Info(); err == nil {
			n++
			size += info.Size()
		}
		return nil
	})
	return n, size
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// exists says whether a path exists (for the startup checks).
func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
