package cli

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestLoggerShowsWarningsByDefault: without --verbose the harness still
// prints warnings (an egress refusal inside a sandbox is one), one line
// each, and nothing below them; with --verbose everything.
func TestLoggerShowsWarningsByDefault(t *testing.T) {
	var quiet bytes.Buffer
	g := &globals{streams: Streams{Err: &quiet}}
	log := g.logger()
	log.Info("egress tunnel", zap.String("host", "allowed.test"))
	log.Warn("egress denied", zap.String("host", "evil.test"), zap.String("reason", "not in the allow list"))
	got := quiet.String()
	if strings.Contains(got, "egress tunnel") {
		t.Errorf("an info line was printed without --verbose: %q", got)
	}
	if !strings.Contains(got, "egress denied") || !strings.Contains(got, "not in the allow list") || strings.Count(got, "\n") != 1 {
		t.Errorf("want the warning with its reason on one line, got %q", got)
	}
	if strings.Contains(got, ".go:") {
		t.Errorf("the default warning line carries a caller: %q", got)
	}

	var loud bytes.Buffer
	g = &globals{streams: Streams{Err: &loud}, verbose: true}
	g.logger().Info("egress tunnel")
	if !strings.Contains(loud.String(), "egress tunnel") {
		t.Errorf("--verbose dropped an info line: %q", loud.String())
	}
}
