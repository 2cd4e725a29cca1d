package main

// The S3 snapshot store figure: a workspace snapshotted into a real
// S3-compatible server (Versity Gateway on loopback), then snapshotted
// again after 1% of its files changed, beside `tar --zstd` and one PUT of
// the whole archive each time.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/agentclient"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot/s3store"
)

// benchSnapshotStore measures snapshots of a tree of files files / total
// bytes into the S3 store: the first, and a second after rewriting 1% of
// the files (bytes uploaded and time), each beside `tar --zstd -c` of the
// same tree plus one PUT of the whole archive to the same server.
func benchSnapshotStore(ctx context.Context, c *agentclient.Client, workspace string, files int, total int64) ([]row, error) {
	const figure = "S3 snapshot store (Versity Gateway, loopback)"
	if _, err := exec.LookPath("zstd"); err != nil {
		return []row{{figure, "skipped: zstd (for the tar baseline) is not installed", "", "", ""}}, nil
	}
	tmp, err := os.MkdirTemp(filepath.Dir(workspace), "bench-s3-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	srv, err := s3server.Run(ctx, filepath.Join(tmp, "gw"), io.Discard)
	if err != nil {
		return []row{{figure, "skipped: " + err.Error(), "", "", ""}}, nil
	}
	defer srv.Stop()
	bucket, err := srv.CreateBucket(ctx)
	if err != nil {
		return nil, err
	}
	store, err := s3store.New(s3store.Config{Bucket: bucket, Prefix: "bench", Endpoint: srv.Endpoint, Region: srv.Region,
		UsePathStyle: true, AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey})
	if err != nil {
		return nil, err
	}
	defer store.Close()

	tree := filepath.Join(workspace, "snaptree")
	defer os.RemoveAll(tree)
	per := int(total / int64(files))
	rng := rand.New(rand.NewPCG(3, 4))
	if err := writeBenchFiles(tree, files, per, rng, func(int) bool { return true }); err != nil {
		return nil, err
	}
	// Only the tree is snapshotted: the other figures' files stay out.
	var exclude []string
	entries, err := os.ReadDir(workspace)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.Name() != "snaptree" {
			exclude = append(exclude, e.Name())
		}
	}
	put := func(id string) (snapshot.Info, time.Duration, error) {
		start := time.Now()
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			_, err := c.Archive(ctx, agentclient.ArchiveOptions{Exclude: exclude}, pw)
			pw.CloseWithError(err)
			done <- err
		}()
		info, err := store.Put(ctx, id, pr)
		pr.CloseWithError(errors.New("the store stopped reading"))
		if aerr := <-done; aerr != nil && err == nil {
			err = aerr
		}
		return info, time.Since(start), err
	}
	baseline := func(name string) (int64, time.Duration, error) {
		start := time.Now()
		archive := filepath.Join(tmp, name+".tar.zst")
		if b, err := exec.CommandContext(ctx, "tar", "--zstd", "-cf", archive, "-C", workspace, "snaptree").CombinedOutput(); err != nil {
			return 0, 0, fmt.Errorf("tar create: %v: %s", err, b)
		}
		f, err := os.Open(archive)
		if err != nil {
			return 0, 0, err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return 0, 0, err
		}
		if _, err := srv.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: aws.String("whole/" + name), Body: f,
			ContentLength: aws.Int64(fi.Size())}); err != nil {
			return 0, 0, fmt.Errorf("put the whole archive: %w", err)
		}
		return fi.Size(), time.Since(start), nil
	}

	first, firstTime, err := put("bench")
	if err != nil {
		return nil, err
	}
	tarSize1, tarTime1, err := baseline("first")
	if err != nil {
		return nil, err
	}
	// Rewrite 1% of the files (every hundredth) with new content.
	if err := writeBenchFiles(tree, files, per, rng, func(i int) bool { return i%100 == 50 }); err != nil {
		return nil, err
	}
	second, secondTime, err := put("bench")
	if err != nil {
		return nil, err
	}
	tarSize2, tarTime2, err := baseline("second")
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("%d files / %s", files, mib(total))
	return []row{
		{fmt.Sprintf("%s: first snapshot of %s (bytes uploaded, time)", figure, what),
			fmt.Sprintf("%s, %d ms (%d chunks)", mib(first.Uploaded), firstTime.Milliseconds(), first.Chunks),
			fmt.Sprintf("%s, %d ms (tar --zstd + one PUT)", mib(tarSize1), tarTime1.Milliseconds()),
			fmt.Sprintf("%.2fx bytes", float64(first.Uploaded)/float64(tarSize1)), ""},
		{fmt.Sprintf("%s: second snapshot after rewriting 1%% of the files", figure),
			fmt.Sprintf("%s, %d ms (%d of %d chunks reused)", mib(second.Uploaded), secondTime.Milliseconds(), second.Reused, second.Chunks),
			fmt.Sprintf("%s, %d ms (tar --zstd + one PUT)", mib(tarSize2), tarTime2.Milliseconds()),
			fmt.Sprintf("%.2fx bytes", float64(second.Uploaded)/float64(tarSize2)), "uploads what changed"},
	}, nil
}

// writeBenchFiles writes (or rewrites, where pick says) files text files
// of per bytes each under tree: source-like text, different in every file.
func writeBenchFiles(tree string, files, per int, rng *rand.Rand, pick func(int) bool) error {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 _(){};=+-*"
	content := make([]byte, per)
	for i := range files {
		if !pick(i) {
			continue
		}
		dir := filepath.Join(tree, fmt.Sprintf("d%03d", i/100))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for j := range content {
			if j%64 == 63 {
				content[j] = '\n'
			} else {
				content[j] = alphabet[rng.IntN(len(alphabet))]
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.txt", i)), content, 0o644); err != nil {
			return err
		}
	}
	return nil
}
