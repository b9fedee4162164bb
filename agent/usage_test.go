package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// -h and -help print the usage on stdout and exit 0 (not "flag: help requested", 2).
func TestHelpPrintsUsage(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		t.Run(arg, func(t *testing.T) {
			cmd := exec.Command(agentBin, arg)
			// The usage shows the built-in defaults, not this environment's.
			cmd.Env = append(os.Environ(), "ORCHARD_AGENT_SPILL_DIR=/from/env")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v; stderr: %s", arg, err, stderr.String())
			}
			text := string(out)
			for _, want := range []string{
				"orchard-agent " + testVersion + ": Orchard's in-sandbox agent",
				"Usage:",
				"--socket PATH",
				"ORCHARD_AGENT_SPILL_DIR",
				"-listen address",
				"-socket path",
				"-token-file file",
				"-cpus cores",
				`(default "/.orchard/spill")`,
				`(default "1048576")`,
				"ORCHARD_AGENT_TOKEN",
			} {
				if !strings.Contains(text, want) {
					t.Errorf("usage lacks %q:\n%s", want, text)
				}
			}
			if strings.Contains(text, "/from/env") || strings.Contains(stderr.String(), "help requested") {
				t.Errorf("usage shows the environment or the bare flag error:\n%s\n%s", text, stderr.String())
			}
		})
	}
}

// Every flag the agent accepts falls back to the variable the usage names for it.
func TestFlagsFallBackToTheirVariables(t *testing.T) {
	env := map[string]string{
		"ORCHARD_AGENT_TOKEN": "x", "ORCHARD_AGENT_SOCKET": "/s", "ORCHARD_AGENT_LISTEN": ":1",
		"ORCHARD_AGENT_SPILL_DIR": "/sp", "ORCHARD_AGENT_USER": "1:2", "ORCHARD_AGENT_LOG": "/l",
		"ORCHARD_AGENT_MAX_OUTPUT": "10", "ORCHARD_AGENT_CPUS": "2",
	}
	cfg, err := loadConfig(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.socket != "/s" || cfg.listen != ":1" || cfg.spillDir != "/sp" || cfg.user != "1:2" ||
		cfg.logFile != "/l" || cfg.maxOutput != 10 || cfg.maxProcs != 2 {
		t.Fatalf("env not read: %+v", cfg)
	}
	cfg, err = loadConfig([]string{"--socket", "/s"}, func(k string) string {
		if k == "ORCHARD_AGENT_TOKEN" {
			return "x"
		}
		return ""
	})
	if err != nil || cfg.spillDir != "/.orchard/spill" || cfg.maxOutput != defaultMaxOutput {
		t.Fatalf("built-in defaults: %+v, %v", cfg, err)
	}
}
