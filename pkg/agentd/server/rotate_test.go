package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
	agentdv1 "github.com/bulkhead-dev/bulkhead/proto/bulkhead/agentd/v1"
)

func randomToken(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestCheckNewToken pins RotateToken's rules on the new token, and that a
// refusal never quotes it.
func TestCheckNewToken(t *testing.T) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	good := []string{randomToken(t, 32), base64.RawURLEncoding.EncodeToString(raw), randomToken(t, 64)}
	for _, tok := range good {
		if err := checkNewToken(tok); err != nil {
			t.Errorf("%d-byte random token refused: %v", len(tok), err)
		}
	}
	bad := map[string]string{
		"empty":            "",
		"too short":        randomToken(t, 8),
		"too long":         strings.Repeat(randomToken(t, 32), 70),
		"one character":    strings.Repeat("a", 64),
		"low variety":      strings.Repeat("ab", 40),
		"space":            randomToken(t, 16) + " " + randomToken(t, 16),
		"control":          randomToken(t, 32) + "\n",
		"non-ASCII":        randomToken(t, 32) + "é",
		"hex of 16 bytes":  randomToken(t, 16)[:31],
		"repeated pattern": strings.Repeat("0123456789", 4),
	}
	for name, tok := range bad {
		err := checkNewToken(tok)
		if !errors.Is(err, errTokenRejected) {
			t.Errorf("%s: accepted", name)
			continue
		}
		if tok != "" && strings.Contains(err.Error(), tok) {
			t.Errorf("%s: the error quotes the token: %v", name, err)
		}
	}
}

// TestRotateToken: over real gRPC, the old token is refused for every new
// call at once, the rotating client switches to the new one, bad tokens
// are INVALID_ARGUMENT without the token in the message, and the refusal
// metrics still count.
func TestRotateToken(t *testing.T) {
	td := newTestDaemon(t, nil)
	ctx := ctxT(t)
	newTok := randomToken(t, 32)
	if err := td.client.RotateToken(ctx, newTok); err != nil {
		t.Fatal(err)
	}
	if _, err := td.client.Info(ctx); err != nil {
		t.Fatalf("the rotating client after the rotation: %v", err)
	}
	old, err := agentclient.Dial(agentclient.Options{Address: "unix://" + td.socket, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := old.Info(ctx); !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Fatalf("old token after the rotation: want unauthenticated, got %v", err)
	}
	if err := old.RotateToken(ctx, randomToken(t, 32)); !errors.Is(err, errkind.ErrUnauthenticated) {
		t.Fatalf("rotating with the old token: want unauthenticated, got %v", err)
	}
	fresh, err := agentclient.Dial(agentclient.Options{Address: "unix://" + td.socket, Token: newTok})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if _, err := fresh.Info(ctx); err != nil {
		t.Fatalf("a new client with the new token: %v", err)
	}

	for name, tok := range map[string]string{"weak": strings.Repeat("x", 40), "same": newTok, "short": "abc"} {
		err := td.client.RotateToken(ctx, tok)
		if !errors.Is(err, errkind.ErrInvalidArgument) || strings.Contains(err.Error(), tok) {
			t.Errorf("%s: want invalid argument not quoting the token, got %v", name, err)
		}
	}
	// The refused rotations left the token as it was.
	if _, err := fresh.Info(ctx); err != nil {
		t.Fatalf("after refused rotations: %v", err)
	}
	if _, err := td.client.Info(ctx); err != nil {
		t.Fatalf("the rotating client after refused rotations: %v", err)
	}
}

// TestRotateTokenConcurrent: of rotations racing with the same token,
// exactly one wins; the others are told they lost (ABORTED on the wire),
// and only the winner's token is accepted afterwards.
func TestRotateTokenConcurrent(t *testing.T) {
	a := newTokenAuth([]byte(testToken), false)
	toks := make([]string, 8)
	errs := make([]error, len(toks))
	var wg sync.WaitGroup
	for i := range toks {
		toks[i] = randomToken(t, 32)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = a.rotate(testToken, toks[i])
		}(i)
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, errRotationRaced):
			t.Errorf("unexpected error: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d rotations won, want 1", won)
	}
	cur := a.digest.Load()
	for i, tok := range toks {
		d := sha256.Sum256([]byte(tok))
		if (d == *cur) != (errs[i] == nil) {
			t.Errorf("token %d: current=%v, its rotation returned %v", i, d == *cur, errs[i])
		}
	}
}

// TestRotateTokenWithoutAuth: a daemon serving without authentication has
// no token to rotate.
func TestRotateTokenWithoutAuth(t *testing.T) {
	s := &systemService{auth: newTokenAuth(nil, true)}
	_, err := s.RotateToken(ctxT(t), &agentdv1.RotateTokenRequest{NewToken: randomToken(t, 32)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("got %v, want FAILED_PRECONDITION", err)
	}
}
