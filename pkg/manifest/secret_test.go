package manifest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Distinctive values that must never show up in any serialized or printed
// form of a manifest.
var secretValues = map[string]string{
	"api-token": "VALUE-api-token-7f3a",
	"git-token": "VALUE-git-token-91bc",
	"s3-id":     "VALUE-s3-id-2d4e",
	"s3-key":    "VALUE-s3-key-55aa",
}

func TestResolvedSecretsAreNeverSerialized(t *testing.T) {
	orig := validManifest()
	m, err := orig.ResolveSecrets(context.Background(), SecretMap(secretValues))
	if err != nil {
		t.Fatal(err)
	}
	// The values are really there...
	env, err := m.Environ()
	if err != nil || env["TOKEN"] != secretValues["api-token"] || env["TZ"] != "UTC" {
		t.Fatalf("Environ() = %v, %v", env, err)
	}
	if v, ok := m.Entries["vendor/lib"].Git.Token.Value(); !ok || v != secretValues["git-token"] {
		t.Fatalf("git token = %q, %v", v, ok)
	}
	if v, ok := m.Entries["data/s3"].Mount.Credentials["secret_access_key"].Value(); !ok || v != secretValues["s3-key"] {
		t.Fatalf("mount credential = %q, %v", v, ok)
	}
	// ...and nowhere in any output.
	var outputs []string
	add := func(what string, b []byte, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		outputs = append(outputs, what+": "+string(b))
	}
	b, err := json.Marshal(m)
	add("json.Marshal(*Manifest)", b, err)
	b, err = json.Marshal(*m)
	add("json.Marshal(Manifest)", b, err)
	b, err = json.Marshal(m.Environment)
	add("json.Marshal(Environment)", b, err)
	b, err = json.Marshal(m.Entries)
	add("json.Marshal(Entries)", b, err)
	b, err = json.Marshal(m.Entries["data/s3"].Mount)
	add("json.Marshal(Mount)", b, err)
	b, err = json.Marshal(m.Entries["vendor/lib"].Git)
	add("json.Marshal(GitRepo)", b, err)
	b, err = yaml.Marshal(m)
	add("yaml.Marshal(*Manifest)", b, err)
	b, err = yaml.Marshal(m.Environment)
	add("yaml.Marshal(Environment)", b, err)
	b, err = yaml.Marshal(m.Entries["data/s3"].Mount)
	add("yaml.Marshal(Mount)", b, err)
	for _, f := range []Format{FormatYAML, FormatJSON} {
		b, err = Marshal(m, f)
		add("Marshal "+f.String(), b, err)
	}
	b, err = json.Marshal(m.Redacted())
	add("Redacted", b, err)
	outputs = append(outputs,
		fmt.Sprintf("%v", m), fmt.Sprintf("%+v", m), fmt.Sprintf("%#v", m),
		fmt.Sprintf("%v", *m), fmt.Sprintf("%+v", *m),
		fmt.Sprintf("%v %+v %#v %s", m.Environment, m.Environment, m.Environment, m.Environment),
		fmt.Sprintf("%v %+v %#v", m.Entries, m.Entries, m.Entries),
		fmt.Sprintf("%v %+v %#v", m.Entries["data/s3"].Mount, *m.Entries["data/s3"].Mount, m.Entries["data/s3"].Mount.Credentials),
		fmt.Sprintf("%v %+v %#v %s %q %x", *m.Entries["vendor/lib"].Git.Token, *m.Entries["vendor/lib"].Git.Token,
			*m.Entries["vendor/lib"].Git.Token, *m.Entries["vendor/lib"].Git.Token, *m.Entries["vendor/lib"].Git.Token,
			*m.Entries["vendor/lib"].Git.Token),
		fmt.Sprintf("%v %+v", m.Entries["vendor/lib"].Git, *m.Entries["vendor/lib"].Git),
	)
	var logBuf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logBuf, nil))
	log.Info("manifest", "env", m.Environment["TOKEN"], "token", *m.Entries["vendor/lib"].Git.Token,
		"creds", m.Entries["data/s3"].Mount.Credentials, "manifest", m)
	outputs = append(outputs, logBuf.String())

	for _, out := range outputs {
		for name, v := range secretValues {
			if strings.Contains(out, v) {
				t.Errorf("the value of secret %q leaked:\n%s", name, out)
			}
		}
	}
	// The references are written.
	js, _ := json.Marshal(m)
	for _, want := range []string{`"TOKEN":{"secret":"api-token"}`, `"token":{"secret":"git-token"}`, `"secret_access_key":{"secret":"s3-key"}`} {
		if !bytes.Contains(js, []byte(want)) {
			t.Errorf("JSON lacks %s:\n%s", want, js)
		}
	}
	// Reading the output back gives the references, unresolved.
	back, err := LoadTrusted(js, FormatJSON)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := back.Environment["TOKEN"].Secret.Value(); ok {
		t.Error("a reloaded manifest holds a resolved value")
	}
	// Resolving did not touch the original.
	if _, ok := orig.Environment["TOKEN"].Secret.Value(); ok {
		t.Error("ResolveSecrets modified its receiver")
	}
	if _, err := orig.Environ(); err == nil || !strings.Contains(err.Error(), `environment["TOKEN"]: secret "api-token" is not resolved`) {
		t.Errorf("Environ() on an unresolved manifest = %v", err)
	}
	// Clone keeps resolved values; Redacted drops them.
	if _, ok := m.Clone().Environment["TOKEN"].Secret.Value(); !ok {
		t.Error("Clone dropped a resolved value")
	}
	if _, ok := m.Redacted().Environment["TOKEN"].Secret.Value(); ok {
		t.Error("Redacted kept a resolved value")
	}
}

func TestResolveSecretsErrors(t *testing.T) {
	m := validManifest()
	m.Environment["MISSING"] = SecretEnv("not-there")
	_, err := m.ResolveSecrets(context.Background(), SecretMap(secretValues))
	if err == nil || err.Error() != `manifest: environment["MISSING"].secret: resolving secret "not-there": no secret not-there` {
		t.Errorf("ResolveSecrets = %v", err)
	}
	calls := map[string]int{}
	m = validManifest()
	m.Environment["AGAIN"] = SecretEnv("api-token")
	_, err = m.ResolveSecrets(context.Background(), SecretResolverFunc(func(ctx context.Context, name string) (string, error) {
		calls[name]++
		return "v", nil
	}))
	if err != nil || calls["api-token"] != 1 || len(calls) != 4 {
		t.Errorf("each name once: %v, %v", calls, err)
	}
	if got := strings.Join(validManifest().SecretNames(), ","); got != "api-token,git-token,s3-id,s3-key" {
		t.Errorf("SecretNames = %s", got)
	}
	cancelled := SecretResolverFunc(func(ctx context.Context, _ string) (string, error) { return "", ctx.Err() })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := validManifest().ResolveSecrets(ctx, cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled resolve = %v", err)
	}
}
