#!/bin/sh
# quickstart.sh runs the README's quick start literally: every line of the
# shell block between the quickstart:begin and quickstart:end markers, in
# order, from the repository's root, and fails on the first line that fails,
# so the README cannot drift from what works. CI runs it on a clean clone.
#
# It keeps its sandboxes apart from the user's: BULKHEAD_STATE_DIR is a
# fresh directory (searchable by others: a root harness's sandboxes run as
# accounts of their own), removed at the end with whatever is left in it.
set -eu
cd "$(dirname "$0")/.."
block=$(awk '/<!-- quickstart:begin/ {on=1; next} /<!-- quickstart:end/ {on=0} on' README.md |
	sed -e '/^```/d' -e '/^[[:space:]]*#/d' -e '/^[[:space:]]*$/d')
if [ -z "$block" ]; then
	echo "quickstart: no quick start block between the markers in README.md" >&2
	exit 1
fi
state=$(mktemp -d /tmp/bulkhead-quickstart.XXXXXX)
chmod 755 "$state"
export BULKHEAD_STATE_DIR="$state"
cleanup() {
	# A sandbox a failed line left behind: remove it through the harness, then the state.
	if [ -x bin/harness ]; then
		for id in $(bin/harness sandbox ls 2>/dev/null | awk 'NR > 1 {print $1}'); do
			bin/harness sandbox rm "$id" >/dev/null 2>&1 || true
		done
	fi
	rm -rf "$state" /tmp/task.md
}
trap cleanup EXIT
isolation=""
command -v bwrap >/dev/null 2>&1 || isolation="--isolation none"
printf '%s\n' "$block" | while IFS= read -r line; do
	case "$line" in
	"bin/harness sandbox create"*) [ -z "$isolation" ] || line="bin/harness $isolation ${line#bin/harness }" ;;
	esac
	echo "quickstart\$ $line"
	if ! sh -c "$line"; then
		echo "quickstart: the README's line failed: $line" >&2
		exit 1
	fi
done

# The service block runs as one script (it starts `harness serve` in the
# background and stops it at its end), on a free port instead of 8080, in
# a directory of its own so that its files (tokens.txt, sandbox.json)
# never touch the clone's or the user's.
serve=$(awk '/<!-- quickstart-serve:begin/ {on=1; next} /<!-- quickstart-serve:end/ {on=0} on' README.md |
	sed -e '/^```/d' -e '/^[[:space:]]*$/d')
if [ -z "$serve" ]; then
	echo "quickstart: no service block between the quickstart-serve markers in README.md" >&2
	exit 1
fi
port=""
for p in $(seq 20000 137 29999); do
	if ! (command -v ss >/dev/null && ss -Hltn "sport = :$p" | grep -q .); then
		port=$p
		break
	fi
done
[ -n "$port" ] || { echo "quickstart: no free port for the service" >&2; exit 1; }
repo=$(pwd)
work="$state/serve-work"
mkdir -p "$work"
serve=$(printf '%s\n' "$serve" | sed -e "s/127\.0\.0\.1:8080/127.0.0.1:$port/g" -e "s#bin/harness#$repo/bin/harness#g" \
	-e "s#^make #make -C $repo #")
[ -z "$isolation" ] || serve=$(printf '%s\n' "$serve" | sed "s#harness serve#harness $isolation serve#")
echo "quickstart: the service block, as one script (port $port):"
printf '%s\n' "$serve" | sed 's/^/quickstart$ /'
if ! (cd "$work" && sh -e -c "trap '[ -z \"\$!\" ] || kill \$! 2>/dev/null; wait' EXIT
$serve"); then
	echo "quickstart: the README's service block failed" >&2
	exit 1
fi
echo "quickstart: every line of the README's quick start worked"
