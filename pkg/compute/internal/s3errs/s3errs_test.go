package s3errs

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// apiErr is an S3 error as the SDK returns it: an API error code inside an
// HTTP response error with its status.
func apiErr(code string, status int) error {
	return &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err: &smithy.GenericAPIError{Code: code}},
	}
}

func TestClassification(t *testing.T) {
	cases := []struct {
		name                                     string
		err                                      error
		notFound, unavailable, precondition, nyi bool
	}{
		{"missing key", apiErr("NoSuchKey", 404), true, false, false, false},
		{"bare 404", apiErr("", 404), true, false, false, false},
		{"missing bucket is not a missing key", apiErr("NoSuchBucket", 404), false, false, false, false},
		{"refused key answered with 404", apiErr("XAdminUserNotFound", 404), false, false, false, false},
		{"throttled", apiErr("SlowDown", 503), false, true, false, false},
		{"server error", apiErr("", 500), false, true, false, false},
		{"not implemented is not an outage", apiErr("NotImplemented", 501), false, false, false, true},
		{"if-match failed", apiErr("PreconditionFailed", 412), false, false, true, false},
		{"conditional write conflict", apiErr("ConditionalRequestConflict", 409), false, false, true, false},
		{"connection refused", fmt.Errorf("send: %w", syscall.ECONNREFUSED), false, true, false, false},
		{"canceled is none of them", context.Canceled, false, false, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := IsNotFound(c.err); got != c.notFound {
				t.Errorf("IsNotFound = %v", got)
			}
			if got := IsUnavailable(c.err); got != c.unavailable {
				t.Errorf("IsUnavailable = %v", got)
			}
			if got := IsPreconditionFailed(c.err); got != c.precondition {
				t.Errorf("IsPreconditionFailed = %v", got)
			}
			if got := IsNotImplemented(c.err); got != c.nyi {
				t.Errorf("IsNotImplemented = %v", got)
			}
		})
	}
	if code, status := Code(fmt.Errorf("wrapped: %w", apiErr("AccessDenied", 403))); code != "AccessDenied" || status != 403 {
		t.Errorf("Code through a wrap = %q %d", code, status)
	}
	if !IsAuthCode("SignatureDoesNotMatch") || IsAuthCode("AccessDenied") {
		t.Error("IsAuthCode")
	}
	if IsNotFound(nil) || IsUnavailable(nil) {
		t.Error("nil is nothing")
	}
}
