// Package s3errs reads the errors of the AWS SDK's S3 client the same way
// for every harness-side user of S3-compatible storage (the snapshot store
// and the mounts): the service's error code and HTTP status, which of them
// mean refused credentials, a missing key, a failed precondition or an
// outage worth retrying. Each user still words its own messages; what
// holds for any storage (broken connections, redaction) is package
// storeerr.
package s3errs

import (
	"errors"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/storeerr"
)

// Code returns the S3 error code and HTTP status of err, when it has them.
func Code(err error) (string, int) {
	var code string
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return code, re.HTTPStatusCode()
	}
	return code, 0
}

// IsAuthCode reports the error codes of refused credentials (Versity
// answers an unknown key with a 404 XAdminUserNotFound).
func IsAuthCode(code string) bool {
	switch code {
	case "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "InvalidSecurity",
		"InvalidClientTokenId", "XAdminUserNotFound", "AuthorizationHeaderMalformed":
		return true
	}
	return false
}

// IsNotFound reports a missing key (not a missing bucket, not a refused
// key that a server answers with 404).
func IsNotFound(err error) bool {
	if err == nil {
		return false
	}
	code, status := Code(err)
	return code == "NoSuchKey" || code == "NotFound" || (status == 404 && code != "NoSuchBucket" && !IsAuthCode(code))
}

// IsPreconditionFailed reports a failed If-Match / If-None-Match (412), or
// a concurrent conditional write (409 ConditionalRequestConflict).
func IsPreconditionFailed(err error) bool {
	code, status := Code(err)
	return status == 412 || code == "PreconditionFailed" || code == "ConditionalRequestConflict"
}

// IsNotImplemented reports a server that does not support a request
// feature (conditional writes on some S3-compatible servers).
func IsNotImplemented(err error) bool {
	code, status := Code(err)
	return status == 501 || code == "NotImplemented"
}

// IsUnavailable reports an error that retrying later can cure: the server
// unreachable, a connection cut, a 5xx other than 501, throttling.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	code, status := Code(err)
	switch code {
	case "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling", "ThrottlingException", "RequestTimeTooSkewed":
		return true
	}
	if status >= 500 && status != 501 || status == 429 {
		return true
	}
	var send *smithyhttp.RequestSendError
	return errors.As(err, &send) || storeerr.Transient(err)
}
