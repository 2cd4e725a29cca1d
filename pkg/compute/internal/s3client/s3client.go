// Package s3client builds the AWS SDK's S3 client the same way for every
// harness-side user of S3-compatible storage (the snapshot store and the
// mounts): cached credentials, the standard retryer without a retry
// budget, checksums only where an operation asks for them, and an optional
// endpoint and HTTP client. What differs between the users (region,
// addressing, tries, backoff) is an option.
package s3client

import (
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// DefaultRegion signs the requests of a client given no region.
const DefaultRegion = "us-east-1"

// Options are what a user of S3 decides about its client.
type Options struct {
	// Region signs requests; empty means DefaultRegion.
	Region string
	// Endpoint is the server's base URL for S3-compatible services (MinIO,
	// R2, Versity, a local gateway); empty means AWS.
	Endpoint string
	// UsePathStyle addresses buckets as endpoint/bucket rather than
	// bucket.endpoint.
	UsePathStyle bool
	// Credentials sign the requests (required); New caches them.
	Credentials aws.CredentialsProvider
	// MaxAttempts bounds the tries of one request, the first included;
	// zero or less means the SDK's default (3).
	MaxAttempts int
	// MaxBackoff bounds the wait between tries; zero means the SDK's
	// default (20s).
	MaxBackoff time.Duration
	// Backoff, when set, chooses the wait before each retry; nil means the
	// SDK's exponential backoff with jitter, up to MaxBackoff.
	Backoff retry.BackoffDelayer
	// HTTPClient, when set, sends the requests.
	HTTPClient *http.Client
}

// New returns an S3 client configured by o. It does not contact the
// server.
//
// Retries have no budget (ratelimit.None): a server that comes back after
// an outage must not find the client's retry quota spent. Checksums are
// computed and validated only when an operation requires it, so callers
// ask for them explicitly (a full-object checksum would not match a ranged
// read, and not every S3-compatible server supports the SDK's defaults).
func New(o Options) *s3.Client {
	region := o.Region
	if region == "" {
		region = DefaultRegion
	}
	retryer := retry.NewStandard(func(so *retry.StandardOptions) {
		if o.MaxAttempts > 0 {
			so.MaxAttempts = o.MaxAttempts
		}
		if o.MaxBackoff > 0 {
			so.MaxBackoff = o.MaxBackoff
		}
		if o.Backoff != nil {
			so.Backoff = o.Backoff
		}
		so.RateLimiter = ratelimit.None
	})
	opts := s3.Options{
		Region:                     region,
		Credentials:                aws.NewCredentialsCache(o.Credentials),
		UsePathStyle:               o.UsePathStyle,
		Retryer:                    retryer,
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	}
	if o.Endpoint != "" {
		opts.BaseEndpoint = aws.String(o.Endpoint)
	}
	if o.HTTPClient != nil { // not a typed nil in the interface
		opts.HTTPClient = o.HTTPClient
	}
	return s3.New(opts)
}
