package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// upstream is a stand-in for `registry serve` that records what reached it.
func upstream(t *testing.T, hits *atomic.Int64) *url.URL {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("X-Seen-Host", r.Host)
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u
}

func blob(t *testing.T, root, hex string, size int) string {
	t.Helper()
	dir := filepath.Join(root, "docker", "registry", "v2", "blobs", "sha256", hex[:2], hex)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestProxiesAndKeepsTheHost(t *testing.T) {
	var hits atomic.Int64
	g := newGate(upstream(t, &hits))
	for _, method := range []string{"GET", "HEAD", "PUT", "POST", "PATCH", "DELETE"} {
		req := httptest.NewRequest(method, "http://reg.example:5000/v2/a/manifests/x", nil)
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		if rec.Code != http.StatusAccepted || rec.Header().Get("X-Seen-Host") != "reg.example:5000" {
			t.Fatalf("%s: status %d, host %q", method, rec.Code, rec.Header().Get("X-Seen-Host"))
		}
	}
	if hits.Load() != 6 {
		t.Fatalf("upstream saw %d requests, want 6", hits.Load())
	}
}

func TestWritesWaitForACollectionAndReadsDoNot(t *testing.T) {
	var hits atomic.Int64
	g := newGate(upstream(t, &hits))
	g.quiet, g.maxWait = 0, time.Second
	inGC, release := make(chan struct{}), make(chan struct{})
	g.collect = func(context.Context) (string, error) {
		close(inGC)
		<-release
		return "", nil
	}
	go g.runGC(context.Background())
	<-inGC

	read := httptest.NewRecorder()
	g.ServeHTTP(read, httptest.NewRequest("GET", "/v2/a/blobs/sha256:1", nil))
	if read.Code != http.StatusAccepted {
		t.Fatalf("a read during a collection: %d", read.Code)
	}
	wrote := make(chan struct{})
	go func() {
		g.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("PUT", "/v2/a/manifests/t", nil))
		close(wrote)
	}()
	select {
	case <-wrote:
		t.Fatal("a write went through during a collection")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case <-wrote:
	case <-time.After(5 * time.Second):
		t.Fatal("the write never went through after the collection")
	}
}

func TestACollectionWaitsForQuietThenGivesUp(t *testing.T) {
	var hits atomic.Int64
	cases := []struct {
		name       string
		quiet, max time.Duration
		busy       bool
		wantForced bool
		minWait    time.Duration
	}{
		{"quiet after the last write", 300 * time.Millisecond, 5 * time.Second, false, false, 250 * time.Millisecond},
		{"forced when writes keep coming", 300 * time.Millisecond, 600 * time.Millisecond, true, true, 550 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(upstream(t, &hits))
			g.quiet, g.maxWait = tc.quiet, tc.max
			g.collect = func(context.Context) (string, error) { return "", nil }
			g.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("PATCH", "/v2/a/blobs/uploads/u", nil))
			stop := make(chan struct{})
			if tc.busy {
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(50 * time.Millisecond):
							g.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("PUT", "/v2/a/blobs/uploads/u", nil))
						}
					}
				}()
			}
			res := g.runGC(context.Background())
			close(stop)
			if res.Forced != tc.wantForced || res.WaitedS < tc.minWait.Seconds() {
				t.Fatalf("forced %v after %.2fs; want forced %v after >= %v", res.Forced, res.WaitedS, tc.wantForced, tc.minWait)
			}
		})
	}
}

func TestCollectEndpointCountsWhatWasRemoved(t *testing.T) {
	var hits atomic.Int64
	g := newGate(upstream(t, &hits))
	g.quiet = 0
	g.root = t.TempDir()
	keep := blob(t, g.root, "aa11", 10)
	gone := blob(t, g.root, "bb22", 300)
	g.collect = func(context.Context) (string, error) { return "", os.RemoveAll(gone) }

	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest("POST", "/orchard/gc", nil))
	var res gcResult
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("POST /orchard/gc: %d %s", rec.Code, rec.Body)
	}
	if res.BlobsBefore != 2 || res.BlobsAfter != 1 || res.BlobsRemoved != 1 || res.BytesRemoved != 300 {
		t.Fatalf("result %+v", res)
	}
	if !exists(keep) || hits.Load() != 0 {
		t.Fatal("the kept blob went, or the endpoint reached the registry")
	}
	rec = httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest("GET", "/orchard/gc", nil))
	if !strings.Contains(rec.Body.String(), `"blobs_removed":1`) {
		t.Fatalf("GET /orchard/gc: %s", rec.Body)
	}
	rec = httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest("DELETE", "/orchard/gc", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("DELETE /orchard/gc: %d", rec.Code)
	}
}

func TestAFailedCollectionIsReported(t *testing.T) {
	var hits atomic.Int64
	g := newGate(upstream(t, &hits))
	g.quiet = 0
	g.collect = registryCollect("/bin/false", "/nonexistent.yml", true)
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest("POST", "/orchard/gc", nil))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "exit status 1") {
		t.Fatalf("a failing collect: %d %s", rec.Code, rec.Body)
	}
}

func TestHealthFollowsTheRegistry(t *testing.T) {
	var hits atomic.Int64
	g := newGate(upstream(t, &hits))
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("healthy upstream: %d", rec.Code)
	}
	down := newGate(&url.URL{Scheme: "http", Host: "127.0.0.1:1"})
	rec = httptest.NewRecorder()
	down.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("no upstream: %d", rec.Code)
	}
}
