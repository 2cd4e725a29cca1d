// Package buildinfo carries the version and source revision stamped into the
// binaries at link time (make build sets them with -ldflags -X).
package buildinfo

// Stamped at link time; these are the only package-level variables the
// project has, and nothing assigns them at run time.
var (
	version = "dev"
	commit  = "unknown"
)

// Version returns the semantic version the binary was built as.
func Version() string { return version }

// Commit returns the source revision the binary was built from.
func Commit() string { return commit }
