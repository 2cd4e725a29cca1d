// Package s3store is a snapshot.Store in an S3-compatible bucket (AWS S3,
// R2, MinIO, Versity Gateway), content addressed: archives are cut into
// chunks stored once each, so a second snapshot of a slightly changed
// workspace uploads only what changed (see Store). It is a package of its
// own so that a program using only local snapshots (snapshot.Local) links
// no AWS SDK code.
//
//	store, err := s3store.New(s3store.Config{Bucket: "snaps", Prefix: "team", Region: "eu-west-1",
//		Credentials: creds})
//	c := compute.NewClient(p, compute.ClientOptions{Snapshots: store})
package s3store
