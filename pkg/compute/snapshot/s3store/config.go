package s3store

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// ConfigFromURL makes the configuration of the store that an
// s3://BUCKET[/PREFIX] URL names. Everything else comes from getenv
// (os.Getenv in a command), as the AWS tools read it: AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (or
// AWS_DEFAULT_REGION), and AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) for
// S3-compatible servers, which are addressed path-style. Credentials in
// the URL are refused (and not repeated in the error).
func ConfigFromURL(raw string, getenv func(string) string) (Config, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" {
		return Config{}, fmt.Errorf("%w: snapshot store: want s3://BUCKET[/PREFIX]", errkind.ErrInvalidArgument)
	}
	if u.User != nil {
		return Config{}, fmt.Errorf("%w: snapshot store: the URL carries credentials; put them in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead", errkind.ErrInvalidArgument)
	}
	if u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return Config{}, fmt.Errorf("%w: snapshot store %s: want s3://BUCKET[/PREFIX]", errkind.ErrInvalidArgument, u.Redacted())
	}
	cfg := Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/"),
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
