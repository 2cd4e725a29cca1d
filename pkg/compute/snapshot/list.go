package snapshot

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Lister is a Store that can enumerate its snapshots and describe one.
// Local and S3 are Listers.
type Lister interface {
	Store
	// List calls fn for each snapshot, by id; fn's error stops the
	// listing and is returned. Info may lack Size and Chunks (Stat has
	// them).
	List(ctx context.Context, fn func(Info) error) error
	// Stat describes one snapshot (errkind.ErrNotFound when absent).
	Stat(ctx context.Context, id string) (Info, error)
}

var (
	_ Lister = (*Local)(nil)
	_ Lister = (*S3)(nil)
)

// List calls fn for each snapshot in the directory, by id.
func (l *Local) List(_ context.Context, fn func(Info) error) error {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), snapshotSuffix)
		if !ok || !e.Type().IsRegular() || ValidateID(id) != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed since the listing
		}
		if err := fn(Info{ID: id, Size: fi.Size(), Modified: fi.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}

// Stat describes the snapshot stored under id (its size and time; the
// digest is not computed).
func (l *Local) Stat(_ context.Context, id string) (Info, error) {
	if err := ValidateID(id); err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(l.path(id))
	if err != nil {
		return Info{}, classify("stat", id, err)
	}
	return Info{ID: id, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// S3ConfigFromURL makes the configuration of the store that an
// s3://BUCKET[/PREFIX] URL names. Everything else comes from getenv
// (os.Getenv in a command), as the AWS tools read it: AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (or
// AWS_DEFAULT_REGION), and AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) for
// S3-compatible servers, which are addressed path-style. Credentials in
// the URL are refused (and not repeated in the error).
func S3ConfigFromURL(raw string, getenv func(string) string) (S3Config, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" {
		return S3Config{}, fmt.Errorf("%w: snapshot store: want s3://BUCKET[/PREFIX]", errkind.ErrInvalidArgument)
	}
	if u.User != nil {
		return S3Config{}, fmt.Errorf("%w: snapshot store: the URL carries credentials; put them in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead", errkind.ErrInvalidArgument)
	}
	if u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return S3Config{}, fmt.Errorf("%w: snapshot store %s: want s3://BUCKET[/PREFIX]", errkind.ErrInvalidArgument, u.Redacted())
	}
	cfg := S3Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/"),
		AccessKeyID: getenv("AWS_ACCESS_KEY_ID"), SecretAccessKey: getenv("AWS_SECRET_ACCESS_KEY"), SessionToken: getenv("AWS_SESSION_TOKEN"),
		Region:   firstNonEmpty(getenv("AWS_REGION"), getenv("AWS_DEFAULT_REGION")),
		Endpoint: firstNonEmpty(getenv("AWS_ENDPOINT_URL_S3"), getenv("AWS_ENDPOINT_URL"))}
	cfg.UsePathStyle = cfg.Endpoint != ""
	return cfg, nil
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
