package s3store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"

	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/s3client"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/internal/s3errs"
	"github.com/bulkhead-dev/bulkhead/pkg/compute/snapshot"
	"github.com/bulkhead-dev/bulkhead/pkg/errkind"
)

// Config configures an S3 store. Credentials are used to sign requests
// and are never logged, put in an error or a snapshot id; String redacts
// them.
type Config struct {
	// Bucket is the bucket holding the store (required).
	Bucket string
	// Prefix is the key prefix under which the store keeps its objects
	// ("team/snapshots"); empty means the bucket's root.
	Prefix string
	// Endpoint is the server's base URL for S3-compatible services (MinIO,
	// R2, Versity, a local gateway); empty means AWS.
	Endpoint string
	// Region signs requests; empty means us-east-1.
	Region string
	// UsePathStyle addresses buckets as endpoint/bucket rather than
	// bucket.endpoint; most S3-compatible servers want it.
	UsePathStyle bool
	// AccessKeyID, SecretAccessKey and SessionToken are static
	// credentials.
	AccessKeyID, SecretAccessKey, SessionToken string
	// Credentials, when set, provides credentials instead of the static
	// fields (an IAM role, a web identity).
	Credentials aws.CredentialsProvider

	// Chunking cuts archives into chunks; zero means DefaultChunking.
	Chunking Chunking
	// Concurrency bounds the chunks uploaded or downloaded at once (and so
	// the memory a transfer holds: about Concurrency+2 chunks); zero
	// means 8.
	Concurrency int
	// MaxAttempts bounds the tries of one request (the first included);
	// zero means 5.
	MaxAttempts int
	// RetryBaseDelay and RetryMaxDelay shape the exponential backoff with
	// jitter between tries; zero means 100ms and 5s.
	RetryBaseDelay, RetryMaxDelay time.Duration
	// PageSize is how many keys one listing request asks for; zero means
	// 1000 (the most S3 returns).
	PageSize int32
	// GCGrace protects chunks younger than it from garbage collection, so
	// that an upload in progress keeps the chunks it relies on; zero means
	// 24h. An upload must finish within half of it (see Put).
	GCGrace time.Duration
	// HTTPClient, when set, sends the requests.
	HTTPClient *http.Client
	// Log receives a line per snapshot stored or collected; nil means none.
	Log *zap.Logger
}

// String describes the store without its credentials.
func (c Config) String() string {
	s := "s3://" + c.Bucket
	if p := strings.Trim(c.Prefix, "/"); p != "" {
		s += "/" + p
	}
	if c.Endpoint != "" {
		s += " at " + c.Endpoint
	}
	return s
}

// GoString is String, so that %#v does not print credentials either.
func (c Config) GoString() string { return "s3store.Config(" + c.String() + ")" }

// Defaults applied by New.
const (
	defaultConcurrency = 8
	defaultMaxAttempts = 5
	defaultBaseDelay   = 100 * time.Millisecond
	defaultMaxDelay    = 5 * time.Second
	defaultPageSize    = 1000
	defaultGCGrace     = 24 * time.Hour
	// maxManifestBytes bounds a manifest read back: about 40 million
	// chunks' worth, far beyond any workspace.
	maxManifestBytes = 1 << 30
	// maxWindow bounds the zstd window (and so the decoder's memory) of
	// an archive Put decompresses, as the daemon's restore does.
	maxWindow = 128 << 20
)

// Stream encodings recorded in manifests: what Put read, and so what Get
// gives back.
const (
	encodingZstd = "zstd" // Put read zstd; Get returns zstd frames, one per chunk
	encodingRaw  = "raw"  // Put read other bytes; Get returns them as they were
)

// Store is a content-addressed snapshot.Store in an S3-compatible bucket.
//
// Put decompresses a zstd archive (the daemon's default) and cuts the
// plain tar stream into content-defined chunks (see Chunking); a chunk is
// stored once, zstd-compressed, under the SHA-256 of its plain bytes
// (PREFIX/chunks/ab/abcd...), so a second snapshot of a slightly changed
// workspace uploads only the chunks around the changes. Chunking the
// compressed stream would not work: a change shifts every zstd byte after
// it. A manifest (PREFIX/snapshots/ID: the chunk list and what was read) is
// written last, in one PUT: a snapshot is there completely or not at all,
// and a crash mid-upload leaves only unreferenced chunks, which GC removes.
//
// Get streams the chunks back in order, each verified against its key (the
// server's SHA-256 checksum is asked for and checked too). A zstd archive
// comes back as a zstd stream of one frame per chunk: the same tar, not
// the same compressed bytes.
type Store struct {
	client  *s3.Client
	bucket  string
	prefix  string // "" or ending in "/"
	desc    string
	secrets []string
	chunk   Chunking
	conc    int
	tries   int
	page    int32
	grace   time.Duration
	backoff backoff
	enc     *zstd.Encoder
	dec     *zstd.Decoder
	log     *zap.Logger

	// closing ends every Get still streaming when Close is called, and
	// inflight counts their goroutines, so Close releases the decoder only
	// after the last one stopped using it.
	closing  context.Context
	stop     context.CancelFunc
	inflight sync.WaitGroup
}

var _ snapshot.Lister = (*Store)(nil)

// New makes an S3 store. It does not contact the server: the first
// operation reports a wrong endpoint, bucket or credentials.
func New(cfg Config) (*Store, error) {
	if cfg.Bucket == "" || strings.ContainsAny(cfg.Bucket, "/ ") {
		return nil, fmt.Errorf("%w: S3 snapshot store: bucket %q: want a bucket name", errkind.ErrInvalidArgument, cfg.Bucket)
	}
	prefix := strings.Trim(cfg.Prefix, "/")
	for _, seg := range strings.Split(prefix, "/") {
		if prefix != "" && (seg == "" || seg == "." || seg == "..") {
			return nil, fmt.Errorf("%w: S3 snapshot store: prefix %q has an empty, . or .. segment", errkind.ErrInvalidArgument, cfg.Prefix)
		}
	}
	if prefix != "" {
		prefix += "/"
	}
	chunk := cfg.Chunking
	if chunk == (Chunking{}) {
		chunk = DefaultChunking()
	}
	if err := chunk.validate(); err != nil {
		return nil, fmt.Errorf("%w: S3 snapshot store: %w", errkind.ErrInvalidArgument, err)
	}
	s := &Store{bucket: cfg.Bucket, prefix: prefix, desc: cfg.String(), chunk: chunk,
		conc: orDefault(cfg.Concurrency, defaultConcurrency), tries: orDefault(cfg.MaxAttempts, defaultMaxAttempts),
		page: int32(orDefault(int(cfg.PageSize), defaultPageSize)), grace: cfg.GCGrace, log: cfg.Log}
	if s.grace <= 0 {
		s.grace = defaultGCGrace
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	creds := cfg.Credentials
	if creds == nil {
		if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
			return nil, fmt.Errorf("%w: S3 snapshot store %s: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)", errkind.ErrInvalidArgument, s.desc)
		}
		creds = credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)
	}
	for _, v := range []string{cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken} {
		if len(v) >= 4 {
			s.secrets = append(s.secrets, v)
		}
	}
	base, maxDelay := cfg.RetryBaseDelay, cfg.RetryMaxDelay
	if base <= 0 {
		base = defaultBaseDelay
	}
	if maxDelay <= 0 {
		maxDelay = defaultMaxDelay
	}
	s.backoff = backoff{base: base, max: maxDelay}
	// No retry budget: a store that comes back must not find it spent.
	// Checksums are asked for explicitly: SHA-256 on every PUT, and
	// validation on whole-object GETs (not on the one-byte reads of
	// statObject, which a full-object checksum would not match).
	s.client = s3client.New(s3client.Options{
		Region:       cfg.Region, // "" means s3client.DefaultRegion
		Endpoint:     cfg.Endpoint,
		UsePathStyle: cfg.UsePathStyle,
		Credentials:  creds,
		MaxAttempts:  s.tries,
		MaxBackoff:   maxDelay,
		Backoff:      s.backoff,
		HTTPClient:   cfg.HTTPClient,
	})
	var err error
	if s.enc, err = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(s.conc)); err != nil {
		return nil, fmt.Errorf("S3 snapshot store: zstd encoder: %w", err)
	}
	if s.dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(s.conc), zstd.WithDecoderMaxMemory(2*maxChunkSize)); err != nil {
		return nil, fmt.Errorf("S3 snapshot store: zstd decoder: %w", err)
	}
	s.closing, s.stop = context.WithCancel(context.Background())
	return s, nil
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// Close ends the Gets still streaming, waits for their fetches, and
// releases the store's compressors. The store is unusable after.
func (s *Store) Close() error {
	s.stop()
	s.inflight.Wait()
	s.enc.Close()
	s.dec.Close()
	return nil
}

// String describes the store (s3://bucket/prefix at endpoint), without
// credentials.
func (s *Store) String() string { return s.desc }

// GoString is String, so that %#v does not print credentials either.
func (s *Store) GoString() string { return "s3store.Store(" + s.desc + ")" }

func (s *Store) manifestKey(id string) string { return s.prefix + "snapshots/" + id }
func (s *Store) chunkPrefix() string          { return s.prefix + "chunks/" }
func (s *Store) chunkKey(h string) string     { return s.chunkPrefix() + h[:2] + "/" + h }

// manifest is the object that makes a snapshot: written last, read first.
type manifest struct {
	Version int       `json:"version"`
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
	// Encoding is what Put read: encodingZstd or encodingRaw.
	Encoding string `json:"encoding"`
	// Size and SHA256 describe the bytes Put read.
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// ContentSize is the sum of the chunks' (plain) sizes.
	ContentSize int64 `json:"content_size"`
	// Chunking names the algorithm and sizes that cut the chunks.
	Chunking string `json:"chunking"`
	// Chunks lists the stream's chunks in order; a chunk may repeat.
	Chunks []chunkRef `json:"chunks"`
}

// chunkRef names a chunk by the SHA-256 of its plain bytes.
type chunkRef struct {
	Hash string `json:"h"`
	Size int64  `json:"n"`
}

const manifestVersion = 1

// Put stores r under id. r may be a zstd archive (decompressed and chunked
// as plain tar) or any other byte stream (chunked as it is). New chunks are
// uploaded with bounded concurrency; chunks the bucket holds already are
// not uploaded again. The manifest is written last, and only when the
// upload finished within half of the GC grace period (so that no chunk it
// references was collected meanwhile). snapshot.Info.Uploaded and snapshot.Info.Reused say
// what the upload cost.
func (s *Store) Put(ctx context.Context, id string, r io.Reader) (snapshot.Info, error) {
	if err := snapshot.ValidateID(id); err != nil {
		return snapshot.Info{}, err
	}
	start := time.Now()
	in := &hashingReader{r: ctxReader{ctx: ctx, r: r}, h: sha256.New()}
	br := bufio.NewReaderSize(in, 64<<10)
	var src io.Reader = br
	encoding := encodingRaw
	if magic, _ := br.Peek(4); isZstdMagic(magic) {
		dec, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderMaxMemory(maxWindow), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return snapshot.Info{}, fmt.Errorf("snapshot %s: put: zstd decoder: %w", id, err)
		}
		defer dec.Close()
		src, encoding = dec, encodingZstd
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		uploaded int64
		reused   int
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel(err)
	}
	sem := make(chan struct{}, s.conc)
	seen := make(map[[sha256.Size]byte]bool)
	doc := manifest{Version: manifestVersion, ID: id, Encoding: encoding,
		Chunking: fmt.Sprintf("%s/%d/%d/%d", chunkingVersion, s.chunk.Min, s.chunk.Avg, s.chunk.Max)}
	ck := newChunker(src, s.chunk)
read:
	for ctx.Err() == nil {
		data, err := ck.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fail(s.sourceError(ctx, id, in, encoding, err))
			break
		}
		sum := sha256.Sum256(data)
		doc.Chunks = append(doc.Chunks, chunkRef{Hash: hex.EncodeToString(sum[:]), Size: int64(len(data))})
		doc.ContentSize += int64(len(data))
		if seen[sum] {
			continue
		}
		seen[sum] = true
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break read
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			n, old, err := s.storeChunk(ctx, hex.EncodeToString(sum[:]), data)
			if err != nil {
				fail(err)
				return
			}
			mu.Lock()
			uploaded += n
			if old {
				reused++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return snapshot.Info{}, fmt.Errorf("snapshot %s: put: %w", id, firstErr)
	}
	if err := context.Cause(ctx); err != nil {
		return snapshot.Info{}, s.classify(ctx, "put", id, err)
	}
	if took := time.Since(start); took > s.grace/2 {
		return snapshot.Info{}, errkind.MarkRetryable(fmt.Errorf("snapshot %s: put: %w: the upload took %s, more than half the GC grace period (%s); its chunks may have been collected, so no snapshot was written",
			id, errkind.ErrDeadlineExceeded, took.Round(time.Second), s.grace))
	}
	doc.Size, doc.SHA256, doc.Created = in.n, hex.EncodeToString(in.h.Sum(nil)), time.Now().UTC()
	body, err := json.Marshal(&doc)
	if err != nil {
		return snapshot.Info{}, fmt.Errorf("snapshot %s: put: encode manifest: %w", id, err)
	}
	if err := s.putObject(ctx, s.manifestKey(id), body, "application/json"); err != nil {
		return snapshot.Info{}, s.classify(ctx, "put manifest of", id, err)
	}
	uploaded += int64(len(body))
	info := snapshot.Info{ID: id, Size: doc.Size, SHA256: doc.SHA256, Modified: doc.Created, Chunks: len(doc.Chunks),
		Uploaded: uploaded, Reused: reused}
	s.log.Info("snapshot stored", zap.String("store", s.desc), zap.String("snapshot", id), zap.Int64("size", info.Size),
		zap.Int("chunks", info.Chunks), zap.Int("reused", reused), zap.Int64("uploaded", uploaded), zap.Duration("took", time.Since(start)))
	return info, nil
}

// sourceError classifies a failure to read what Put stores: the producer's
// error (an archive that failed), or a zstd stream that does not decode.
func (s *Store) sourceError(ctx context.Context, id string, in *hashingReader, encoding string, err error) error {
	if in.err != nil && !errors.Is(in.err, io.EOF) {
		if ctx.Err() != nil {
			return s.classify(ctx, "read the archive of", id, ctx.Err())
		}
		return fmt.Errorf("read the archive stream: %w", in.err)
	}
	if encoding == encodingZstd {
		return fmt.Errorf("%w: the archive stream is not valid zstd: %w", errkind.ErrInvalidArgument, err)
	}
	return fmt.Errorf("read the archive stream: %w", err)
}

// storeChunk makes sure the bucket holds the chunk named h, and returns
// the bytes uploaded for it and whether it was there already. A chunk that
// is there but older than half the grace period is touched (copied onto
// itself, server side) so that GC keeps it while this upload runs.
func (s *Store) storeChunk(ctx context.Context, h string, data []byte) (uploaded int64, reused bool, err error) {
	key := s.chunkKey(h)
	mod, err := s.statObject(ctx, key)
	if err == nil {
		if time.Since(mod) < s.grace/2 {
			return 0, true, nil
		}
		_, err = s.client.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &s.bucket, Key: &key, CopySource: aws.String(s.bucket + "/" + key),
			MetadataDirective: types.MetadataDirectiveReplace, Metadata: map[string]string{"touched": time.Now().UTC().Format(time.RFC3339)}})
		if err == nil {
			return 0, true, nil
		}
		if s3errs.IsUnavailable(err) || ctx.Err() != nil {
			return 0, false, s.classify(ctx, "touch chunk", h, err)
		}
		// Not there any more, or a server that cannot copy in place:
		// upload it again, which refreshes it as well.
	} else if !s3errs.IsNotFound(err) {
		return 0, false, s.classify(ctx, "look up chunk", h, err)
	}
	z := s.enc.EncodeAll(data, make([]byte, 0, len(data)/2+64))
	if err := s.putObject(ctx, key, z, "application/zstd"); err != nil {
		return 0, false, s.classify(ctx, "upload chunk", h, err)
	}
	return int64(len(z)), false, nil
}

// statObject returns the modification time of an object. It reads the
// object's first byte rather than asking HEAD, whose errors carry no code:
// a GET tells a missing key from a missing bucket or wrong credentials on
// every server.
func (s *Store) statObject(ctx context.Context, key string) (time.Time, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &key, Range: aws.String("bytes=0-0")})
	if err != nil {
		return time.Time{}, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(out.Body, 16))
	out.Body.Close()
	return aws.ToTime(out.LastModified), nil
}

// putObject uploads body with its SHA-256 for the server to check.
func (s *Store) putObject(ctx context.Context, key string, body []byte, contentType string) error {
	sum := sha256.Sum256(body)
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{Bucket: &s.bucket, Key: &key, Body: bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))), ContentType: aws.String(contentType),
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256, ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(sum[:]))})
	return err
}

// readManifest fetches and checks the manifest of id.
func (s *Store) readManifest(ctx context.Context, id string) (*manifest, time.Time, error) {
	key := s.manifestKey(id)
	body, mod, err := s.getObject(ctx, key, maxManifestBytes)
	if err != nil {
		return nil, time.Time{}, s.classify(ctx, "read manifest of", id, err)
	}
	var doc manifest
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, time.Time{}, fmt.Errorf("snapshot %s: %w: manifest does not decode: %w", id, snapshot.ErrCorrupt, err)
	}
	if doc.Version != manifestVersion {
		return nil, time.Time{}, fmt.Errorf("snapshot %s: %w: manifest version %d (this harness reads %d)", id, errkind.ErrUnimplemented, doc.Version, manifestVersion)
	}
	if doc.Encoding != encodingZstd && doc.Encoding != encodingRaw {
		return nil, time.Time{}, fmt.Errorf("snapshot %s: %w: manifest encoding %q", id, snapshot.ErrCorrupt, doc.Encoding)
	}
	for i, c := range doc.Chunks {
		if b, err := hex.DecodeString(c.Hash); err != nil || len(b) != sha256.Size || c.Size <= 0 || c.Size > maxChunkSize {
			return nil, time.Time{}, fmt.Errorf("snapshot %s: %w: manifest chunk %d is malformed", id, snapshot.ErrCorrupt, i)
		}
	}
	return &doc, mod, nil
}

// getObject reads an object whole (at most limit bytes), asking the server
// for its checksum, and retries a body that broke off.
func (s *Store) getObject(ctx context.Context, key string, limit int64) ([]byte, time.Time, error) {
	var lastErr error
	for attempt := range s.tries {
		if attempt > 0 {
			if err := sleepCtx(ctx, s.backoff.delay(attempt)); err != nil {
				return nil, time.Time{}, err
			}
		}
		out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &key, ChecksumMode: types.ChecksumModeEnabled})
		if err != nil {
			return nil, time.Time{}, err // the SDK retried already
		}
		body, err := io.ReadAll(io.LimitReader(out.Body, limit+1))
		out.Body.Close()
		if err == nil && int64(len(body)) > limit {
			return nil, time.Time{}, fmt.Errorf("%w: object %s is larger than %d bytes", snapshot.ErrCorrupt, key, limit)
		}
		if err == nil {
			return body, aws.ToTime(out.LastModified), nil
		}
		lastErr = err
		if ctx.Err() != nil || isChecksumMismatch(err) {
			return nil, time.Time{}, err
		}
	}
	return nil, time.Time{}, lastErr
}

// Get streams the snapshot back: chunks are fetched ahead with bounded
// concurrency, verified, and written in order. A failure mid-stream ends
// the reader with the classified error (retryable when the store was
// unreachable); the consumer sees a read error, never a short stream that
// ends cleanly.
func (s *Store) Get(ctx context.Context, id string) (io.ReadCloser, error) {
	if err := snapshot.ValidateID(id); err != nil {
		return nil, err
	}
	doc, _, err := s.readManifest(ctx, id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	stopOnClose := context.AfterFunc(s.closing, cancel)
	pr, pw := io.Pipe()
	type result struct {
		data []byte
		err  error
	}
	futures := make(chan chan result, s.conc)
	s.inflight.Add(1) // the producer; it counts each fetch it starts
	go func() {
		defer s.inflight.Done()
		defer close(futures)
		for _, c := range doc.Chunks {
			f := make(chan result, 1)
			select {
			case futures <- f:
			case <-ctx.Done():
				return
			}
			s.inflight.Add(1)
			go func() {
				defer s.inflight.Done()
				data, err := s.fetchChunk(ctx, doc.Encoding, c)
				f <- result{data, err}
			}()
		}
	}()
	go func() {
		defer stopOnClose()
		defer cancel()
		for f := range futures {
			res := <-f
			if res.err == nil {
				_, res.err = pw.Write(res.data)
			}
			if res.err != nil {
				cancel()
				pw.CloseWithError(fmt.Errorf("snapshot %s: get: %w", id, res.err))
				for f := range futures {
					<-f
				}
				return
			}
		}
		if err := ctx.Err(); err != nil {
			pw.CloseWithError(s.classify(ctx, "get", id, err))
			return
		}
		pw.Close()
	}()
	return &getReader{PipeReader: pr, cancel: cancel}, nil
}

// getReader is Get's stream; Close stops the fetches.
type getReader struct {
	*io.PipeReader
	cancel context.CancelFunc
}

func (g *getReader) Close() error {
	g.cancel()
	return g.PipeReader.Close()
}

// fetchChunk downloads a chunk and checks it against its name. It returns
// the bytes Get writes: the compressed frame for a zstd snapshot, the
// plain bytes otherwise.
func (s *Store) fetchChunk(ctx context.Context, encoding string, c chunkRef) ([]byte, error) {
	z, _, err := s.getObject(ctx, s.chunkKey(c.Hash), c.Size+c.Size/8+(64<<10))
	if err != nil {
		if s3errs.IsNotFound(err) {
			return nil, fmt.Errorf("chunk %s: %w: the chunk is missing from the store", c.Hash, snapshot.ErrCorrupt)
		}
		return nil, s.classify(ctx, "download chunk", c.Hash, err)
	}
	plain, err := s.dec.DecodeAll(z, make([]byte, 0, c.Size))
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w: does not decompress: %w", c.Hash, snapshot.ErrCorrupt, err)
	}
	sum := sha256.Sum256(plain)
	if int64(len(plain)) != c.Size || hex.EncodeToString(sum[:]) != c.Hash {
		return nil, fmt.Errorf("chunk %s: %w: its content does not match its SHA-256", c.Hash, snapshot.ErrCorrupt)
	}
	if encoding == encodingZstd {
		return z, nil
	}
	return plain, nil
}

// Exists reports whether a snapshot (its manifest) is stored under id.
func (s *Store) Exists(ctx context.Context, id string) (bool, error) {
	if err := snapshot.ValidateID(id); err != nil {
		return false, err
	}
	_, err := s.statObject(ctx, s.manifestKey(id))
	if s3errs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, s.classify(ctx, "stat", id, err)
	}
	return true, nil
}

// Delete removes the snapshot's manifest; its chunks stay until GC finds
// them unreferenced. Deleting an absent snapshot is not an error.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := snapshot.ValidateID(id); err != nil {
		return err
	}
	key := s.manifestKey(id)
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &key}); err != nil && !s3errs.IsNotFound(err) {
		return s.classify(ctx, "delete", id, err)
	}
	return nil
}

// Stat describes a stored snapshot from its manifest.
func (s *Store) Stat(ctx context.Context, id string) (snapshot.Info, error) {
	if err := snapshot.ValidateID(id); err != nil {
		return snapshot.Info{}, err
	}
	doc, mod, err := s.readManifest(ctx, id)
	if err != nil {
		return snapshot.Info{}, err
	}
	return snapshot.Info{ID: id, Size: doc.Size, SHA256: doc.SHA256, Modified: mod, Chunks: len(doc.Chunks)}, nil
}

// List calls fn for each stored snapshot, in key order, one listing page
// at a time (snapshot.Info has ID and Modified; Stat gives the rest).
func (s *Store) List(ctx context.Context, fn func(snapshot.Info) error) error {
	prefix := s.prefix + "snapshots/"
	return s.listObjects(ctx, prefix, func(o types.Object) error {
		id := strings.TrimPrefix(aws.ToString(o.Key), prefix)
		if snapshot.ValidateID(id) != nil {
			return nil // not ours
		}
		return fn(snapshot.Info{ID: id, Modified: aws.ToTime(o.LastModified)})
	})
}

// listObjects pages through the keys under prefix.
func (s *Store) listObjects(ctx context.Context, prefix string, fn func(types.Object) error) error {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &prefix, MaxKeys: aws.Int32(s.page)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return s.classify(ctx, "list", prefix, err)
		}
		for _, o := range page.Contents {
			if err := fn(o); err != nil {
				return err
			}
		}
	}
	return nil
}

// hashingReader counts and hashes what is read through it, and keeps the
// underlying reader's error.
type hashingReader struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	err error
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	if err != nil {
		h.err = err
	}
	return n, err
}

// isZstdMagic reports whether b starts a zstd frame.
func isZstdMagic(b []byte) bool {
	return len(b) >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd
}

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
