// Package compaction is the Compaction capability: server-side context
// compaction on the OpenAI Responses API, for runs whose conversation would
// otherwise outgrow the model's context window.
//
// Every model request of the run gets a context management entry
//
//	"context_management": [{"type": "compaction", "compact_threshold": N}]
//
// Once the rendered conversation crosses N tokens the provider compacts it
// and returns, among the response's output items, an opaque compaction item
// ({"type": "compaction", "id": "...", "encrypted_content": "..."}). The
// runner keeps it in the conversation like any other output item, and it is
// passed back verbatim. From then on the capability leaves every item before
// the last compaction item out of what is sent: the compaction item carries
// that context forward (the OpenAI compaction guide's advice for stateless
// input chaining). The run's own record (RunState, RunInfo.Items) keeps
// every item; only the requests shrink.
//
// N is a fraction (DefaultFraction) of the model's context window, looked up
// by model name prefix in a table of known OpenAI models
// ([DefaultContextWindows]). A model the table does not know, or a request
// that names no model, gets DefaultUnknownThreshold (the reference SDK's
// static default). Options override the threshold, the fraction, the table,
// and what unknown models get, including nothing at all for endpoints that
// reject context_management. A compaction entry the request already carries
// (set by another capability) is left as it is.
//
// The capability has no tools and no instructions, and does not change the
// manifest. It follows the OpenAI Agents SDK's sandbox Compaction capability.
package compaction

import (
	"maps"
	"slices"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/capability"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/model"
	"github.com/bulkhead-dev/bulkhead/pkg/harness/tool"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// Name is the capability's name.
const Name = "compaction"

// Defaults.
const (
	// DefaultFraction is the share of a known model's context window at
	// which compaction triggers.
	DefaultFraction = 0.9
	// DefaultUnknownThreshold is the compaction threshold, in tokens, for
	// models not in the table. For a model whose window is smaller, it
	// never triggers (harmless: the request is as it would be without the
	// capability, apart from the parameter).
	DefaultUnknownThreshold int64 = 240_000
)

// DefaultContextWindows returns the table of known models' context windows
// in tokens, keyed by model name prefix (a fresh map on each call; the
// caller may change it and pass it as Options.ContextWindows).
//
// A prefix matches a model name equal to it or continuing it after a
// separator ("gpt-5" matches "gpt-5", "gpt-5-mini" and "gpt-5.2", never
// "gpt-50"); the longest matching prefix wins, so "gpt-5.4-mini" beats
// "gpt-5.4". Names are compared in lower case, after removing an "openai/"
// provider prefix and the "ft:" prefix of fine-tuned models.
func DefaultContextWindows() map[string]int64 {
	const (
		million = 1_047_576
		large   = 400_000
		oSeries = 200_000
		small   = 128_000
	)
	return map[string]int64{
		"gpt-4.1":      million,
		"gpt-5.4":      million,
		"gpt-5.5":      million,
		"gpt-5.6":      million,
		"gpt-5.4-mini": large,
		"gpt-5.4-nano": large,
		"gpt-5":        large,
		"gpt-5.1":      large,
		"gpt-5.2":      large,
		"gpt-5.3":      large,
		"gpt-5-chat":   small,
		"gpt-5.1-chat": small,
		"gpt-5.2-chat": small,
		"gpt-5.3-chat": small,
		"o1":           oSeries,
		"o1-mini":      small,
		"o1-preview":   small,
		"o3":           oSeries,
		"o4-mini":      oSeries,
		"codex-mini":   oSeries,
		"gpt-4o":       small,
		"chatgpt-4o":   small,
	}
}

// Options configure the capability. The zero value is the default: 90% of
// the context window of a known model, DefaultUnknownThreshold otherwise.
type Options struct {
	// Threshold, when positive, is the compaction threshold in tokens for
	// every model; the table, Fraction and UnknownThreshold are not used.
	Threshold int64
	// Fraction is the share of a known model's context window at which
	// compaction triggers; a value outside (0, 1] means DefaultFraction.
	Fraction float64
	// ContextWindows, when non-nil, replaces DefaultContextWindows: model
	// name prefix -> context window in tokens (entries that are not
	// positive are ignored). Start from DefaultContextWindows() to extend
	// the table rather than replace it.
	ContextWindows map[string]int64
	// UnknownThreshold is the threshold for a model the table does not
	// know and for a request naming no model: 0 means
	// DefaultUnknownThreshold; a negative value sends no compaction entry
	// for such models (for OpenAI-compatible endpoints that reject
	// context_management).
	UnknownThreshold int64
}

// ThresholdFor returns the compaction threshold for a model; ok is false
// when no compaction entry should be sent (an unknown model with a
// negative UnknownThreshold).
func (o Options) ThresholdFor(modelName string) (threshold int64, ok bool) {
	if o.Threshold > 0 {
		return o.Threshold, true
	}
	windows := o.ContextWindows
	if windows == nil {
		windows = DefaultContextWindows()
	}
	if w, known := lookup(windows, modelName); known {
		f := o.Fraction
		if !(f > 0 && f <= 1) {
			f = DefaultFraction
		}
		return max(1, int64(float64(w)*f)), true
	}
	switch {
	case o.UnknownThreshold < 0:
		return 0, false
	case o.UnknownThreshold == 0:
		return DefaultUnknownThreshold, true
	}
	return o.UnknownThreshold, true
}

// lookup finds the context window of the longest prefix in windows that
// matches modelName (see DefaultContextWindows).
func lookup(windows map[string]int64, modelName string) (window int64, ok bool) {
	name := normalize(modelName)
	if name == "" {
		return 0, false
	}
	best := -1
	for prefix, w := range windows {
		p := normalize(prefix)
		if w <= 0 || p == "" || len(p) <= best || !matches(name, p) {
			continue
		}
		best, window = len(p), w
	}
	return window, best >= 0
}

func normalize(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	name = strings.TrimPrefix(name, "openai/")
	return strings.TrimPrefix(name, "ft:")
}

// matches reports whether prefix p covers name: equal, or followed in name
// by a separator (or itself ending in one).
func matches(name, p string) bool {
	if !strings.HasPrefix(name, p) {
		return false
	}
	if len(name) == len(p) || !alnum(p[len(p)-1]) {
		return true
	}
	return !alnum(name[len(p)])
}

// alnum reports whether c is a lower-case letter or a digit (names are
// compared in lower case).
func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

// New returns the Compaction capability. It implements
// capability.RequestAdjuster (the context_management entry) and
// capability.InputFilter (dropping what a compaction made obsolete).
func New(opts Options) capability.Capability {
	if opts.ContextWindows != nil {
		opts.ContextWindows = maps.Clone(opts.ContextWindows)
	}
	return &compactor{opts: opts}
}

// compactor is the capability. It holds no per-run state: its options are
// never changed after New, so clones share them.
type compactor struct {
	opts Options
}

var (
	_ capability.Capability      = (*compactor)(nil)
	_ capability.RequestAdjuster = (*compactor)(nil)
	_ capability.InputFilter     = (*compactor)(nil)
)

// Name implements capability.Capability.
func (c *compactor) Name() string { return Name }

// Clone implements capability.Capability.
func (c *compactor) Clone() capability.Capability { return &compactor{opts: c.opts} }

// Tools implements capability.Capability: there are none.
func (c *compactor) Tools(capability.Env) []tool.Tool { return nil }

// Instructions implements capability.Capability: there are none; the
// compaction is invisible to the model.
func (c *compactor) Instructions(capability.Env) string { return "" }

// ProcessManifest implements capability.Capability: the manifest is not
// changed.
func (c *compactor) ProcessManifest(m *manifest.Manifest) (*manifest.Manifest, error) { return m, nil }

// AdjustRequest implements capability.RequestAdjuster: it adds the
// compaction entry for the request's model, unless the request already has
// one. The request's ContextManagement slice is replaced, never written
// into.
func (c *compactor) AdjustRequest(req *model.Request) {
	for _, cm := range req.ContextManagement {
		if cm.Type == model.ContextCompaction {
			return
		}
	}
	threshold, ok := c.opts.ThresholdFor(req.Model)
	if !ok {
		return
	}
	req.ContextManagement = append(slices.Clip(req.ContextManagement), model.Compaction(threshold))
}

// FilterInput implements capability.InputFilter: it returns the items from
// the last compaction item on (all of them when there is none). The result
// shares items' backing array but has no spare capacity, so appending to it
// never writes into items.
func (c *compactor) FilterInput(items []model.Item) []model.Item {
	for i := len(items) - 1; i > 0; i-- {
		if items[i].Kind == model.ItemCompaction {
			return slices.Clip(items[i:])
		}
	}
	return items
}
