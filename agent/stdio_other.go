//go:build !linux

package main

import "errors"

// redirectOutput is Linux-only (the agent runs in Linux sandboxes).
func redirectOutput(string) error { return errors.New("--log needs Linux") }
