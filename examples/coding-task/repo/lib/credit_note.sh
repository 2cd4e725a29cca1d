#!/bin/sh
# credit_note_total INVOICE_CENTS CREDIT_CENTS prints the amount still owed
# after a credit note, in cents, never below zero.
credit_note_total() {
	invoice=$1
	credit=$2
	total=$((invoice + credit))
	if [ "$total" -lt 0 ]; then
		total=0
	fi
	echo "$total"
}
