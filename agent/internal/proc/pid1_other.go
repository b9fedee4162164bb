//go:build !linux

package proc

// BecomeSubreaper needs prctl(2), which only Linux has; elsewhere orphans go to init.
func BecomeSubreaper() {}

// CatchInheritedIgnores reads /proc/self/status, which only Linux has.
func CatchInheritedIgnores() {}
