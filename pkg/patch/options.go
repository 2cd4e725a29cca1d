package patch

// Default limits. They are generous for patches a model writes and small
// enough that one patch cannot make the daemon use unbounded memory or time.
const (
	DefaultMaxPatchBytes = 8 << 20   // 8 MiB of patch text (or of all diffs)
	DefaultMaxOperations = 1000      // file operations in one patch
	DefaultMaxFileBytes  = 16 << 20  // 16 MiB for any one file read or produced
	DefaultMaxTotalBytes = 256 << 20 // 256 MiB read plus produced for the whole patch
	DefaultMaxScanLines  = 50000000  // file lines examined by the matcher for the whole patch
)

// Options bound the work done for one patch. A zero field takes its default,
// so Options{} is the usual value. Exceeding a limit gives an *Error wrapping
// compute.ErrResourceExhausted.
type Options struct {
	// MaxPatchBytes limits the patch text, or the summed diffs of the
	// per-file operation form.
	MaxPatchBytes int
	// MaxOperations limits the number of file operations.
	MaxOperations int
	// MaxFileBytes limits each file read through the Source and each file
	// content the plan produces.
	MaxFileBytes int
	// MaxTotalBytes limits all bytes read plus all bytes produced.
	MaxTotalBytes int
	// MaxScanLines limits the file lines the matcher may examine over the
	// whole patch, counting each pass separately. A well-formed patch on a
	// 10,000-line file uses a few tens of thousands.
	MaxScanLines int
}

// withDefaults returns o with every zero (or negative) field set to its
// default.
func (o Options) withDefaults() Options {
	if o.MaxPatchBytes <= 0 {
		o.MaxPatchBytes = DefaultMaxPatchBytes
	}
	if o.MaxOperations <= 0 {
		o.MaxOperations = DefaultMaxOperations
	}
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.MaxTotalBytes <= 0 {
		o.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if o.MaxScanLines <= 0 {
		o.MaxScanLines = DefaultMaxScanLines
	}
	return o
}
