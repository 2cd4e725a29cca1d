// Package azuremount is the mount.Backend of azure_blob_mount entries:
// Azure Blob Storage containers through the official SDK
// (github.com/Azure/azure-sdk-for-go/sdk/storage/azblob). The SDK signs
// the requests (Shared Key, a SAS token in the URL, or an Entra ID bearer
// token from Config.Credential), pages the listing and retries what
// retrying can cure; this package maps its answers onto mount.Objects.
// Versions are ETags. It is a package of its own so that a program
// mounting no Azure container links no Azure SDK code.
//
// Tested at the unit level only (package mount's azure_test.go): no Azure
// Blob server can run here (Azurite is an npm package, and neither the Go
// module proxy nor Debian has an emulator), so the tests run the SDK
// against an in-test server implementing the subset of the Blob REST API
// used here, which checks each request's Shared Key signature with its
// own implementation of Microsoft's canonicalization (so a wrongly signed
// request fails).
//
//	m, err := mount.New(mount.Config{Secrets: mount.EnvSecrets(),
//		Backends: []mount.Backend{azuremount.New(azuremount.Config{})}})
package azuremount
