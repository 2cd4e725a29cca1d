#!/usr/bin/env bash
# Builds an image with sandbox-agentd baked in: the static daemon is built
# from this repository, put in a temporary build context with the
# Dockerfile, and `docker build` runs on that (nothing is pulled or pushed).
#
# usage: examples/docker-image/build.sh [BASE [TAG]]
#   BASE   the local image to extend (default: bulkhead/sandbox-full:dev)
#   TAG    the image to make (default: bulkhead/example-agentd:dev)
#
# Environment: VERSION and COMMIT are stamped into the daemon (default: git
# describe / rev-parse); GO and DOCKER name the tools (default: go, docker).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
BASE="${1:-bulkhead/sandbox-full:dev}"
TAG="${2:-bulkhead/example-agentd:dev}"
GO="${GO:-go}"
DOCKER="${DOCKER:-docker}"
VERSION="${VERSION:-$(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo dev)}"
COMMIT="${COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"

if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
	echo "build.sh: the base image $BASE is not in the local image store (make image builds bulkhead/sandbox:dev and bulkhead/sandbox-full:dev)" >&2
	exit 1
fi

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
pkg=github.com/bulkhead-dev/bulkhead/internal/buildinfo
(cd "$root" && CGO_ENABLED=0 "$GO" build -trimpath -tags grpcnotrace \
	-ldflags "-s -w -X $pkg.version=$VERSION -X $pkg.commit=$COMMIT" \
	-o "$context/sandbox-agentd" ./cmd/sandbox-agentd)
cp "$here/Dockerfile" "$context/Dockerfile"

"$DOCKER" build --quiet --build-arg "BASE=$BASE" --tag "$TAG" "$context" >/dev/null
echo "built $TAG from $BASE with sandbox-agentd $VERSION"
