#!/bin/sh
# Tests for credit_note_total. Run from the repository root.
. "$(dirname "$0")/../lib/credit_note.sh"

fail=0
check() {
	got=$(credit_note_total "$1" "$2")
	if [ "$got" = "$3" ]; then
		echo "ok   credit_note_total $1 $2 = $got"
	else
		echo "FAIL credit_note_total $1 $2 = $got, want $3"
		fail=1
	fi
}

check 10000 2500 7500
check 5000 5000 0
check 3000 4500 0

if [ "$fail" -ne 0 ]; then
	echo "tests failed"
	exit 1
fi
echo "all tests passed"
