package main

// The mount figure: a bucket prefix of N objects mounted into a fresh local
// sandbox (the harness lists and reads the bucket and streams the bytes
// through the daemon's Materialize), timed from Create to the first exec
// that can read them, beside a plain download of the same objects by the
// same process to a local directory with the same concurrency: the AWS SDK
// for the S3 server (Versity Gateway), plain JSON API media GETs for the
// GCS server (fake-gcs-server). Both servers run on loopback.
//
// The download and the mount run mountRounds times each, interleaved
// (download, mount, download, mount, ...), and the medians are reported
// with every round: on a shared machine one pass of either swings by 2x
// with what else runs, and interleaving spreads that over both sides.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/gcsserver"
	"github.com/bulkhead-dev/bulkhead/internal/testing/testservers/s3server"
	"github.com/bulkhead-dev/bulkhead/pkg/compute"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/local"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/materializer"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/gcsmount"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/mount/s3mount"
	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

// benchMounts measures an s3_mount and a gcs_mount of objects objects /
// total bytes (see the file comment).
func benchMounts(ctx context.Context, agentd string, objects int, total int64) ([]row, error) {
	tmp, err := os.MkdirTemp("", "bench-mounts-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o711); err != nil { // sandbox accounts pass through to their workspaces
		return nil, err
	}
	per := int(total / int64(objects))
	keys := make([]string, objects)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench/d%02d/f%05d.bin", i%20, i)
	}
	body := func(i int) []byte {
		b := make([]byte, per)
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		return b
	}
	what := fmt.Sprintf("%d objects / %s", objects, mib(int64(per)*int64(objects)))
	var rows []row

	for _, server := range []struct {
		name  string // "s3": the figure's and the server directory's name
		start func(ctx context.Context, dir string) (*mountSide, func(), error)
	}{
		{"s3", startS3Side},   // Versity Gateway
		{"gcs", startGCSSide}, // fake-gcs-server over a directory on disk
	} {
		fmt.Fprintf(os.Stderr, "  %s mount ...\n", server.name)
		side, stop, err := server.start(ctx, filepath.Join(tmp, server.name))
		if err != nil {
			rows = append(rows, row{server.name + "_mount of " + what, "skipped: " + err.Error(), "", "", ""})
			continue
		}
		r, err := benchMount(ctx, side, agentd, tmp, keys, body, what)
		stop()
		if err != nil {
			return nil, fmt.Errorf("%s mount: %w", server.name, err)
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// mountSide is one server's part of the mount figure: how to make a bucket
// and put and get its objects directly (the baseline), and how a manifest
// mounts it.
type mountSide struct {
	name        string // the server's short name: "s3"
	kind        string // the figure's words for the mount
	baselineHow string // the baseline's words
	bucket      func(ctx context.Context) (string, error)
	put         func(ctx context.Context, bucket, key string, data []byte) error
	get         func(ctx context.Context, bucket, key string) (io.ReadCloser, error)
	secrets     manifest.SecretMap
	entry       func(bucket string) *manifest.Entry
}

// parallel runs f(i) for i in [0, n) on conc goroutines and returns every
// error, joined.
func parallel(n, conc int, f func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan int)
	)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// timeMount creates a local sandbox whose manifest mounts entry at
// "data", starts it and runs a first exec that counts the mounted files:
// the time from Create to that exec's answer.
func timeMount(ctx context.Context, agentd, tmp string, m *mount.Mounter, entry *manifest.Entry, want int) (time.Duration, error) {
	entries := map[string]*manifest.Entry{"data": entry}
	if entry == nil { // an empty sandbox: what the mount adds to
		entries = map[string]*manifest.Entry{"data": {Type: manifest.TypeDir}}
	}
	dir, err := os.MkdirTemp(tmp, "state-")
	if err != nil {
		return 0, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return 0, err
	}
	c, err := local.NewClient(local.Config{StateDir: dir, AgentdPath: agentd, Isolation: local.IsolationNone},
		compute.ClientOptions{Log: zap.NewNop(), Materializer: materializer.Options{Mounts: m}})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	s, err := c.Create(ctx, compute.CreateOptions{Manifest: &manifest.Manifest{Entries: entries}})
	if err != nil {
		return 0, err
	}
	defer func() {
		_ = s.Close(context.WithoutCancel(ctx))
		_ = c.Delete(context.WithoutCancel(ctx), s)
	}()
	if err := s.Start(ctx); err != nil {
		return 0, err
	}
	res, err := s.Exec(ctx, compute.ProcessSpec{Command: "find data -type f | wc -l"}, compute.ExecOptions{}, nil)
	if err != nil {
		return 0, err
	}
	took := time.Since(start)
	if got := string(bytes.TrimSpace(res.Stdout)); got != fmt.Sprint(want) {
		return 0, fmt.Errorf("the first exec saw %s files in the mount, want %d", got, want)
	}
	return took, nil
}

// mountRounds is how many times the download and the mount each run.
const mountRounds = 3

// interleaved runs download and mount mountRounds times each, alternately,
// and returns their times.
func interleaved(download, mount func() (time.Duration, error)) (downloads, mounts []time.Duration, err error) {
	for range mountRounds {
		d, err := download()
		if err != nil {
			return nil, nil, fmt.Errorf("download: %w", err)
		}
		m, err := mount()
		if err != nil {
			return nil, nil, err
		}
		downloads, mounts = append(downloads, d), append(mounts, m)
	}
	return downloads, mounts, nil
}

// mountRows words a mount's figure (medians, then every round) beside its
// baseline.
func mountRows(kind, what string, mounts []time.Duration, empty time.Duration, downloads []time.Duration, baselineHow string) []row {
	mounted, baseline := medianDur(mounts), medianDur(downloads)
	return []row{{
		figure:   fmt.Sprintf("%s of %s: create to first exec (loopback server), median of %d interleaved rounds", kind, what, len(mounts)),
		value:    fmt.Sprintf("%s (rounds: %s; an empty sandbox: %s)", ms(mounted), msList(mounts), ms(empty)),
		baseline: fmt.Sprintf("%s (%s; rounds: %s)", ms(baseline), baselineHow, msList(downloads)),
		ratio:    fmt.Sprintf("%.2fx", float64(mounted)/float64(baseline)),
		target:   "near the download",
	}}
}

// medianDur is the median of ds (the upper one of an even count).
func medianDur(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// msList words durations as "a, b, c ms".
func msList(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprint(d.Milliseconds())
	}
	return strings.Join(parts, ", ") + " ms"
}

// benchMount fills a bucket of side's server with the objects keys (body
// gives their bytes) and takes the mount figure: the mount beside a
// download of the same objects, as many at once as the Mounter's default
// (see the file comment), and an empty sandbox.
func benchMount(ctx context.Context, side *mountSide, agentd, tmp string, keys []string, body func(int) []byte, what string) ([]row, error) {
	bucket, err := side.bucket(ctx)
	if err != nil {
		return nil, err
	}
	if err := parallel(len(keys), 16, func(i int) error {
		return side.put(ctx, bucket, keys[i], body(i))
	}); err != nil {
		return nil, fmt.Errorf("fill the bucket: %w", err)
	}
	download := func() (time.Duration, error) {
		dst := filepath.Join(tmp, side.name+"-download")
		defer os.RemoveAll(dst)
		start := time.Now()
		err := parallel(len(keys), mount.DefaultConcurrency, func(i int) error {
			r, err := side.get(ctx, bucket, keys[i])
			if err != nil {
				return err
			}
			defer r.Close()
			return writeLocal(filepath.Join(dst, keys[i]), r)
		})
		return time.Since(start), err
	}
	m, err := mount.New(mount.Config{Log: zap.NewNop(), Secrets: side.secrets,
		Backends: []mount.Backend{s3mount.New(s3mount.Config{}), gcsmount.New(gcsmount.Config{})}})
	if err != nil {
		return nil, err
	}
	entry := side.entry(bucket)
	downloads, mounts, err := interleaved(download, func() (time.Duration, error) { return timeMount(ctx, agentd, tmp, m, entry, len(keys)) })
	if err != nil {
		return nil, err
	}
	empty, err := timeMount(ctx, agentd, tmp, m, nil, 0)
	if err != nil {
		return nil, err
	}
	return mountRows(side.kind, what, mounts, empty, downloads, side.baselineHow), nil
}

// startS3Side starts Versity Gateway over dir: the S3 side of the figure,
// its baseline an AWS SDK download. stop stops the server.
func startS3Side(ctx context.Context, dir string) (side *mountSide, stop func(), err error) {
	srv, err := s3server.Run(ctx, dir, io.Discard)
	if err != nil {
		return nil, nil, err
	}
	cl := srv.Client()
	ro := true
	return &mountSide{
		name:        "s3",
		kind:        "s3_mount (Versity Gateway)",
		baselineHow: fmt.Sprintf("AWS SDK download to a local dir, %d at once", mount.DefaultConcurrency),
		bucket:      srv.CreateBucket,
		put: func(ctx context.Context, bucket, key string, data []byte) error {
			_, err := cl.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: aws.String(key), Body: bytes.NewReader(data)})
			return err
		},
		get: func(ctx context.Context, bucket, key string) (io.ReadCloser, error) {
			out, err := cl.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: aws.String(key)})
			if err != nil {
				return nil, err
			}
			return out.Body, nil
		},
		secrets: manifest.SecretMap{"ID": srv.AccessKey, "SECRET": srv.SecretKey},
		entry: func(bucket string) *manifest.Entry {
			return &manifest.Entry{Type: manifest.TypeS3Mount, Mount: &manifest.Mount{Bucket: bucket, Prefix: "bench", Endpoint: srv.Endpoint, Region: srv.Region,
				ReadOnly: &ro, Credentials: map[string]manifest.SecretRef{"access_key_id": manifest.Secret("ID"), "secret_access_key": manifest.Secret("SECRET")}}}
		},
	}, srv.Stop, nil
}

// startGCSSide starts fake-gcs-server over dir: the GCS side of the
// figure, its baseline plain JSON API media GETs. stop stops the server.
func startGCSSide(ctx context.Context, dir string) (side *mountSide, stop func(), err error) {
	srv, err := gcsserver.Run(ctx, dir, io.Discard)
	if err != nil {
		return nil, nil, err
	}
	ro := true
	return &mountSide{
		name:        "gcs",
		kind:        "gcs_mount (fake-gcs-server)",
		baselineHow: fmt.Sprintf("JSON API media GETs to a local dir, %d at once", mount.DefaultConcurrency),
		bucket:      srv.CreateBucket,
		put: func(ctx context.Context, bucket, key string, data []byte) error {
			_, err := srv.Put(ctx, bucket, key, data)
			return err
		},
		get: func(ctx context.Context, bucket, key string) (io.ReadCloser, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.Endpoint+"/storage/v1/b/"+url.PathEscape(bucket)+"/o/"+url.PathEscape(key)+"?alt=media", nil)
			if err != nil {
				return nil, err
			}
			req.Header.Set("Authorization", "Bearer bench")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return nil, err
			}
			if resp.StatusCode != http.StatusOK {
				resp.Body.Close()
				return nil, fmt.Errorf("get %s: HTTP %d", key, resp.StatusCode)
			}
			return resp.Body, nil
		},
		secrets: manifest.SecretMap{"TOKEN": "bench"},
		entry: func(bucket string) *manifest.Entry {
			return &manifest.Entry{Type: manifest.TypeGCSMount, Mount: &manifest.Mount{Bucket: bucket, Prefix: "bench", Endpoint: srv.Endpoint,
				ReadOnly: &ro, Credentials: map[string]manifest.SecretRef{"access_token": manifest.Secret("TOKEN")}}}
		},
	}, srv.Stop, nil
}

// writeLocal writes r to path, making its directory.
func writeLocal(path string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
