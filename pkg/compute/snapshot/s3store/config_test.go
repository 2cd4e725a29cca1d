package s3store

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

func TestConfigFromURL(t *testing.T) {
	env := map[string]string{"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
		"AWS_DEFAULT_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:7070"}
	cfg, err := ConfigFromURL("s3://bucket/team/snaps/", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Bucket != "bucket" || cfg.Prefix != "team/snaps" || cfg.Region != "eu-west-1" || cfg.Endpoint != "http://127.0.0.1:7070" ||
		!cfg.UsePathStyle || cfg.AccessKeyID != "AKIAEXAMPLE" || cfg.SecretAccessKey != "s3cr3t-value" {
		t.Fatalf("config %#v", cfg)
	}
	var shown bytes.Buffer
	for _, v := range []any{cfg, &cfg} {
		shown.WriteString(strings.Join([]string{sprint("%v", v), sprint("%+v", v), sprint("%#v", v)}, " "))
	}
	if strings.Contains(shown.String(), "s3cr3t") || strings.Contains(shown.String(), "AKIAEXAMPLE") {
		t.Fatalf("printing the config shows credentials: %s", shown.String())
	}
	for _, bad := range []string{"s3://", "http://bucket/x", "s3://AKIA:s3cr3t@bucket/x", "s3://bucket/x?versionId=1", "::"} {
		_, err := ConfigFromURL(bad, func(string) string { return "" })
		if !errors.Is(err, errkind.ErrInvalidArgument) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := New(Config{Bucket: "b", Prefix: "a/../b", AccessKeyID: "k", SecretAccessKey: "s"}); !errors.Is(err, errkind.ErrInvalidArgument) {
		t.Fatalf("prefix with ..: %v", err)
	}
}

func sprint(format string, v any) string { return fmt.Sprintf(format, v) }
