package s3store

import "context"

// ChunkKeys returns the object keys of snapshot id's chunks, for tests
// that damage them.
func (s *Store) ChunkKeys(ctx context.Context, id string) ([]string, error) {
	doc, _, err := s.readManifest(ctx, id)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(doc.Chunks))
	for i, c := range doc.Chunks {
		keys[i] = s.chunkKey(c.Hash)
	}
	return keys, nil
}

// Encode compresses b as the store compresses chunks.
func (s *Store) Encode(b []byte) []byte { return s.enc.EncodeAll(b, nil) }
