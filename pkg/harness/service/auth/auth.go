// Package auth binds each request of `harness serve` to a tenant: static
// bearer tokens from a file, or OIDC-style JWTs verified against a JWKS file
// (go-jose), with the issuer and audience checked and the tenant read from
// a configured claim.
//
// Tenant ids are namespaced by where they come from, so that two sources
// can never name the same tenant: a static token's tenant "alice" is
// "token:alice", a JWT's is "jwt:<issuer>:<claim>" (TokenTenant,
// JWTTenant). A JWT whose sub is "alice" is not the static tenant alice,
// and JWTs of another issuer are not the same tenants either.
//
// Stores written before tenant ids were namespaced hold runs under bare
// names ("alice"); no credential maps to those any more, so such runs are
// not reachable through the API (the service is not told which source a
// bare name came from, and guessing would hand one source's runs to the
// other). See LegacyTenant.
package auth

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// ErrUnauthenticated: the request carries no valid credential. Its message
// never includes the credential.
var ErrUnauthenticated = errors.New("unauthenticated")

// Authenticator maps a bearer credential to a tenant.
type Authenticator interface {
	// Authenticate returns the tenant id of the bearer credential (the
	// value after "Bearer "), namespaced by its source (see the package
	// documentation).
	Authenticate(ctx context.Context, bearer string) (tenant string, err error)
}

// BearerFrom extracts the credential from an Authorization header value.
func BearerFrom(header string) (string, bool) {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	cred = strings.TrimSpace(cred)
	return cred, cred != ""
}

// Tenant id prefixes (see the package documentation).
const (
	TokenPrefix = "token:"
	JWTPrefix   = "jwt:"
)

// MaxTenantBytes bounds a tenant name (the tokens file's, or a JWT's
// claim): tenant ids are store keys.
const MaxTenantBytes = 256

// TokenTenant is the tenant id of a static token's tenant name.
func TokenTenant(name string) string { return TokenPrefix + name }

// JWTTenant is the tenant id of a JWT's tenant claim under issuer.
func JWTTenant(issuer, claim string) string { return JWTPrefix + issuer + ":" + claim }

// LegacyTenant reports whether a stored tenant id predates namespacing
// (no "token:" or "jwt:" prefix): no credential authenticates as it.
func LegacyTenant(tenant string) bool {
	return !strings.HasPrefix(tenant, TokenPrefix) && !strings.HasPrefix(tenant, JWTPrefix)
}

// checkTenantName refuses tenant names that could not be used as store
// keys or shown safely: empty, too long, or holding control characters or
// invalid UTF-8.
func checkTenantName(name string) error {
	if name == "" {
		return errors.New("empty tenant name")
	}
	if len(name) > MaxTenantBytes {
		return fmt.Errorf("the tenant name is longer than %d bytes", MaxTenantBytes)
	}
	if !utf8.ValidString(name) {
		return errors.New("the tenant name is not valid UTF-8")
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return errors.New("the tenant name holds a control character")
		}
	}
	return nil
}

type tenantKey struct{}

// WithTenant returns ctx bound to tenant.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// Tenant returns the tenant ctx is bound to ("" and false when none).
func Tenant(ctx context.Context) (string, bool) {
	t, ok := ctx.Value(tenantKey{}).(string)
	return t, ok && t != ""
}

// Tokens authenticates static bearer tokens. Every token is compared, in
// constant time over SHA-256 digests, whatever matched, so the time taken
// says nothing about which token or how much of it matched.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	digest [sha256.Size]byte
	tenant string
}

// LoadTokens reads a tokens file: one "TOKEN TENANT" pair per line, blank
// lines and lines starting with # ignored. Tokens must be at least 16
// characters and unique. A token authenticates as the tenant id
// TokenTenant(TENANT).
func LoadTokens(path string) (*Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	return ParseTokens(data, path)
}

// ParseTokens parses the tokens file format (name is used in errors).
func ParseTokens(data []byte, name string) (*Tokens, error) {
	t := &Tokens{}
	seen := map[[sha256.Size]byte]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s:%d: want TOKEN TENANT", name, n)
		}
		if len(f[0]) < 16 {
			return nil, fmt.Errorf("%s:%d: the token is shorter than 16 characters", name, n)
		}
		d := sha256.Sum256([]byte(f[0]))
		if seen[d] {
			return nil, fmt.Errorf("%s:%d: a token appears twice", name, n)
		}
		seen[d] = true
		if err := checkTenantName(f[1]); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", name, n, err)
		}
		t.entries = append(t.entries, tokenEntry{digest: d, tenant: TokenTenant(f[1])})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(t.entries) == 0 {
		return nil, fmt.Errorf("%s: no tokens", name)
	}
	return t, nil
}

// Authenticate implements Authenticator.
func (t *Tokens) Authenticate(_ context.Context, bearer string) (string, error) {
	d := sha256.Sum256([]byte(bearer))
	tenant := ""
	for _, e := range t.entries {
		if subtle.ConstantTimeCompare(d[:], e.digest[:]) == 1 {
			tenant = e.tenant
		}
	}
	if tenant == "" {
		return "", fmt.Errorf("%w: unknown bearer token", ErrUnauthenticated)
	}
	return tenant, nil
}

// JWTConfig configures JWT verification.
type JWTConfig struct {
	// JWKSFile holds the verification keys (a JSON Web Key Set).
	JWKSFile string
	// Issuer and Audience must match the token's iss and aud.
	Issuer, Audience string
	// TenantClaim names the claim holding the tenant (default "sub").
	TenantClaim string
	// Leeway allowed on exp/nbf/iat (default 1 minute).
	Leeway time.Duration
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// JWT authenticates signed JWTs (RS256/384/512, PS*, ES*, EdDSA; never
// "none" nor an HMAC algorithm, so a verification key cannot be used as a
// shared secret) that carry an expiry. A token authenticates as the
// tenant id JWTTenant(Issuer, claim).
type JWT struct {
	cfg  JWTConfig
	keys jose.JSONWebKeySet
}

var jwtAlgs = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA}

// NewJWT loads the key set and checks the configuration.
func NewJWT(cfg JWTConfig) (*JWT, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("JWT verification needs an issuer and an audience")
	}
	if cfg.TenantClaim == "" {
		cfg.TenantClaim = "sub"
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	data, err := os.ReadFile(cfg.JWKSFile)
	if err != nil {
		return nil, fmt.Errorf("JWKS file: %w", err)
	}
	j := &JWT{cfg: cfg}
	if err := json.Unmarshal(data, &j.keys); err != nil {
		return nil, fmt.Errorf("JWKS file %s: %w", cfg.JWKSFile, err)
	}
	if len(j.keys.Keys) == 0 {
		return nil, fmt.Errorf("JWKS file %s: no keys", cfg.JWKSFile)
	}
	for _, k := range j.keys.Keys {
		if !k.IsPublic() {
			return nil, fmt.Errorf("JWKS file %s: key %q is not a public key", cfg.JWKSFile, k.KeyID)
		}
	}
	return j, nil
}

// LooksLikeJWT says whether a bearer credential has a JWS compact shape.
func LooksLikeJWT(s string) bool { return strings.Count(s, ".") == 2 }

// Authenticate implements Authenticator.
func (j *JWT) Authenticate(_ context.Context, bearer string) (string, error) {
	tok, err := jwt.ParseSigned(bearer, jwtAlgs)
	if err != nil {
		return "", fmt.Errorf("%w: malformed JWT", ErrUnauthenticated)
	}
	if len(tok.Headers) != 1 {
		return "", fmt.Errorf("%w: the JWT must have one signature", ErrUnauthenticated)
	}
	keys := j.keys.Keys
	if kid := tok.Headers[0].KeyID; kid != "" {
		keys = j.keys.Key(kid)
	}
	var std jwt.Claims
	var all map[string]any
	verified := false
	for _, k := range keys {
		if tok.Claims(k.Key, &std, &all) == nil {
			verified = true
			break
		}
	}
	if !verified {
		return "", fmt.Errorf("%w: the JWT's signature does not verify with any key of the JWKS", ErrUnauthenticated)
	}
	exp := jwt.Expected{Issuer: j.cfg.Issuer, AnyAudience: jwt.Audience{j.cfg.Audience}, Time: j.cfg.Now()}
	if err := std.ValidateWithLeeway(exp, j.cfg.Leeway); err != nil {
		return "", fmt.Errorf("%w: JWT claims: %v", ErrUnauthenticated, err)
	}
	if std.Expiry == nil {
		return "", fmt.Errorf("%w: the JWT has no expiry", ErrUnauthenticated)
	}
	tenant, _ := all[j.cfg.TenantClaim].(string)
	if tenant == "" {
		return "", fmt.Errorf("%w: the JWT has no string claim %q", ErrUnauthenticated, j.cfg.TenantClaim)
	}
	if err := checkTenantName(tenant); err != nil {
		return "", fmt.Errorf("%w: the JWT's claim %q: %v", ErrUnauthenticated, j.cfg.TenantClaim, err)
	}
	return JWTTenant(j.cfg.Issuer, tenant), nil
}

// Chain tries JWT verification for JWT-shaped credentials and the static
// tokens for the others. Either may be nil.
type Chain struct {
	Tokens *Tokens
	JWT    *JWT
}

// Authenticate implements Authenticator.
func (c Chain) Authenticate(ctx context.Context, bearer string) (string, error) {
	if c.JWT != nil && LooksLikeJWT(bearer) {
		return c.JWT.Authenticate(ctx, bearer)
	}
	if c.Tokens != nil {
		return c.Tokens.Authenticate(ctx, bearer)
	}
	return "", fmt.Errorf("%w: unknown bearer credential", ErrUnauthenticated)
}
