#!/usr/bin/env bash
# Builds the Bulkhead sandbox images locally, with no registry:
#
#   bulkhead/sandbox:dev       FROM scratch: busybox (Debian's busybox-static),
#                              git and GNU wget (the host's, plus exactly the
#                              libraries ldd reports), the host's CA bundle, a
#                              minimal /etc, and sandbox-agentd.
#   bulkhead/sandbox-full:dev  a debootstrap --variant=minbase root filesystem
#                              (bash, coreutils, python3, git, passwd, curl,
#                              wget, ca-certificates) plus sandbox-agentd.
#
# usage: images/build.sh [sandbox|sandbox-full|all]...
#        images/build.sh rootfs DIR
#
# `rootfs DIR` writes the small image's root filesystem, without the daemon
# (the local provider binds its own) and without Docker: the root filesystem
# of the local provider's sandboxes (local.Config.RootFS, `harness
# --sandbox-rootfs DIR`). The tree is staged beside DIR and hashed (as a
# deterministic tar), kept as .NAME-HASH beside DIR, and DIR is made a
# symbolic link to it (replaced atomically); when DIR already points at
# that hash nothing changes. A harness resolves the link when it starts, so
# the sandboxes of one that is running keep their tree: an earlier tree is
# left in place (the script says so) for its owner to remove.
#
# Each image is imported (`docker import`) from a tarball written with a
# sorted file order, numeric owners and every mtime set to SOURCE_DATE_EPOCH,
# and labelled with a hash of its inputs (dev.bulkhead.image.inputs); an
# image whose label already matches is not rebuilt. The debootstrap root
# filesystem is cached as a tarball under $BULKHEAD_CACHE, keyed by suite,
# architecture and package list.
#
# Environment:
#   AGENTD             the static daemon (default: bin/sandbox-agentd)
#   SOURCE_DATE_EPOCH  mtime of every file in the images (default: fixed)
#   BULKHEAD_CACHE     cache directory (default: ${XDG_CACHE_HOME:-$HOME/.cache}/bulkhead)
#   DEBIAN_MIRROR      debootstrap mirror (default: debootstrap's own)
#   FORCE=1            rebuild even when the input hash matches
#   DOCKER             docker CLI (default: docker)
set -euo pipefail
shopt -s inherit_errexit

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
AGENTD="${AGENTD:-$root/bin/sandbox-agentd}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1704067200}" # 2024-01-01T00:00:00Z
BULKHEAD_CACHE="${BULKHEAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bulkhead}"
DOCKER="${DOCKER:-docker}"
FORCE="${FORCE:-0}"

SMALL_IMAGE="bulkhead/sandbox:dev"
FULL_IMAGE="bulkhead/sandbox-full:dev"
INPUTS_LABEL="dev.bulkhead.image.inputs"
AGENTD_IN_IMAGE="/usr/local/bin/sandbox-agentd"
FULL_SUITE="bookworm"

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }
sha() { sha256sum "$@" | cut -d' ' -f1; }

# Temporary directories removed on exit, whatever happens.
CLEANUP=()
trap 'rm -rf "${CLEANUP[@]}"' EXIT

# The image configuration both images share; part of each input hash.
IMAGE_CHANGES=(
	"ENTRYPOINT [\"$AGENTD_IN_IMAGE\"]"
	"ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	"WORKDIR /workspace"
	"LABEL dev.bulkhead.image=1"
)

# deterministic_tar DIR OUT [tar options...]: DIR's contents, sorted, every
# mtime SOURCE_DATE_EPOCH, numeric owners, no atime/ctime.
deterministic_tar() {
	local dir="$1" out="$2"
	shift 2
	tar --create --file "$out" --directory "$dir" --format=gnu --sort=name \
		--mtime="@$SOURCE_DATE_EPOCH" --numeric-owner "$@" .
}

# current_inputs IMAGE: the input hash an existing image was built from.
current_inputs() {
	"$DOCKER" image inspect --format "{{ index .Config.Labels \"$INPUTS_LABEL\" }}" "$1" 2>/dev/null || true
}

# import_image TARBALL IMAGE INPUTS: docker import with the shared config,
# then drop the image the tag pointed at before (when nothing uses it).
import_image() {
	local tarball="$1" image="$2" inputs="$3" old new
	old="$("$DOCKER" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)"
	local args=()
	for c in "${IMAGE_CHANGES[@]}"; do args+=(--change "$c"); done
	args+=(--change "LABEL $INPUTS_LABEL=$inputs")
	new="$("$DOCKER" import "${args[@]}" --message "bulkhead images/build.sh" "$tarball" "$image")"
	if [ -n "$old" ] && [ "$old" != "$new" ]; then
		"$DOCKER" image rm "$old" >/dev/null 2>&1 || true
	fi
	log "$image: $("$DOCKER" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.1f MB", $1/1e6}')"
}

# copy_with_libs FILE STAGE: copies FILE and every library ldd reports for
# it (and the dynamic loader) into STAGE at the same paths.
copy_with_libs() {
	local file="$1" stage="$2" lib
	install -D -m 0755 "$file" "$stage$file"
	while read -r lib; do
		[ -n "$lib" ] || continue
		[ -e "$stage$lib" ] && continue
		install -D -m 0755 "$(readlink -f "$lib")" "$stage$lib"
	done < <(ldd "$file" | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}')
}

# ---------------------------------------------------------------- sandbox
# stage_small STAGE: writes the small image's tree, without the daemon,
# into the new directory STAGE: busybox and its applet links, git with its
# libraries and helpers, GNU wget with its libraries, the CA bundle, and
# etc/passwd and etc/group.
stage_small() {
	local stage="$1"
	command -v busybox >/dev/null || [ -x /bin/busybox ] || die "busybox not found: apt-get install busybox-static"
	local busybox
	busybox="$(command -v busybox || echo /bin/busybox)"
	# ldd fails on a static executable.
	! ldd "$busybox" >/dev/null 2>&1 || die "$busybox is not static: apt-get install busybox-static"
	local git=/usr/bin/git gitcore=/usr/lib/git-core
	[ -x "$git" ] || die "$git not found: apt-get install git"
	local wget=/usr/bin/wget cabundle=/etc/ssl/certs/ca-certificates.crt
	{ [ -x "$wget" ] && "$wget" --version 2>/dev/null | grep -q '^GNU Wget'; } || die "GNU wget not found at $wget: apt-get install wget"
	[ -s "$cabundle" ] || die "$cabundle not found: apt-get install ca-certificates"

	mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,dev,proc,sys,run/bulkhead,var/tmp,workspace}
	chmod 0755 "$stage"
	install -d -m 0700 "$stage/root"
	install -d -m 1777 "$stage/tmp"
	chmod 1777 "$stage/var/tmp"
	chmod 0700 "$stage/run/bulkhead"

	# busybox and its applet links (what `busybox --install -s` makes),
	# without its wget applet (see below for why): Debian's busybox-static
	# is built with FEATURE_SH_STANDALONE, so its shell runs an applet in
	# preference to any program of the same name in PATH, and a GNU wget in
	# /usr/bin would never run from `sh -c`. The applet's name is renamed
	# in the applet table, in place and to a name of the same length that
	# keeps the table sorted (its lookup is a search of that sorted table):
	# `wget` is then no applet, and the shell finds /usr/bin/wget.
	install -m 0755 "$busybox" "$stage/bin/busybox"
	local offsets
	offsets="$(LC_ALL=C grep -obUaP '\x00wc\x00wget\x00which\x00' "$stage/bin/busybox" | cut -d: -f1)"
	[ "$(printf '%s\n' "$offsets" | grep -c .)" = 1 ] ||
		die "$busybox: its applet table does not hold wc, wget, which exactly once; cannot take its wget applet out"
	printf 'wg-t' | dd of="$stage/bin/busybox" bs=1 seek=$((offsets + 4)) conv=notrunc status=none
	if "$stage/bin/busybox" --list | grep -qx wget || ! "$stage/bin/busybox" --list | grep -qx wc; then
		die "$busybox: renaming its wget applet failed"
	fi
	local applet
	while read -r applet; do
		case "$applet" in "" | bin/busybox | linuxrc | */ | */wg-t) continue ;; esac
		[ -e "$stage/$applet" ] || ln -s /bin/busybox "$stage/$applet"
	done < <("$stage/bin/busybox" --list-full)

	# git, its libraries, and the git-core helpers local operations need:
	# the builtin links, the shell-script helpers, and the templates.
	copy_with_libs "$git" "$stage"
	mkdir -p "$stage$gitcore"
	ln -s "$git" "$stage$gitcore/git"
	# (Few processes per helper: on a busy machine each one costs.)
	local f name first builtins=() scripts=()
	for f in "$gitcore"/*; do
		name="${f##*/}"
		if [ -L "$f" ]; then
			case "$(readlink "$f")" in git | "$gitcore/git" | /usr/bin/git) builtins+=("$name") ;; esac
		elif [ -f "$f" ]; then
			first=""
			IFS= read -r -n 64 first <"$f" || true
			[[ "$first" == '#!/bin/sh'* ]] && scripts+=("$f")
		fi
	done
	for name in "${builtins[@]}"; do ln -s git "$stage$gitcore/$name"; done
	[ ${#scripts[@]} -eq 0 ] || cp --preserve=mode -t "$stage$gitcore/" "${scripts[@]}"
	[ -x "$gitcore/git-sh-i18n--envsubst" ] && copy_with_libs "$gitcore/git-sh-i18n--envsubst" "$stage"
	[ -d "$gitcore/mergetools" ] && cp -a "$gitcore/mergetools" "$stage$gitcore/"
	[ -d /usr/share/git-core/templates ] && mkdir -p "$stage/usr/share/git-core" &&
		cp -a /usr/share/git-core/templates "$stage/usr/share/git-core/"

	# wget: GNU wget (the host's, plus the libraries ldd reports, as for
	# git) in place of busybox's applet. Debian's busybox-static 1.35 is
	# built without FEATURE_WGET_TIMEOUT yet still parses -T SECONDS, into
	# a NULL pointer: `wget -T 10 URL` dies of SIGSEGV (exit 139) before it
	# connects, wherever it runs. Its wget also sends an https:// URL to a
	# proxy as a plain GET (the egress proxy tunnels https through CONNECT
	# only) and prints none of a refusal's headers. The CA bundle lets wget
	# (and git) check servers' certificates.
	copy_with_libs "$wget" "$stage"
	install -D -m 0644 "$cabundle" "$stage/etc/ssl/certs/ca-certificates.crt"

	install -m 0644 "$here/sandbox/etc/passwd" "$here/sandbox/etc/group" "$stage/etc/"
}

build_small() {
	local work stage
	work="$(mktemp -d "${TMPDIR:-/tmp}/bulkhead-image.XXXXXX")"
	CLEANUP+=("$work")
	stage="$work/rootfs"
	stage_small "$stage"
	install -m 0755 "$AGENTD" "$stage$AGENTD_IN_IMAGE"

	deterministic_tar "$stage" "$work/rootfs.tar" --owner=0 --group=0
	local inputs
	inputs="$(printf '%s\n' "$(sha "$work/rootfs.tar")" "${IMAGE_CHANGES[@]}" | sha256sum | cut -d' ' -f1)"
	if [ "$FORCE" != 1 ] && [ "$(current_inputs "$SMALL_IMAGE")" = "$inputs" ]; then
		log "$SMALL_IMAGE is up to date ($inputs)"
		return
	fi
	log "importing $SMALL_IMAGE ($inputs)"
	import_image "$work/rootfs.tar" "$SMALL_IMAGE" "$inputs"
}

# ---------------------------------------------------------- sandbox-full
# full_rootfs prints the path of the cached debootstrap tarball, building
# it first when the cache has none for this suite and package list.
full_rootfs() {
	command -v debootstrap >/dev/null || die "debootstrap not found: apt-get install debootstrap"
	local arch packages key tarball
	arch="$(dpkg --print-architecture)"
	packages="$(grep -v '^\s*#' "$here/sandbox-full/packages" | tr -s ' \n' '\n' | sed '/^$/d' | LC_ALL=C sort -u | paste -sd, -)"
	key="$(printf 'suite=%s\narch=%s\npackages=%s\nmirror=%s\nrecipe=3\n' "$FULL_SUITE" "$arch" "$packages" "${DEBIAN_MIRROR:-}" | sha256sum | cut -c1-16)"
	tarball="$BULKHEAD_CACHE/rootfs-$FULL_SUITE-$arch-$key.tar"
	if [ -s "$tarball" ]; then
		log "cached root filesystem: $tarball"
		echo "$tarball"
		return
	fi
	local work start
	work="$(mktemp -d "$BULKHEAD_CACHE/debootstrap.XXXXXX")"
	CLEANUP+=("$work")
	start=$SECONDS
	log "debootstrap --variant=minbase $FULL_SUITE ($packages); takes a few minutes"
	# shellcheck disable=SC2086 # DEBIAN_MIRROR is optional
	if ! debootstrap --variant=minbase --arch="$arch" --include="$packages" \
		"$FULL_SUITE" "$work/rootfs" ${DEBIAN_MIRROR:-} >"$work/debootstrap.log" 2>&1; then
		tail -30 "$work/debootstrap.log" >&2
		rm -rf "$work"
		die "debootstrap failed (log above)"
	fi
	local r="$work/rootfs"
	# Drop what differs from run to run or is only a cache.
	rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/* \
		"$r"/var/log/* "$r"/var/cache/ldconfig/aux-cache "$r"/var/cache/debconf/*-old \
		"$r"/var/lib/dpkg/*-old "$r"/dev/* "$r"/proc/* "$r"/sys/* "$r"/run/* "$r"/tmp/* "$r"/root/.bash_history
	find "$r" -name __pycache__ -type d -prune -exec rm -rf {} +
	: >"$r/etc/machine-id"
	echo sandbox >"$r/etc/hostname"
	mkdir -p "$r/workspace" "$r/run/bulkhead" "$r/usr/local/bin"
	chmod 0700 "$r/run/bulkhead"
	deterministic_tar "$r" "$work/rootfs.tar"
	mv "$work/rootfs.tar" "$tarball"
	rm -rf "$work"
	log "root filesystem built in $((SECONDS - start))s: $tarball ($(du -h "$tarball" | cut -f1))"
	echo "$tarball"
}

build_full() {
	mkdir -p "$BULKHEAD_CACHE"
	local base inputs
	base="$(full_rootfs)"
	inputs="$(printf '%s\n' "$(basename "$base")" "$(sha "$AGENTD")" "$(sha "${BASH_SOURCE[0]}")" "${IMAGE_CHANGES[@]}" | sha256sum | cut -d' ' -f1)"
	if [ "$FORCE" != 1 ] && [ "$(current_inputs "$FULL_IMAGE")" = "$inputs" ]; then
		log "$FULL_IMAGE is up to date ($inputs)"
		return
	fi
	local work
	work="$(mktemp -d "$BULKHEAD_CACHE/full.XXXXXX")"
	CLEANUP+=("$work")
	cp "$base" "$work/rootfs.tar"
	install -D -m 0755 "$AGENTD" "$work/add$AGENTD_IN_IMAGE"
	tar --append --file "$work/rootfs.tar" --directory "$work/add" --format=gnu \
		--mtime="@$SOURCE_DATE_EPOCH" --numeric-owner --owner=0 --group=0 ".$AGENTD_IN_IMAGE"
	log "importing $FULL_IMAGE ($inputs)"
	import_image "$work/rootfs.tar" "$FULL_IMAGE" "$inputs"
}

# ---------------------------------------------------------------- rootfs
# build_rootfs DIR: the small image's tree, without the daemon, at DIR
# (see the header). Runs without Docker and without the daemon.
build_rootfs() {
	[ -n "${1:-}" ] || die "usage: images/build.sh rootfs DIR"
	# DIR itself is (or becomes) a symbolic link: resolve its parent only.
	local parent name dest
	parent="$(realpath -m "$(dirname "$1")")"
	name="$(basename "$1")"
	case "$name" in / | . | ..) die "rootfs: DIR must name a directory to make, not $1" ;; esac
	dest="$parent/$name"
	mkdir -p "$parent"
	# One build of DIR at a time (parallel test binaries share a cache).
	exec 8>"$parent/.$name.lock"
	flock 8
	local stage work inputs tree
	stage="$(mktemp -d "$parent/.$name.new.XXXXXX")"
	CLEANUP+=("$stage")
	stage_small "$stage"
	work="$(mktemp -d "${TMPDIR:-/tmp}/bulkhead-rootfs.XXXXXX")"
	CLEANUP+=("$work")
	deterministic_tar "$stage" "$work/rootfs.tar" --owner=0 --group=0
	inputs="$(sha "$work/rootfs.tar")"
	tree=".$name-${inputs:0:16}"
	if [ "$FORCE" != 1 ] && [ -L "$dest" ] && [ "$(readlink "$dest")" = "$tree" ] && [ -d "$parent/$tree" ]; then
		log "$dest is up to date ($tree)"
		return
	fi
	if [ -d "$parent/$tree" ]; then
		rm -rf "$stage"
	else
		mv -T "$stage" "$parent/$tree"
	fi
	if [ -e "$dest" ] && [ ! -L "$dest" ]; then
		local aside
		aside="$(mktemp -d "$parent/.$name.old.XXXXXX")"
		mv -T "$dest" "$aside/tree"
		log "moved the directory that was at $dest to $aside/tree"
	fi
	local previous=""
	[ -L "$dest" ] && previous="$(readlink "$dest")"
	ln -sfn "$tree" "$parent/.$name.link"
	mv -T "$parent/.$name.link" "$dest"
	log "$dest -> $tree: root filesystem written ($(du -sh "$parent/$tree" | cut -f1))"
	if [ -n "$previous" ] && [ "$previous" != "$tree" ]; then
		log "the previous tree $parent/$previous stays for the sandboxes that use it: remove it once none does"
	fi
}

main() {
	if [ "${1:-}" = rootfs ]; then
		[ $# -le 2 ] || die "usage: images/build.sh rootfs DIR"
		build_rootfs "${2:-}"
		return
	fi
	[ -x "$AGENTD" ] || die "$AGENTD not found: run \`make build\` first"
	! ldd "$AGENTD" >/dev/null 2>&1 || die "$AGENTD is not static (build it with CGO_ENABLED=0: make build)"
	"$DOCKER" version --format '{{.Server.Version}}' >/dev/null || die "docker does not answer"
	mkdir -p "$BULKHEAD_CACHE"
	# One build at a time per cache (concurrent test runs share it).
	exec 9>"$BULKHEAD_CACHE/lock"
	flock 9
	local targets=("$@")
	[ ${#targets[@]} -gt 0 ] || targets=(all)
	local t start
	for t in "${targets[@]}"; do
		start=$SECONDS
		case "$t" in
		sandbox) build_small ;;
		sandbox-full) build_full ;;
		all) build_small && build_full ;;
		*) die "unknown image $t (want sandbox, sandbox-full or all; or rootfs DIR)" ;;
		esac
		log "$t: done in $((SECONDS - start))s"
	done
}

main "$@"
