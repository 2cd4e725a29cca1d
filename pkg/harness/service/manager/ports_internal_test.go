package manager

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestPreviewTokenEveryCharacter: a token is good as issued, and no
// other spelling is: every one-character change (the last character's
// unused bits and a letter's case included), the token under another key,
// past its expiry, and once revoked are all refused.
func TestPreviewTokenEveryCharacter(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	m := &Manager{base: context.Background(), cfg: Config{Now: func() time.Time { return now }}}
	key := []byte(strings.Repeat("k", MinPreviewKeyBytes))
	p, err := newPorts(m, key, PreviewPolicy{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	m.ports = p
	var nonce [nonceBytes]byte
	copy(nonce[:], "0123456789abcdef")
	e := p.newExposure("token:acme", "sbx-0123456789abcdef01234567", 8080, now, now.Add(time.Hour), nonce)
	p.add(e)
	tok := p.token(e)
	if len(tok) != tokenChars || p.verify(tok) != e {
		t.Fatalf("the token as issued is refused: %q", tok)
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567ABCDEFGHIJKLMNOPQRSTUVWXYZ=-_"
	for i := range tok {
		for _, c := range alphabet {
			if byte(c) == tok[i] {
				continue
			}
			bad := tok[:i] + string(c) + tok[i+1:]
			if p.verify(bad) != nil {
				t.Fatalf("token with character %d changed to %q is good", i, c)
			}
		}
	}
	if p.verify(tok[:len(tok)-1]) != nil || p.verify(tok+"a") != nil || p.verify("") != nil {
		t.Fatal("a token of another length is good")
	}
	// The same exposure under another key.
	other, _ := newPorts(m, []byte(strings.Repeat("o", MinPreviewKeyBytes)), PreviewPolicy{}, zap.NewNop())
	if tok2 := other.token(e); tok2 == tok || p.verify(tok2) != nil {
		t.Fatal("a token made under another key is good")
	}
	// A record whose expiry moved (a store written behind the service's
	// back) does not match the token.
	moved := *e
	moved.expires = e.expires.Add(time.Hour)
	if p.token(&moved) == tok {
		t.Fatal("the MAC does not cover the expiry")
	}
	now = e.expires
	if p.verify(tok) != nil {
		t.Fatal("an expired token is good")
	}
	now = e.expires.Add(-time.Second)
	if p.verify(tok) != e {
		t.Fatal("the token before its expiry is refused")
	}
	p.remove(e)
	if p.verify(tok) != nil {
		t.Fatal("a revoked token is good")
	}
	if _, err := newPorts(m, []byte("short"), PreviewPolicy{}, zap.NewNop()); err == nil {
		t.Fatal("a short key was taken")
	}
}
