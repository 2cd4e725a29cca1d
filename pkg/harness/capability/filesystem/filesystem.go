// Package filesystem is the Filesystem capability of a sandbox agent: the
// apply_patch tool, which edits workspace files with a V4A patch that the
// sandbox daemon applies all-or-nothing, and the view_image tool, which
// shows the model an image file from the workspace.
//
// Both tools work through the daemon client of the call (tool.Context.Agent)
// as the run's user (RunAs), with relative paths resolved against the run's
// working directory (Workdir). What the model sees on failure names only the
// paths it wrote, never a host path.
package filesystem

import (
	"fmt"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Name is the capability's name.
const Name = "filesystem"

// DefaultMaxImageBytes is the largest image view_image returns by default
// (10 MiB, the reference's cap).
const DefaultMaxImageBytes = 10 << 20

// PatchFormat is the shape in which apply_patch is offered to the model.
type PatchFormat int

const (
	// PatchFreeform offers apply_patch as a custom (freeform) tool whose
	// input is a whole "*** Begin Patch" text, constrained by the V4A Lark
	// grammar. It is the default.
	PatchFreeform PatchFormat = iota
	// PatchJSON offers apply_patch as a function tool taking per-file
	// operations ({"operations": [{"type", "path", "diff", "move_to"}]}),
	// for models or endpoints without custom tools.
	PatchJSON
)

// String names the format.
func (f PatchFormat) String() string {
	switch f {
	case PatchFreeform:
		return "freeform"
	case PatchJSON:
		return "json"
	}
	return fmt.Sprintf("PatchFormat(%d)", int(f))
}

// Options configure the capability.
type Options struct {
	// PatchFormat selects the apply_patch tool shape; the zero value is
	// PatchFreeform.
	PatchFormat PatchFormat
	// MaxImageBytes caps the size of a file view_image reads; zero or less
	// means DefaultMaxImageBytes.
	MaxImageBytes int64
}

// withDefaults fills unset options.
func (o Options) withDefaults() Options {
	if o.MaxImageBytes <= 0 {
		o.MaxImageBytes = DefaultMaxImageBytes
	}
	return o
}

// Filesystem is the capability. It holds no per-run state.
type Filesystem struct {
	opts Options
}

var _ capability.Capability = (*Filesystem)(nil)

// New returns the Filesystem capability.
func New(opts Options) capability.Capability {
	return &Filesystem{opts: opts.withDefaults()}
}

// Name returns "filesystem".
func (f *Filesystem) Name() string { return Name }

// Clone returns a copy; the capability keeps no per-run state.
func (f *Filesystem) Clone() capability.Capability {
	c := *f
	return &c
}

// Tools returns apply_patch and view_image, or nothing for a run without a
// sandbox session.
func (f *Filesystem) Tools(env capability.Env) []tool.Tool {
	if !env.HasSession {
		return nil
	}
	return []tool.Tool{
		&applyPatchTool{format: f.opts.PatchFormat},
		&viewImageTool{maxBytes: f.opts.MaxImageBytes},
	}
}

// Instructions returns the fragment telling the model how to use the tools
// ("" without a session).
func (f *Filesystem) Instructions(env capability.Env) string {
	if !env.HasSession {
		return ""
	}
	var b strings.Builder
	b.WriteString("Working with files:\n")
	switch f.opts.PatchFormat {
	case PatchJSON:
		b.WriteString("- Create, edit, rename and delete files with `apply_patch`, giving a list of file operations " +
			"(`create_file`, `update_file`, `delete_file`) whose diffs use the V4A patch format.\n")
	default:
		b.WriteString("- Create, edit, rename and delete files with `apply_patch`, sending the patch text itself " +
			"(`*** Begin Patch` ... `*** End Patch`), not JSON.\n")
	}
	b.WriteString("- Copy context and removed lines exactly from the current file; read the file first if you are not sure of its contents.\n")
	b.WriteString("- A patch is applied completely or not at all. When it is rejected nothing has changed: " +
		"read the message (it names the file and the lines that did not match), fix the patch, and send it again.\n")
	b.WriteString("- Relative paths in `apply_patch` and `view_image` are resolved from the working directory " +
		"and must stay inside the workspace.\n")
	fmt.Fprintf(&b, "- To look at an image in the workspace (PNG, JPEG, GIF or WebP, up to %s), use `view_image` "+
		"instead of printing its bytes.", sizeText(f.opts.MaxImageBytes))
	return b.String()
}

// ProcessManifest returns m unchanged: the capability needs no entry.
func (f *Filesystem) ProcessManifest(m *manifest.Manifest) (*manifest.Manifest, error) {
	return m, nil
}

// sizeText renders a byte cap the way the reference words it ("10MB").
func sizeText(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%dMB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
