//go:build !amd64 && !arm64

package seccomp

// native reports that this architecture has no filter.
func native() (arch, bool) { return arch{}, false }
