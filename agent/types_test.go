package main

import (
	execapi "github.com/orchard-env/orchard/agent/internal/exec"
	"github.com/orchard-env/orchard/agent/internal/proc"
)

// The wire types the end-to-end tests decode, under the names they use.
type (
	execResult   = execapi.ExecResult
	procInfo     = proc.Info
	outputResult = execapi.OutputResult
)
