// Package proxy forwards /proxy/{port}/... to 127.0.0.1:{port} inside the sandbox.
package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/orchard-env/orchard/agent/internal/api"
)

const prefix = "/proxy/"

// smallBody is the largest request body read whole before forwarding (the service's own
// threshold for keeping a Content-Length).
const smallBody = 1 << 20

// transport dials only loopback ports and never an HTTP proxy from the environment
// (the sandbox's egress settings must not capture its own loopback traffic).
var transport = &http.Transport{
	Proxy:                 nil,
	DialContext:           dialLoopback,
	MaxIdleConns:          64,
	MaxIdleConnsPerHost:   16,
	IdleConnTimeout:       90 * time.Second,
	ExpectContinueTimeout: time.Second,
	// Pass Accept-Encoding and compressed bodies through untouched.
	DisableCompression: true,
}

var dialer = &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}

// dialLoopback refuses any address but 127.0.0.1, whatever the request asked for.
func dialLoopback(ctx context.Context, network, addr string) (net.Conn, error) {
	if host, _, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" {
		return nil, fmt.Errorf("the port proxy only dials 127.0.0.1, not %q", addr)
	}
	return dialer.DialContext(ctx, network, addr)
}

// The agent's stderr is the sandbox's log stream (the image's entrypoint writes there
// too), so the proxy's internal chatter is dropped, as the agent's server does; the
// failures that matter reach the client as 502 bad_gateway.
var errorLog = log.New(io.Discard, "", 0)

// Route sends every request for /proxy/... to the proxy with its path as sent, and
// the rest to next. A ServeMux would first clean the path and answer a redirect to
// the result, which for /proxy/8080/../../exec (or %2e%2e) is one of the agent's own
// routes; here such a path is refused. agentPorts are the agent's own TCP ports:
// 127.0.0.1 on those is the agent, which the proxy must never reach.
func Route(next http.Handler, agentPorts ...int) http.Handler {
	own := map[int]bool{}
	for _, p := range agentPorts {
		own[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.EscapedPath(), prefix) && !strings.HasPrefix(r.URL.Path, prefix) {
			next.ServeHTTP(w, r)
			return
		}
		t, err := parseTarget(r.URL)
		if err == nil && own[t.port] {
			err = api.BadRequest("port %d is the agent's own; the proxy reaches only the sandbox's servers", t.port)
		}
		if err != nil {
			api.WriteError(w, err)
			return
		}
		serve(w, r, t)
	})
}

// target is where one request goes: the port and the escaped path after it.
type target struct {
	port    int
	rawPath string // escaped, starts with "/"
	path    string // rawPath unescaped
}

// parseTarget splits /proxy/{port}/{rest...}; the rest keeps its escaping (%2F stays)
// but may hold no dot segment, plain or escaped.
func parseTarget(u *url.URL) (target, error) {
	rest := strings.TrimPrefix(u.EscapedPath(), prefix)
	portStr, tail, _ := strings.Cut(rest, "/")
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 || strings.TrimLeft(portStr, "0123456789") != "" {
		return target{}, api.BadRequest("port %q is not a number in 1..65535", portStr)
	}
	raw := "/" + tail
	p, err := url.PathUnescape(raw)
	if err != nil {
		return target{}, api.BadRequest("bad path %q: %v", raw, err)
	}
	if hasDotSegment(tail) {
		return target{}, api.BadRequest("path %q has a dot segment (. or .., also escaped); the proxy forwards paths as sent, never resolved", raw)
	}
	return target{port: port, rawPath: raw, path: p}, nil
}

// hasDotSegment reports a "." or ".." segment in an escaped path, counting what
// decoding (%2e, %2f, %5c) would make one: servers differ in what they resolve.
func hasDotSegment(escaped string) bool {
	for _, seg := range strings.Split(escaped, "/") {
		dec, err := url.PathUnescape(seg)
		if err != nil {
			dec = seg
		}
		for _, part := range strings.FieldsFunc(dec, func(r rune) bool { return r == '/' || r == '\\' }) {
			if part == "." || part == ".." {
				return true
			}
		}
	}
	return false
}

func serve(w http.ResponseWriter, r *http.Request, t target) {
	hostPort := net.JoinHostPort("127.0.0.1", strconv.Itoa(t.port))
	// Read a small body before the round trip. Otherwise the transport is still reading
	// it (to see its EOF) when the server, flushing the response headers, discards and
	// closes it; the transport then drops the upstream connection and the response body
	// is lost (seen with servers that write headers and body apart, e.g. Python's).
	if r.ContentLength > 0 && r.ContentLength <= smallBody {
		buf, err := io.ReadAll(r.Body)
		if err != nil {
			api.WriteError(w, api.BadRequest("reading the request body: %v", err))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(buf))
	}
	rp := &httputil.ReverseProxy{
		Director: func(out *http.Request) {
			// A new URL: nothing of the request's (a host in an absolute-form target,
			// user info, an opaque part) can steer it anywhere but the sandbox's port.
			out.URL = &url.URL{Scheme: "http", Host: hostPort, Path: t.path, RawPath: t.rawPath, RawQuery: r.URL.RawQuery}
			// Servers such as Chromium's DevTools refuse a Host that is not an IP or localhost.
			out.Host = hostPort
			// The bearer token is the agent's, never the app's.
			out.Header.Del("Authorization")
			// A front proxy (the Orchard service) knows the public names better: keep its values.
			setDefault(out.Header, "X-Forwarded-Host", r.Host)
			proto := "http"
			if r.TLS != nil {
				proto = "https"
			}
			setDefault(out.Header, "X-Forwarded-Proto", proto)
			setDefault(out.Header, "X-Forwarded-Prefix", prefix+strconv.Itoa(t.port))
		},
		Transport: transport,
		// Flush every write: server-sent events, NDJSON and long polls pass promptly.
		FlushInterval: -1,
		ErrorLog:      errorLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away; nobody to answer
			}
			api.WriteError(w, api.Errf(http.StatusBadGateway, "bad_gateway",
				"nothing answered on %s: %v", hostPort, err))
		},
	}
	rp.ServeHTTP(w, r)
}

func setDefault(h http.Header, key, value string) {
	if h.Get(key) == "" && value != "" {
		h.Set(key, value)
	}
}
