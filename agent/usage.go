package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/orchard-env/orchard/agent/internal/proc"
)

// rawFlags are the flags parsed as text, checked by loadConfig.
type rawFlags struct {
	tokenFile, maxOutput, cpus string
}

// envName is the variable a flag falls back to: --spill-dir reads ORCHARD_AGENT_SPILL_DIR.
func envName(flagName string) string {
	return "ORCHARD_AGENT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// defineFlags declares the agent's flags on fs, each defaulting to its ORCHARD_AGENT_*
// variable, else to the built-in default that -h shows.
func defineFlags(fs *flag.FlagSet, cfg *config, raw *rawFlags, getenv func(string) string) {
	str := func(p *string, name, def, usage string) {
		if v := getenv(envName(name)); v != "" {
			def = v
		}
		fs.StringVar(p, name, def, usage)
	}
	str(&cfg.listen, "listen", "", "TCP `address` to listen on, e.g. :9090")
	str(&cfg.socket, "socket", "", "Unix socket `path` to listen on")
	str(&raw.tokenFile, "token-file", "", "`file` holding the bearer token (else $ORCHARD_AGENT_TOKEN)")
	str(&cfg.spillDir, "spill-dir", proc.DefaultSpillDir, "`folder` for full outputs of capped streams")
	str(&cfg.ownDir, "own-dir", "", "`folder` made 0755 before anything runs (Kubernetes: the pod's emptyDir, which the kubelet makes 0777)")
	str(&cfg.user, "user", "", "default `user` (uid[:gid] or name) for commands and the entrypoint, e.g. the image's USER")
	str(&cfg.logFile, "log", "", "`file` (appended) that the agent's and the entrypoint's stdout and stderr go to once started")
	str(&raw.maxOutput, "max-output", strconv.Itoa(defaultMaxOutput), "per-stream cap for blocking exec, in `bytes`")
	str(&raw.cpus, "cpus", "", "the sandbox's CPU limit in `cores` (e.g. 0.5): Go code runs on that many threads, rounded up")
	str(&cfg.waitClosed, "wait-closed", "", "serve nothing and start no entrypoint until a TCP connection to this `host:port` fails: the sandbox's network policy is in force (Kubernetes programs it after the pod starts); exit 1 if it is still open after 60 s")
}

const usageHead = `orchard-agent %s: Orchard's in-sandbox agent (docs/agent-api.md).

It runs as a sandbox's first process and serves exec, background processes, PTYs,
files and a port proxy over HTTP on a Unix socket and/or TCP. Every request but
GET /health needs the bearer token. Arguments after the flags are the image's
entrypoint and command, started as the agent's child.

Usage:
  ORCHARD_AGENT_TOKEN=TOKEN orchard-agent --socket PATH [flags] [-- ENTRYPOINT [ARG...]]
  orchard-agent --listen :9090 --token-file FILE [flags] [-- ENTRYPOINT [ARG...]]

The Orchard service starts it: the docker and local backends with --socket in a
per-sandbox host folder, Kubernetes with --listen on the pod IP. At least one of
--socket and --listen is required, and a token.

Flags (each also read from ORCHARD_AGENT_<NAME>, e.g. --spill-dir from
ORCHARD_AGENT_SPILL_DIR; a flag given wins):
`

// writeUsage prints what -h shows: what the agent is, how it is started, its flags and
// their built-in defaults (not this environment's).
func writeUsage(w io.Writer) {
	fs := flag.NewFlagSet("orchard-agent", flag.ContinueOnError)
	defineFlags(fs, &config{}, &rawFlags{}, func(string) string { return "" })
	fmt.Fprintf(w, usageHead, version)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintf(w, "\nEnvironment:\n  ORCHARD_AGENT_TOKEN\n    \tthe bearer token, when no --token-file is given\n")
}
