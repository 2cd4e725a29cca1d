package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
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
	if tenant, err := tok.Authenticate(ctx, "tok-acme-0123456789"); err != nil || tenant != "token:acme" {
		t.Fatalf("acme: %q %v", tenant, err)
	}
	if tenant, err := tok.Authenticate(ctx, "tok-evil-0123456789"); err != nil || tenant != "token:evil" {
		t.Fatalf("evil: %q %v", tenant, err)
	}
	for _, bad := range []string{"", "tok-acme-012345678", "tok-acme-0123456789x", "TOK-ACME-0123456789"} {
		if _, err := tok.Authenticate(ctx, bad); !errors.Is(err, auth.ErrUnauthenticated) {
			t.Errorf("%q: %v, want ErrUnauthenticated", bad, err)
		} else if bad != "" && strings.Contains(err.Error(), bad) {
			t.Errorf("the error repeats the credential: %v", err)
		}
	}
	for _, bad := range []string{"short acme\n", "tok-acme-0123456789\n", "tok-acme-0123456789 a\ntok-acme-0123456789 b\n", "# nothing\n",
		"tok-acme-0123456789 " + strings.Repeat("a", auth.MaxTenantBytes+1) + "\n", "tok-acme-0123456789 a\x00b\n"} {
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
	const acme = "jwt:https://issuer.test:acme"
	if tenant, err := v.Authenticate(ctx, sign(key, "k1", good())); err != nil || tenant != acme {
		t.Fatalf("good token: %q %v", tenant, err)
	}
	if tenant, err := v.Authenticate(ctx, sign(key, "", good())); err != nil || tenant != acme {
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
		// The verification key used as an HMAC secret (algorithm
		// confusion): HS* is never accepted.
		"HS256 with the public key":      hmacSigned(t, publicKeyBytes(t, &key.PublicKey), good()),
		"HS256 with the JWKS text":       hmacSigned(t, data, good()),
		"alg none with a signature":      unsigned(good()) + "c2ln",
		"tenant claim too long":          sign(key, "k1", with("org", strings.Repeat("a", auth.MaxTenantBytes+1))),
		"tenant claim with control char": sign(key, "k1", with("org", "ac\x00me")),
		"tenant claim not a string":      sign(key, "k1", with("org", 42)),
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
	if tenant, err := chain.Authenticate(ctx, "tok-ops-0123456789ab"); err != nil || tenant != "token:ops" {
		t.Errorf("chain token: %q %v", tenant, err)
	}
	if tenant, err := chain.Authenticate(ctx, sign(key, "k1", good())); err != nil || tenant != acme {
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

// TestTenantNamespaces: a static token's tenant and a JWT's tenant of the
// same name are different tenants, and so are two issuers' subjects of the
// same name; neither source can produce the other's ids.
func TestTenantNamespaces(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	data, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	if err := os.WriteFile(jwks, data, 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sign := func(iss, sub string) string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("JWT"))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(s).Claims(map[string]any{"iss": iss, "aud": "bulkhead", "sub": sub, "exp": now.Add(time.Hour).Unix()}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	tokens, err := auth.ParseTokens([]byte("tok-bob-0123456789abcdef bob\ntok-fake-0123456789abcde jwt:https://a.test:bob\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	issA, err := auth.NewJWT(auth.JWTConfig{JWKSFile: jwks, Issuer: "https://a.test", Audience: "bulkhead"})
	if err != nil {
		t.Fatal(err)
	}
	issB, err := auth.NewJWT(auth.JWTConfig{JWKSFile: jwks, Issuer: "https://b.test", Audience: "bulkhead"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ids := map[string]string{}
	for name, c := range map[string]struct {
		a      auth.Authenticator
		bearer string
	}{
		"static bob":              {auth.Chain{Tokens: tokens, JWT: issA}, "tok-bob-0123456789abcdef"},
		"static named like a jwt": {auth.Chain{Tokens: tokens, JWT: issA}, "tok-fake-0123456789abcde"},
		"jwt bob of issuer a":     {auth.Chain{Tokens: tokens, JWT: issA}, sign("https://a.test", "bob")},
		"jwt bob of issuer b":     {auth.Chain{Tokens: tokens, JWT: issB}, sign("https://b.test", "bob")},
		"jwt named like a token":  {issA, sign("https://a.test", "token:bob")},
	} {
		id, err := c.a.Authenticate(ctx, c.bearer)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for other, oid := range ids {
			if oid == id {
				t.Errorf("%s and %s are both tenant %q", name, other, id)
			}
		}
		ids[name] = id
		if auth.LegacyTenant(id) {
			t.Errorf("%s: %q is not namespaced", name, id)
		}
	}
	if ids["static bob"] != "token:bob" || ids["jwt bob of issuer a"] != "jwt:https://a.test:bob" {
		t.Errorf("tenant ids %v", ids)
	}
	if !auth.LegacyTenant("bob") {
		t.Error(`"bob" is not reported as a legacy tenant id`)
	}
}

// hmacSigned is a JWT signed with HS256 and secret: what an attacker makes
// with a public key when a verifier accepts HMAC algorithms.
func hmacSigned(t *testing.T, secret []byte, claims map[string]any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: secret}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// publicKeyBytes is the PKIX DER of a public key.
func publicKeyBytes(t *testing.T, pub *ecdsa.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// unsigned is a JWT with alg none.
func unsigned(claims map[string]any) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]string{"alg": "none", "typ": "JWT"}) + "." + enc(claims) + "."
}
