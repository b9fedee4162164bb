// Command orchard-inject copies the agent binary into a shared volume.
//
// The injector image is FROM scratch: it has no shell and no cp, only the agent and this
// program, which the sandbox pod's init container runs as
//
//	orchard-inject /orchard-agent /.orchard/orchard-agent
//
// The copy is written to a temporary name and renamed, so the sandbox container never
// sees a half-written binary. The folder is then closed to 0755 (the kubelet makes an
// emptyDir world-writable), so no user in the sandbox can replace the root agent.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func install(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".inject-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	return os.Chmod(filepath.Dir(dst), 0o755)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: orchard-inject SRC DST")
		os.Exit(2)
	}
	if err := install(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "orchard-inject:", err)
		os.Exit(1)
	}
}
