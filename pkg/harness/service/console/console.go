// Package console is the web console of `harness serve`: static HTML, CSS
// and JavaScript embedded in the binary and served by Handler. The pages
// call the service's JSON API (Connect's JSON over HTTP POST, run events as
// Server-Sent Events) with the bearer token the user pastes once; nothing
// is built at run time and nothing is loaded from another origin.
//
// Pages (hash routes of one document, so the console works under any mount
// path): #/sandboxes (create, pause/resume, fork, snapshot and delete
// sandboxes; the snapshots), #/sandboxes/{id} (a sandbox's exposed ports
// with their preview links), #/runs, #/runs/{id} (the run's timeline with
// its approvals; apply_patch calls as coloured diffs),
// #/sandboxes/{id}/terminal (xterm.js over a WebSocket) and
// #/sandboxes/{id}/files (a file browser with download).
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:generate go run gen_xterm.go

//go:embed assets
var assets embed.FS

// MountPath is where the service mounts Handler: the console's pages live
// below it and the API it calls is found relative to it (one level up).
const MountPath = "/console/"

// FS returns the console's files (index.html at its root).
func FS() fs.FS {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic("console: embedded assets missing: " + err.Error()) // a build error, not a run-time one
	}
	return sub
}

// Handler serves the console at MountPath. Mount it on the service's mux
// at MountPath or at "/" (catching what the API does not take), without
// http.StripPrefix: it reads the full request path. "/" redirects to
// MountPath; other paths outside it are not found. Only GET and HEAD are
// answered. Every response carries a strict Content-Security-Policy (no
// inline script, nothing from another origin) so that agent output the
// pages show as text could never run as script even if a page forgot to
// escape it.
func Handler() http.Handler {
	files := http.FileServerFS(FS())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == "/" || r.URL.Path == strings.TrimSuffix(MountPath, "/") {
			http.Redirect(w, r, MountPath, http.StatusFound)
			return
		}
		rest, ok := strings.CutPrefix(r.URL.Path, MountPath)
		if !ok {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		// The assets change only with the binary; revalidate so an
		// upgraded service never runs yesterday's script.
		h.Set("Cache-Control", "no-cache")
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + rest
		r2.URL.RawPath = ""
		files.ServeHTTP(w, r2)
	})
}

// contentSecurityPolicy allows the console's own files and API only.
// style-src needs 'unsafe-inline' for the style attributes xterm.js sets
// on the elements it draws; scripts stay 'self' only, so injected markup
// can never run.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data:; font-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
