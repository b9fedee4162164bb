//go:build !linux

package files

import "syscall"

// The agent runs only on Linux; off it the file API's writes answer ENOSYS, and this
// file exists so that `GOOS=darwin go vet` and `go build` pass (docs/agent-api.md).

const (
	oPath             = 0
	atRemoveDir       = 0x200
	atSymlinkNoFollow = 0x100
)

func openat(int, string, int, uint32) (int, error) { return -1, syscall.ENOSYS }
func openRootFd() (int, error)                     { return -1, syscall.ENOSYS }
func closeFd(fd int)                               { _ = syscall.Close(fd) }
func fstatFd(int) (entry, error)                   { return entry{}, syscall.ENOSYS }
func readlinkat(int, string) (string, error)       { return "", syscall.ENOSYS }
func mkdirat(int, string, uint32) error            { return syscall.ENOSYS }
func mkfifoat(int, string, uint32) error           { return syscall.ENOSYS }
func renameat(int, string, int, string) error      { return syscall.ENOSYS }
func fchownat(int, string, int, int, int) error    { return syscall.ENOSYS }
func unlinkat(int, string, int) error              { return syscall.ENOSYS }
func linkat(int, string, int, string) error        { return syscall.ENOSYS }
func symlinkat(string, int, string) error          { return syscall.ENOSYS }
func setTimes(int, int64)                          {}
