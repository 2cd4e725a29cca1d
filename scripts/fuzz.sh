#!/usr/bin/env bash
# Runs every fuzz target in the module for the given time each (default 30s).
# The seed corpora under testdata/fuzz/ are replayed by `make test` anyway;
# this explores beyond them.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${1:-30s}"
found=0
while IFS= read -r pkg; do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    found=1
    echo "== $pkg $target ($fuzztime)"
    go test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" "$pkg"
  done
done < <(go list ./...)
[ "$found" = 1 ] || { echo "no fuzz targets found" >&2; exit 1; }
