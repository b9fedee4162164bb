//go:build !linux

package proc

import (
	"errors"
	"os"
)

var errNoPTY = errors.New("terminals are only supported on Linux")

func openPTY(rows, cols int) (master, slave *os.File, err error) { return nil, nil, errNoPTY }

func resizePTY(master *os.File, rows, cols int) error { return errNoPTY }
