package archive

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash"
	"io"
)

// FingerprintVersion prefixes every fingerprint. It changes whenever the
// hashed encoding does, so fingerprints of different versions never match.
const FingerprintVersion = "v1"

// fingerprintMagic starts the hashed stream.
const fingerprintMagic = "bulkhead workspace fingerprint v1\n"

// Fingerprint returns a stable hash of the workspace tree at root, as
// FingerprintVersion + ":" + lowercase hex SHA-256, for deciding whether a
// workspace still matches the snapshot it was restored from.
//
// The hash covers what Write archives and Restore recreates, visited in the
// same order with the same exclusions: every path, its type, its permission
// bits (with setuid, setgid and sticky), the size and content of regular
// files, symbolic link targets, and which names are hard links to which.
// Owners and timestamps are left out: a restore by a daemon that is not
// root does not preserve owners, and tools touch mtimes without changing
// anything. opts.Extra is hashed last (length-prefixed), e.g. the canonical
// bytes of the manifest.
//
// The result depends only on the tree and Extra, never on readdir order,
// creation order or the time of the call. Like Write, Fingerprint refuses
// (errkind.ErrFailedPrecondition) while an interrupted restore of root is
// incomplete.
func Fingerprint(ctx context.Context, root string, opts FingerprintOptions) (string, error) {
	exclude, err := newExcludeSet(opFingerprint, opts.Exclude)
	if err != nil {
		return "", err
	}
	if err := refuseIncomplete(opFingerprint, root); err != nil {
		return "", err
	}
	fp := &fingerprinter{ctx: ctx, sum: sha256.New(), file: sha256.New(), buf: make([]byte, copyBufSize)}
	fp.sum.Write([]byte(fingerprintMagic))
	wk := &walker{ctx: ctx, op: opFingerprint, exclude: exclude, visit: fp.visit}
	if err := wk.walk(root); err != nil {
		return "", err
	}
	fp.rec = append(fp.rec[:0], 'E')
	fp.rec = binary.AppendUvarint(fp.rec, uint64(len(opts.Extra)))
	fp.sum.Write(fp.rec)
	fp.sum.Write(opts.Extra)
	return FingerprintVersion + ":" + hex.EncodeToString(fp.sum.Sum(nil)), nil
}

// fingerprinter hashes walked entries. Each entry is one record: a type
// byte, the length-prefixed path, then type-specific fields, all
// length-prefixed or fixed-size so that no two trees encode alike.
type fingerprinter struct {
	ctx  context.Context
	sum  hash.Hash
	file hash.Hash
	buf  []byte
	rec  []byte
}

// visit hashes the record of e.
func (f *fingerprinter) visit(e *entry) error {
	var tag byte
	switch e.kind {
	case kindDir:
		tag = 'd'
	case kindFile:
		tag = 'f'
	case kindSymlink:
		tag = 'l'
	case kindHardLink:
		tag = 'h'
	}
	r := append(f.rec[:0], tag)
	r = appendString(r, e.rel)
	switch e.kind {
	case kindDir:
		r = binary.AppendUvarint(r, uint64(e.st.Mode&0o7777))
	case kindFile:
		size, err := f.content(e)
		if err != nil {
			return err
		}
		r = binary.AppendUvarint(r, uint64(e.st.Mode&0o7777))
		r = binary.AppendUvarint(r, uint64(size))
		r = f.file.Sum(r)
	case kindSymlink, kindHardLink:
		r = appendString(r, e.target)
	}
	f.rec = r
	f.sum.Write(r)
	return nil
}

// content hashes the file's bytes into f.file and returns how many there
// were.
func (f *fingerprinter) content(e *entry) (int64, error) {
	f.file.Reset()
	var size int64
	for {
		if err := f.ctx.Err(); err != nil {
			return 0, pathErr(opFingerprint, e.rel, err)
		}
		n, err := e.file.Read(f.buf)
		f.file.Write(f.buf[:n])
		size += int64(n)
		if errors.Is(err, io.EOF) {
			return size, nil
		}
		if err != nil {
			return 0, pathErr(opFingerprint, e.rel, err)
		}
	}
}

// appendString appends s with its length in front.
func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}
