//go:build ignore

// gen_xterm bundles xterm.js for the console from Debian's node-xterm and
// libjs-xterm packages (apt-get install node-xterm libjs-xterm): Debian ships it as CommonJS modules
// under /usr/share/nodejs/xterm/lib (and libjs-xterm's browser build is
// broken), so this wraps each module in a function with a tiny require()
// and writes one browser script, assets/vendor/xterm/xterm.js, that sets
// window.Terminal (with the fit addon as window.Terminal.fitAddon). It
// copies xterm.css beside it. Run it with `go generate` in this directory
// after the package changes; the output is committed.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

const (
	src = "/usr/share/nodejs/xterm"
	out = "assets/vendor/xterm"
)

var (
	requireRe = regexp.MustCompile(`require\("(\.[^"]*)"\)`)
	mapRe     = regexp.MustCompile(`(?m)^//# sourceMappingURL=.*$`)
)

func main() {
	var pkg struct{ Version string }
	b, err := os.ReadFile(filepath.Join(src, "package.json"))
	if err != nil {
		log.Fatalf("node-xterm not installed (apt-get install node-xterm): %v", err)
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		log.Fatal(err)
	}
	mods := map[string][]byte{}
	lib := filepath.Join(src, "lib")
	err = fs.WalkDir(os.DirFS(lib), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".js") || strings.HasSuffix(p, ".test.js") {
			return err
		}
		if strings.HasPrefix(p, "addons/") {
			return nil // read below: lib/addons is a symlink into libjs-xterm
		}
		b, err := os.ReadFile(filepath.Join(lib, p))
		if err != nil {
			return err
		}
		mods[strings.TrimSuffix(p, ".js")] = mapRe.ReplaceAll(b, nil)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// The fit addon (sizes the terminal to its box) comes from libjs-xterm,
	// which node-xterm's lib/addons links to.
	fit, err := os.ReadFile(filepath.Join(lib, "addons", "fit", "fit.js"))
	if err != nil {
		log.Fatalf("xterm's fit addon (apt-get install libjs-xterm): %v", err)
	}
	mods["addons/fit/fit"] = mapRe.ReplaceAll(fit, nil)
	// Every relative require must resolve to a module of the bundle.
	names := make([]string, 0, len(mods))
	for name, body := range mods {
		names = append(names, name)
		for _, m := range requireRe.FindAllSubmatch(body, -1) {
			dep := path.Join(path.Dir(name), string(m[1]))
			if _, ok := mods[dep]; !ok {
				log.Fatalf("%s requires %s: not in the bundle", name, dep)
			}
		}
	}
	sort.Strings(names)
	var w bytes.Buffer
	fmt.Fprintf(&w, "/* xterm.js %s, MIT licensed (see LICENSE beside this file).\n", pkg.Version)
	w.WriteString(" * Bundled from Debian's node-xterm CommonJS modules by gen_xterm.go; do not edit. */\n")
	w.WriteString("(function () {\n'use strict';\nvar defs = {};\n")
	for _, name := range names {
		fmt.Fprintf(&w, "defs[%q] = function (module, exports, require) {\n%s\n};\n", name, bytes.TrimSpace(mods[name]))
	}
	w.WriteString(`var cache = {};
function load(name) {
  if (cache[name]) { return cache[name].exports; }
  var def = defs[name];
  if (!def) { throw new Error('xterm bundle: no module ' + name); }
  var module = { exports: {} };
  cache[name] = module;
  var dir = name.slice(0, name.lastIndexOf('/') + 1);
  def.call(module.exports, module, module.exports, function (rel) {
    var parts = (dir + rel).split('/'), outp = [];
    for (var i = 0; i < parts.length; i++) {
      if (parts[i] === '..') { outp.pop(); } else if (parts[i] !== '.' && parts[i] !== '') { outp.push(parts[i]); }
    }
    return load(outp.join('/'));
  });
  return module.exports;
}
window.Terminal = load('public/Terminal').Terminal;
window.Terminal.fitAddon = load('addons/fit/fit');
})();
`)
	if err := os.MkdirAll(out, 0o755); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "xterm.js"), w.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	css, err := os.ReadFile(filepath.Join(lib, "xterm.css"))
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "xterm.css"), css, 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s/xterm.js: xterm %s, %d modules, %d bytes\n", out, pkg.Version, len(names), w.Len())
}
