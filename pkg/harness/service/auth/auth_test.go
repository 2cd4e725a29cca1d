package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/bulkhead-dev/bulkhead/pkg/harness/service/auth"
)

func TestTokens(t *testing.T) {
	tok, err := auth.ParseTokens([]byte("# comment\n\ntok-acme-0123456789 acme\ntok-evil-0123456789 evil\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if tenant, err := tok.Authenticate(ctx, "tok-acme-0123456789"); err != nil || tenant != "acme" {
		t.Fatalf("acme: %q %v", tenant, err)
	}
	if tenant, err := tok.Authenticate(ctx, "tok-evil-0123456789"); err != nil || tenant != "evil" {
		t.Fatalf("evil: %q %v", tenant, err)
	}
	for _, bad := range []string{"", "tok-acme-012345678", "tok-acme-0123456789x", "TOK-ACME-0123456789"} {
		if _, err := tok.Authenticate(ctx, bad); !errors.Is(err, auth.ErrUnauthenticated) {
			t.Errorf("%q: %v, want ErrUnauthenticated", bad, err)
		} else if bad != "" && strings.Contains(err.Error(), bad) {
			t.Errorf("the error repeats the credential: %v", err)
		}
	}
	for _, bad := range []string{"short acme\n", "tok-acme-0123456789\n", "tok-acme-0123456789 a\ntok-acme-0123456789 b\n", "# nothing\n"} {
		if _, err := auth.ParseTokens([]byte(bad), "tokens"); err == nil {
			t.Errorf("tokens file %q accepted", bad)
		}
	}
	if b, ok := auth.BearerFrom("Bearer  abc "); !ok || b != "abc" {
		t.Errorf("BearerFrom: %q %v", b, ok)
	}
	if _, ok := auth.BearerFrom("Basic abc"); ok {
		t.Error("Basic accepted as bearer")
	}
}

func TestJWT(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	dir := t.TempDir()
	jwks := filepath.Join(dir, "jwks.json")
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}}
	data, _ := json.Marshal(set)
	if err := os.WriteFile(jwks, data, 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	v, err := auth.NewJWT(auth.JWTConfig{JWKSFile: jwks, Issuer: "https://issuer.test", Audience: "bulkhead", TenantClaim: "org", Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	sign := func(k *ecdsa.PrivateKey, kid string, claims map[string]any) string {
		opts := (&jose.SignerOptions{}).WithType("JWT")
		if kid != "" {
			opts = opts.WithHeader("kid", kid)
		}
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k}, opts)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(s).Claims(claims).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	good := func() map[string]any {
		return map[string]any{"iss": "https://issuer.test", "aud": []string{"bulkhead"}, "sub": "alice", "org": "acme",
			"exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
	}
	ctx := context.Background()
	if tenant, err := v.Authenticate(ctx, sign(key, "k1", good())); err != nil || tenant != "acme" {
		t.Fatalf("good token: %q %v", tenant, err)
	}
	if tenant, err := v.Authenticate(ctx, sign(key, "", good())); err != nil || tenant != "acme" {
		t.Fatalf("good token without kid: %q %v", tenant, err)
	}
	with := func(k string, val any) map[string]any {
		c := good()
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	bad := map[string]string{
		"wrong issuer":   sign(key, "k1", with("iss", "https://evil.test")),
		"wrong audience": sign(key, "k1", with("aud", []string{"other"})),
		"expired":        sign(key, "k1", with("exp", now.Add(-time.Hour).Unix())),
		"no expiry":      sign(key, "k1", with("exp", nil)),
		"not yet valid":  sign(key, "k1", with("nbf", now.Add(time.Hour).Unix())),
		"no tenant":      sign(key, "k1", with("org", nil)),
		"other key":      sign(other, "k1", good()),
		"unknown kid":    sign(key, "k9", good()),
		"garbage":        "a.b.c",
		"unsigned":       unsigned(good()),
	}
	for name, tok := range bad {
		if _, err := v.Authenticate(ctx, tok); !errors.Is(err, auth.ErrUnauthenticated) {
			t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
		}
	}
	// The chain sends JWT-shaped credentials to the verifier, others to
	// the tokens.
	tokens, _ := auth.ParseTokens([]byte("tok-ops-0123456789ab ops\n"), "tokens")
	chain := auth.Chain{Tokens: tokens, JWT: v}
	if tenant, err := chain.Authenticate(ctx, "tok-ops-0123456789ab"); err != nil || tenant != "ops" {
		t.Errorf("chain token: %q %v", tenant, err)
	}
	if tenant, err := chain.Authenticate(ctx, sign(key, "k1", good())); err != nil || tenant != "acme" {
		t.Errorf("chain jwt: %q %v", tenant, err)
	}
	// Configuration errors.
	if _, err := auth.NewJWT(auth.JWTConfig{JWKSFile: jwks, Issuer: "x"}); err == nil {
		t.Error("no audience accepted")
	}
	priv, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key, KeyID: "p"}}})
	privFile := filepath.Join(dir, "priv.json")
	_ = os.WriteFile(privFile, priv, 0o600)
	if _, err := auth.NewJWT(auth.JWTConfig{JWKSFile: privFile, Issuer: "x", Audience: "y"}); err == nil {
		t.Error("a private key in the JWKS accepted")
	}
}

// unsigned is a JWT with alg none.
func unsigned(claims map[string]any) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]string{"alg": "none", "typ": "JWT"}) + "." + enc(claims) + "."
}
