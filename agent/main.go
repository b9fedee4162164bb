// Command orchard-agent is the in-sandbox agent: the sandbox's first process,
// serving exec, background processes, PTYs, files and a port proxy over
// HTTP on a Unix socket and/or TCP (docs/agent-api.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/orchard-env/orchard/agent/internal/api"
	execapi "github.com/orchard-env/orchard/agent/internal/exec"
	"github.com/orchard-env/orchard/agent/internal/files"
	"github.com/orchard-env/orchard/agent/internal/proc"
	"github.com/orchard-env/orchard/agent/internal/proxy"
)

// version is set at build time: -ldflags "-X main.version=...".
var version = "dev"

const (
	defaultMaxOutput = 1 << 20
	shutdownGrace    = 5 * time.Second
)

type config struct {
	listen    string
	socket    string
	token     string
	spillDir  string
	ownDir    string // made 0755 at start (a pod's emptyDir; see usage)
	maxOutput int
	user      string
	logFile   string
	maxProcs  int // threads running Go code at once (GOMAXPROCS); 0: the runtime's default
	entry     []string
	// An address the sandbox's network policy denies: nothing starts while it answers.
	waitClosed string
}

// loadConfig reads flags, falling back to ORCHARD_AGENT_* variables.
func loadConfig(args []string, getenv func(string) string) (*config, error) {
	fs := flag.NewFlagSet("orchard-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg := &config{}
	var raw rawFlags
	defineFlags(fs, cfg, &raw, getenv)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	cfg.entry = fs.Args()
	if cfg.listen == "" && cfg.socket == "" {
		return nil, errors.New("nothing to listen on: give --listen and/or --socket")
	}
	if cfg.spillDir == "" {
		cfg.spillDir = proc.DefaultSpillDir
	}
	cfg.maxOutput = defaultMaxOutput
	if maxOutput := raw.maxOutput; maxOutput != "" {
		n, err := strconv.Atoi(maxOutput)
		if err != nil || n < 2 {
			return nil, fmt.Errorf("--max-output %q: want a byte count of at least 2", maxOutput)
		}
		cfg.maxOutput = n
	}
	if cpus := raw.cpus; cpus != "" {
		n, err := strconv.ParseFloat(cpus, 64)
		if err != nil || !(n > 0) || n > 1<<16 {
			return nil, fmt.Errorf("--cpus %q: want a positive number of cores", cpus)
		}
		// A sandbox limited to one core gains nothing from a second P: the runtime
		// would only wake and park threads for it (cgroup v1 hosts; Go >= 1.25 does
		// this itself for modules that ask for it).
		cfg.maxProcs = int(n)
		if float64(cfg.maxProcs) < n {
			cfg.maxProcs++
		}
	}
	cfg.token = getenv("ORCHARD_AGENT_TOKEN")
	if raw.tokenFile != "" {
		b, err := os.ReadFile(raw.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		cfg.token = string(b)
	}
	cfg.token = strings.TrimSpace(cfg.token)
	if cfg.token == "" {
		return nil, errors.New("no token: set ORCHARD_AGENT_TOKEN or --token-file; the agent never serves unauthenticated")
	}
	return cfg, nil
}

// agent is the state shared by the handlers.
type agent struct {
	spill   *proc.SpillDir
	baseEnv []string
	started time.Time
	exec    *execapi.Handler
	gate    *tokenGate
	reaper  *proc.Reaper
	retired atomic.Bool // POST /retire: every process killed, nothing served but /health
}

func newAgent(cfg *config, r *proc.Reaper) *agent {
	a := &agent{
		spill: proc.NewSpillDir(cfg.spillDir), baseEnv: proc.ScrubbedEnv(os.Environ()), started: time.Now(),
		gate: newTokenGate(cfg.token), reaper: r,
	}
	a.exec = execapi.New(execapi.Config{
		Reaper: r, Spill: a.spill, MaxOutput: cfg.maxOutput, User: cfg.user, BaseEnv: a.baseEnv,
	})
	return a
}

// routes wires the handlers; agentPorts are the agent's own TCP ports.
func (a *agent) routes(agentPorts ...int) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", a.handleHealth)
	mux.HandleFunc("/token", a.gate.handleToken)
	mux.HandleFunc("/retire", a.handleRetire)
	a.exec.Register(mux)
	files.Register(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		api.WriteError(w, api.NotFound("no route %s", r.URL.Path))
	})
	// The port proxy sees its path before the mux cleans it: a dot segment must be
	// refused there, never resolved into one of the agent's own routes.
	return a.refuseRetired(proxy.Route(mux, agentPorts...))
}

// handleRetire ends the sandbox's life but not the agent's: every process is killed
// (as PID 1, every one in the namespace) and from now on only /health answers. The
// Kubernetes backend retires a deleted sandbox this way and removes its pod once the
// node is quiet (docs/kubernetes.md, "Deletes"): the pod's teardown costs the node
// about as much as its start, and a burst should not pay for it.
func (a *agent) handleRetire(w http.ResponseWriter, r *http.Request) {
	if !api.RequireMethod(w, r, http.MethodPost) {
		return
	}
	a.retired.Store(true)
	a.reaper.Shutdown(syscall.SIGKILL, time.Second)
	w.WriteHeader(http.StatusNoContent)
}

// refuseRetired answers 410 to everything but /health and /retire once retired.
func (a *agent) refuseRetired(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.retired.Load() && r.URL.Path != "/health" && r.URL.Path != "/retire" {
			api.WriteError(w, api.Errf(http.StatusGone, "retired", "this sandbox was deleted"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *agent) handleHealth(w http.ResponseWriter, r *http.Request) {
	if !api.RequireMethod(w, r, http.MethodGet, http.MethodHead) {
		return
	}
	api.WriteJSON(w, http.StatusOK, health{
		Status: "ok", Version: version, PID: os.Getpid(),
		UptimeS: time.Since(a.started).Seconds(),
	})
}

// health is the open GET /health answer (models.AgentHealth).
type health struct {
	Status  string  `json:"status"`
	Version string  `json:"version"`
	UptimeS float64 `json:"uptime_s"`
	PID     int     `json:"pid"`
}

// requireToken lets only GET /health through without the bearer token.
func requireToken(gate *tokenGate, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			next.ServeHTTP(w, r)
			return
		}
		if !gate.ok(r.Header.Get("Authorization")) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="orchard-agent"`)
			api.WriteError(w, api.Errf(http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// listenUnix binds path, replacing a stale socket left by an earlier run.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		_ = os.Remove(path)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// The token, not file permissions, guards the agent; the host-side
	// service may connect as any user.
	_ = os.Chmod(path, 0o666)
	return l, nil
}

func main() { os.Exit(run(os.Args[1:])) }

// closeOwnDir makes dir 0755: a Kubernetes emptyDir starts 0777 (root's), where any
// sandbox user could plant files beside the agent's. Only the mode, as orchard-boot does:
// a chown would fail where root is a user namespace's.
func closeOwnDir(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("own folder: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("own folder %s is not a folder", dir)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("own folder: %w", err)
	}
	return nil
}

// spareThreads OS threads are made at start and kept idle by the Go runtime, so a fork
// bomb that takes every pid of the sandbox's limit cannot leave the agent unable to start
// the thread a blocking syscall needs (the runtime exits when thread creation fails).
const spareThreads = 8

// prespawnThreads makes n OS threads now: each goroutine is pinned to its own thread until
// all have one, then unpinned, and the threads stay in the runtime's idle pool.
func prespawnThreads(n int) {
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			ready.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	ready.Wait()
	close(release)
	done.Wait()
}

func run(args []string) int {
	log.SetFlags(0)
	log.SetPrefix("orchard-agent: ")
	// Signals are caught first so a SIGTERM during start-up is not lost.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	// Caught (not ignored, which children would inherit): a closed stdout
	// then yields EPIPE instead of killing the sandbox's PID 1.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	proc.CatchInheritedIgnores()
	prespawnThreads(spareThreads)
	cfg, err := loadConfig(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		writeUsage(os.Stdout)
		return 0
	}
	if err != nil {
		log.Printf("%v (orchard-agent -h: usage)", err)
		return 2
	}
	if cfg.maxProcs > 0 {
		runtime.GOMAXPROCS(cfg.maxProcs)
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "ORCHARD_AGENT_") {
			_ = os.Unsetenv(k)
		}
	}
	if os.Getpid() != 1 {
		proc.BecomeSubreaper()
	}
	r := proc.NewReaper(true)
	a := newAgent(cfg, r)
	// Closed, then the spill folder made in it, before any command runs, so no sandbox
	// user can plant or swap a path first.
	if cfg.ownDir != "" {
		if err := closeOwnDir(cfg.ownDir); err != nil {
			log.Print(err)
			return 1
		}
	}
	if err := a.spill.Prepare(); err != nil {
		log.Printf("spill folder: %v (truncated outputs will not be saved)", err)
	}

	if cfg.waitClosed != "" {
		if err := waitClosed(cfg.waitClosed, egressWait, 300*time.Millisecond); err != nil {
			log.Print(err)
			return 1
		}
	}

	var listeners []net.Listener
	var tcpPorts []int
	if cfg.socket != "" {
		l, err := listenUnix(cfg.socket)
		if err != nil {
			log.Printf("listen on %s: %v", cfg.socket, err)
			return 1
		}
		listeners = append(listeners, l)
	}
	if cfg.listen != "" {
		l, err := net.Listen("tcp", cfg.listen)
		if err != nil {
			log.Printf("listen on %s: %v", cfg.listen, err)
			return 1
		}
		listeners = append(listeners, l)
		tcpPorts = append(tcpPorts, l.Addr().(*net.TCPAddr).Port)
	}
	srv := &http.Server{
		Handler:           requireToken(a.gate, a.routes(tcpPorts...)),
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	for _, l := range listeners {
		go func(l net.Listener) { _ = srv.Serve(l) }(l)
	}
	if cfg.logFile != "" {
		// Output opened inside the sandbox, not a host file runc handed over: what a
		// memory snapshot (CRIU) can keep and restore in a copy (docs/state.md).
		if err := redirectOutput(cfg.logFile); err != nil {
			log.Printf("log file %s: %v (output stays where it was)", cfg.logFile, err)
		}
	}
	if len(cfg.entry) > 0 {
		if err := r.StartEntrypoint(cfg.entry, a.baseEnv, cfg.user); err != nil {
			log.Printf("entrypoint %q not started: %v", cfg.entry[0], err)
		}
	}

	sig := <-sigs
	log.Printf("%v: stopping children", sig)
	stopped := make(chan struct{})
	go func() {
		r.Shutdown(sig.(syscall.Signal), shutdownGrace)
		close(stopped)
	}()
	// Shutdown lets open streams finish (they end as their processes exit);
	// once the children are gone, whatever is still open is closed.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-stopped
		time.Sleep(100 * time.Millisecond)
		cancel()
	}()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
	}
	<-stopped
	if cfg.socket != "" {
		_ = os.Remove(cfg.socket)
	}
	return 0
}
