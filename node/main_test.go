package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "key")
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(good, []byte("a key of at least sixteen bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		err  string
	}{
		{name: "from the environment", env: map[string]string{"ORCHARD_NODE_NAME": "node-a", "ORCHARD_NODE_KEY_FILE": good}},
		{name: "from flags", args: []string{"--node", "node-a", "--key-file", good, "--listen", ":1"}},
		{name: "no node name", args: []string{"--key-file", good}, err: "node's name is required"},
		{name: "no key", args: []string{"--node", "n", "--key-file", filepath.Join(dir, "none")}, err: "reading the key"},
		{name: "a short key", args: []string{"--node", "n", "--key-file", short}, err: "shorter than 16"},
		{name: "an unknown flag", args: []string{"--what"}, err: "not defined"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, _, err := loadConfig(tc.args, func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The trailing newline of a Secret file is not part of the key.
			if n.token != nodeToken([]byte("a key of at least sixteen bytes"), "node-a") {
				t.Fatal("the token is not this node's")
			}
			if n.containerdMount != n.containerdRoot {
				t.Fatalf("containerd mount %q", n.containerdMount)
			}
		})
	}
}
