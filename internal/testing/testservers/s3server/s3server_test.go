package s3server

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// TestStartStopRestart starts a server, makes a bucket, and checks that a
// stopped server refuses requests and a restarted one still has the
// bucket.
func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	bucket := s.Bucket(t)
	s.Stop()
	s.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Client().HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}); err == nil {
		t.Fatal("a stopped server answered")
	}
	s.Restart(t)
	if _, err := s.Client().HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket}); err != nil {
		t.Fatalf("the bucket after a restart: %v", err)
	}
}
