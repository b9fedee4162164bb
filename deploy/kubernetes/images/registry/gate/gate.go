package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// gate sits in front of the registry and makes garbage collection safe to run while it
// serves: every request that changes the store (a blob upload, a manifest put or delete)
// holds a shared lock for its whole duration, and a collection holds it alone. A
// collection also waits for the registry to be write-quiet first, so it does not land
// between a pusher's last blob and its manifest. Reads (pulls) never wait.
type gate struct {
	mu      sync.RWMutex // writes share it; a collection takes it alone
	active  atomic.Int64 // writes in flight (waiting or running)
	last    atomic.Int64 // when the last write ended, unix nanoseconds
	proxy   http.Handler
	collect func(context.Context) (string, error) // runs one mark-and-sweep
	root    string                                // the registry's storage root (for counts)
	quiet   time.Duration                         // how long without writes before a collection
	maxWait time.Duration                         // how long a collection waits for quiet at most
	gcTime  time.Duration                         // how long one collection may run

	gcMu sync.Mutex // one collection at a time
	res  atomic.Pointer[gcResult]
}

func newGate(upstream *url.URL) *gate {
	g := &gate{quiet: 10 * time.Second, maxWait: 2 * time.Minute, gcTime: 10 * time.Minute}
	g.proxy = &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(upstream)
		pr.Out.Host = pr.In.Host // the registry builds its Location headers from it
		pr.SetXForwarded()
	}}
	return g
}

func isWrite(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/orchard/gc":
		g.serveGC(w, r)
		return
	case "/healthz":
		g.serveHealth(w, r)
		return
	}
	if isWrite(r) {
		g.active.Add(1)
		g.mu.RLock()
		defer func() {
			g.last.Store(time.Now().UnixNano())
			g.mu.RUnlock()
			g.active.Add(-1)
		}()
	}
	g.proxy.ServeHTTP(w, r)
}

// serveHealth answers 200 when the registry behind answers its base route at all.
func (g *gate) serveHealth(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{header: http.Header{}}
	req := r.Clone(r.Context())
	req.Method, req.URL.Path = http.MethodGet, "/v2/"
	g.proxy.ServeHTTP(rec, req)
	if rec.status == 0 || rec.status >= 500 {
		http.Error(w, "registry not answering", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// serveGC: POST runs a collection now and answers its result; GET answers the last one.
func (g *gate) serveGC(w http.ResponseWriter, r *http.Request) {
	var res *gcResult
	switch r.Method {
	case http.MethodPost:
		res = g.runGC(r.Context())
	case http.MethodGet:
		if res = g.res.Load(); res == nil {
			res = &gcResult{}
		}
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if res.Error != "" {
		w.WriteHeader(http.StatusInternalServerError)
	}
	_ = json.NewEncoder(w).Encode(res)
}

// waitQuiet returns once no write is in flight and none ended within g.quiet, or when
// g.maxWait has passed (then forced is true: the collection goes ahead and writes queue).
func (g *gate) waitQuiet(ctx context.Context) (waited time.Duration, forced bool) {
	start := time.Now()
	for {
		idle := time.Since(time.Unix(0, g.last.Load()))
		if g.active.Load() == 0 && idle >= g.quiet {
			return time.Since(start), false
		}
		if time.Since(start) >= g.maxWait {
			return time.Since(start), true
		}
		select {
		case <-ctx.Done():
			return time.Since(start), true
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// statusRecorder keeps only the status of a response (for the health check).
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return len(b), nil
}
func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
}
