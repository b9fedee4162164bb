package proxy

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

func newAgent(t *testing.T, agentPorts ...int) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "agent route "+r.URL.Path, http.StatusGone)
	})
	srv := httptest.NewServer(Route(mux, agentPorts...))
	t.Cleanup(srv.Close)
	return srv
}

// backend starts a loopback server and returns its port.
func backend(t *testing.T, h http.Handler) int {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	_, port, _ := net.SplitHostPort(u.Host)
	var n int
	fmt.Sscan(port, &n)
	return n
}

type seen struct {
	Method, Path, RawPath, Query, Body, Host string
	Header                                   http.Header
}

func TestForwardsRequests(t *testing.T) {
	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Backend", "yes")
		w.WriteHeader(http.StatusTeapot)
		_ = json.NewEncoder(w).Encode(seen{r.Method, r.URL.Path, r.URL.EscapedPath(), r.URL.RawQuery, string(b), r.Host, r.Header})
	}))
	agent := newAgent(t)
	cases := []struct {
		method, path, query, body string
		wantPath, wantRaw         string
	}{
		{"GET", "", "", "", "/", "/"},
		{"GET", "/", "a=1", "", "/", "/"},
		{"POST", "/api/v1/items", "a=1&b=two%20words&a=3", `{"k":"v"}`, "/api/v1/items", "/api/v1/items"},
		{"PATCH", "/x%2Fy/z", "", "patch body", "/x/y/z", "/x%2Fy/z"},
		{"DELETE", "/unicode/%E2%9C%93", "q=%E2%9C%93", "", "/unicode/✓", "/unicode/%E2%9C%93"},
		{"PUT", "/trailing/", "", strings.Repeat("b", 100000), "/trailing/", "/trailing/"},
	}
	for _, tc := range cases {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			u := fmt.Sprintf("%s/proxy/%d%s", agent.URL, port, tc.path)
			if tc.query != "" {
				u += "?" + tc.query
			}
			req, err := http.NewRequest(tc.method, u, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer agent-secret")
			req.Header.Set("X-Custom", "kept")
			req.Header.Add("X-Multi", "1")
			req.Header.Add("X-Multi", "2")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusTeapot || resp.Header.Get("X-Backend") != "yes" {
				t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
			}
			var s seen
			if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
				t.Fatal(err)
			}
			hostPort := fmt.Sprintf("127.0.0.1:%d", port)
			agentHost := strings.TrimPrefix(agent.URL, "http://")
			checks := []struct{ name, got, want string }{
				{"method", s.Method, tc.method},
				{"path", s.Path, tc.wantPath},
				{"escaped path", s.RawPath, tc.wantRaw},
				{"query", s.Query, tc.query},
				{"body", s.Body, tc.body},
				{"host", s.Host, hostPort},
				{"authorization", s.Header.Get("Authorization"), ""},
				{"custom header", s.Header.Get("X-Custom"), "kept"},
				{"repeated header", strings.Join(s.Header.Values("X-Multi"), ","), "1,2"},
				{"forwarded host", s.Header.Get("X-Forwarded-Host"), agentHost},
				{"forwarded proto", s.Header.Get("X-Forwarded-Proto"), "http"},
				{"forwarded prefix", s.Header.Get("X-Forwarded-Prefix"), fmt.Sprintf("/proxy/%d", port)},
				{"forwarded for", s.Header.Get("X-Forwarded-For"), "127.0.0.1"},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s: got %q, want %q", c.name, c.got, c.want)
				}
			}
		})
	}
}

// A front proxy's X-Forwarded-* values describe the public side better and are kept.
func TestKeepsFrontProxyForwardedHeaders(t *testing.T) {
	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.Header.Get("X-Forwarded-Host"), "|", r.Header.Get("X-Forwarded-Proto"), "|",
			r.Header.Get("X-Forwarded-Prefix"))
	}))
	agent := newAgent(t)
	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/proxy/%d/", agent.URL, port), nil)
	req.Header.Set("X-Forwarded-Host", "orchard.example")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("X-Forwarded-Prefix", "/v1/sandboxes/sb-1/proxy/8080")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "orchard.example|https|/v1/sandboxes/sb-1/proxy/8080" {
		t.Fatalf("got %q", b)
	}
}

func TestBadPorts(t *testing.T) {
	agent := newAgent(t)
	for _, p := range []string{"/proxy/", "/proxy/0", "/proxy/65536/x", "/proxy/abc/", "/proxy/-1/", "/proxy/+80/", "/proxy/80x/", "/proxy/99999999999999999999/"} {
		resp, err := http.Get(agent.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), `"bad_request"`) {
			t.Errorf("%s: %d %s", p, resp.StatusCode, b)
		}
	}
}

func TestBadGateway(t *testing.T) {
	// A port that was just free: nothing listens there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	agent := newAgent(t)
	resp, err := http.Post(fmt.Sprintf("%s/proxy/%d/x", agent.URL, port), "text/plain", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadGateway || e.Error.Code != "bad_gateway" {
		t.Fatalf("%d %+v", resp.StatusCode, e)
	}
}

// TestStreamsResponses checks each chunk arrives while the backend is still writing.
func TestStreamsResponses(t *testing.T) {
	release := make(chan struct{})
	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", r.URL.Query().Get("ct"))
		if r.URL.Query().Get("sized") != "" {
			w.Header().Set("Content-Length", "29")
		}
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: second\n\n")
	}))
	agent := newAgent(t)
	// Event streams and chunked bodies; a body with a Content-Length relies on FlushInterval -1.
	for _, q := range []string{"ct=text/event-stream", "ct=application/octet-stream", "ct=text/plain&sized=1"} {
		t.Run(q, func(t *testing.T) {
			// The deadline covers the headers too: a proxy that buffers sends nothing at all.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/proxy/%d/events?%s", agent.URL, port, q), nil)
			type first struct {
				resp *http.Response
				br   *bufio.Reader
				line string
				err  error
			}
			got := make(chan first, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					got <- first{err: err}
					return
				}
				br := bufio.NewReader(resp.Body)
				line, err := br.ReadString('\n')
				got <- first{resp, br, line, err}
			}()
			var f first
			select {
			case f = <-got:
			case <-time.After(5 * time.Second):
				cancel() // unblocks the backend through the proxy
				t.Fatal("first chunk was held back until the response ended")
			}
			if f.err != nil || f.line != "data: first\n" {
				t.Fatalf("first line %q: %v", f.line, f.err)
			}
			defer f.resp.Body.Close()
			br := f.br
			release <- struct{}{}
			rest, _ := io.ReadAll(br)
			if string(rest) != "\ndata: second\n\n" {
				t.Fatalf("rest %q", rest)
			}
		})
	}
}

const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + wsGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

// readFrame reads one small (< 126 bytes) WebSocket frame and unmasks it.
func readFrame(r io.Reader) (opcode byte, masked bool, payload []byte, err error) {
	var hdr [2]byte
	if _, err = io.ReadFull(r, hdr[:]); err != nil {
		return
	}
	opcode, masked = hdr[0]&0x0f, hdr[1]&0x80 != 0
	n := int(hdr[1] & 0x7f)
	if n >= 126 {
		return 0, false, nil, fmt.Errorf("frame too long for this test: %d", n)
	}
	var key [4]byte
	if masked {
		if _, err = io.ReadFull(r, key[:]); err != nil {
			return
		}
	}
	payload = make([]byte, n)
	if _, err = io.ReadFull(r, payload); err != nil {
		return
	}
	if masked {
		for i := range payload {
			payload[i] ^= key[i%4]
		}
	}
	return
}

// writeFrame writes one final text frame, masked as clients must.
func writeFrame(w io.Writer, payload []byte, mask bool) error {
	frame := []byte{0x81, byte(len(payload))}
	if !mask {
		return write(w, append(frame, payload...))
	}
	frame[1] |= 0x80
	var key [4]byte
	if _, err := rand.Read(key[:]); err != nil {
		return err
	}
	frame = append(frame, key[:]...)
	for i, b := range payload {
		frame = append(frame, b^key[i%4])
	}
	return write(w, frame)
}

func write(w io.Writer, b []byte) error {
	_, err := w.Write(b)
	return err
}

// wsEcho is a minimal WebSocket server: it completes the handshake and echoes text
// frames, prefixed with the Authorization header it received (which must be empty).
func wsEcho(t *testing.T) int {
	return backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || r.URL.Path != "/ws" {
			http.Error(w, "not a websocket request", http.StatusBadRequest)
			return
		}
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Accept: %s\r\n\r\n", wsAccept(r.Header.Get("Sec-WebSocket-Key")))
		if rw.Flush() != nil {
			return
		}
		for {
			op, masked, payload, err := readFrame(rw)
			if err != nil || op == 0x8 || !masked {
				return
			}
			reply := fmt.Sprintf("auth=%q host=%s echo:%s", r.Header.Get("Authorization"), r.Host, payload)
			if writeFrame(rw, []byte(reply), false) != nil || rw.Flush() != nil {
				return
			}
		}
	}))
}

func TestWebSocketEcho(t *testing.T) {
	port := wsEcho(t)
	agent := newAgent(t)
	conn, err := net.Dial("tcp", strings.TrimPrefix(agent.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))

	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	fmt.Fprintf(conn, "GET /proxy/%d/ws HTTP/1.1\r\nHost: agent\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer agent-secret\r\n\r\n", port, key)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != wsAccept(key) {
		t.Fatalf("handshake: %d %v", resp.StatusCode, resp.Header)
	}
	for _, msg := range []string{"hello", "second message ✓"} {
		if err := writeFrame(conn, []byte(msg), true); err != nil {
			t.Fatal(err)
		}
		op, masked, payload, err := readFrame(br)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`auth="" host=127.0.0.1:%d echo:%s`, port, msg)
		if op != 0x1 || masked || string(payload) != want {
			t.Fatalf("frame op=%d masked=%v %q, want %q", op, masked, payload, want)
		}
	}
	// Close frame: the server hangs up and the proxy passes the close on.
	_ = write(conn, []byte{0x88, 0x80, 1, 2, 3, 4})
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after close: %v, want EOF", err)
	}
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		path, raw string
		port      int
		want      string
	}{
		{"/proxy/1", "", 1, "/"},
		{"/proxy/65535/a/b", "", 65535, "/a/b"},
		{"/proxy/8080/a%20b", "/proxy/8080/a%20b", 8080, "/a b"},
	} {
		u := &url.URL{Path: tc.path, RawPath: tc.raw}
		if tc.raw != "" {
			u.Path, _ = url.PathUnescape(tc.raw)
		}
		got, err := parseTarget(u)
		if err != nil || got.port != tc.port || got.path != tc.want {
			t.Errorf("%s: %+v %v", tc.path, got, err)
		}
	}
}

// A backend that sends the headers and, a moment later, the body used to lose the body
// now and then: the request body was still being read when the server discarded it.
func TestBodySentApartFromHeaders(t *testing.T) {
	body := strings.Repeat("y", 3000)
	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(time.Millisecond)
		_, _ = io.WriteString(w, body)
	}))
	agent := newAgent(t)
	for i := 0; i < 200; i++ {
		resp, err := http.Post(fmt.Sprintf("%s/proxy/%d/x", agent.URL, port), "application/json", strings.NewReader(`{"a":1}`))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != body {
			t.Fatalf("request %d: read %d bytes, err %v", i, len(got), err)
		}
	}
}

// Issue 17, hole 6: a dot segment in the proxy path, plain or escaped, is refused
// before anything is resolved; it never reaches one of the agent's own routes (this
// test's mux answers those with 410) nor the sandbox's server.
func TestRefusesDotSegments(t *testing.T) {
	hits := 0
	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		fmt.Fprint(w, r.URL.EscapedPath())
	}))
	agent := newAgent(t)
	p := fmt.Sprintf("/proxy/%d", port)
	for _, path := range []string{
		p + "/../../exec", p + "/..", p + "/./x", p + "/a/.", p + "/%2e%2e/%2e%2e/exec",
		p + "/%2E./exec", p + "/.%2e/exec", p + "/%2e/x", p + "/..%2fexec", p + "/..%2Fexec",
		p + "/x/..%5c..%5cexec", p + "/%2e%2e%5cexec", "/proxy/../exec", "/proxy/%2e%2e/exec",
	} {
		status, body := rawGet(t, agent, path)
		if status != 400 || !strings.Contains(body, `"bad_request"`) {
			t.Errorf("%s: %d %s", path, status, body)
		}
	}
	if hits != 0 {
		t.Fatalf("the sandbox's server saw %d refused requests", hits)
	}
	// Dots inside names are fine.
	for _, path := range []string{"/a..b/...c/.hidden/x%2Fy", "/v1.2/file.tar.gz", "/%2ehidden"} {
		if status, body := rawGet(t, agent, p+path); status != 200 || body != path {
			t.Errorf("%s: %d %s", path, status, body)
		}
	}
}

// rawGet sends path exactly as given (no client-side cleaning) and returns the answer.
func rawGet(t *testing.T, agent *httptest.Server, path string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", agent.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The upstream URL is built from the port alone: an absolute-form request naming
// another host still reaches 127.0.0.1:{port}, and the agent's own TCP port (where
// 127.0.0.1 is the agent itself) is refused.
func TestReachesOnlyTheSandboxPort(t *testing.T) {
	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "sandbox:", r.Host)
	}))
	agent := newAgent(t)
	status, body := rawGet(t, agent, fmt.Sprintf("http://elsewhere.example:81/proxy/%d/x", port))
	if want := fmt.Sprintf("sandbox:127.0.0.1:%d", port); status != 200 || body != want {
		t.Fatalf("absolute-form target: %d %q, want %q", status, body, want)
	}
	own := newAgent(t, port)
	if status, body := rawGet(t, own, fmt.Sprintf("/proxy/%d/x", port)); status != 400 || !strings.Contains(body, "agent's own") {
		t.Fatalf("the agent's own port: %d %s", status, body)
	}
	if _, err := dialLoopback(context.Background(), "tcp", "10.0.0.1:80"); err == nil {
		t.Fatal("the proxy must dial nothing but 127.0.0.1")
	}
}
