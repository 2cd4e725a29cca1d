// Package gcsmount is the mount.Backend of gcs_mount entries: Google Cloud
// Storage buckets through a small hand-written JSON API client with OAuth
// bearer tokens (an access token, a service account's key, or
// Config.Tokens), tested against fake-gcs-server. It is a package of its
// own so that a program mounting no GCS bucket links none of it (nor
// golang.org/x/oauth2).
//
//	m, err := mount.New(mount.Config{Secrets: mount.EnvSecrets(),
//		Backends: []mount.Backend{gcsmount.New(gcsmount.Config{})}})
package gcsmount
