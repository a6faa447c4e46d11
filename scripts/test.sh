#!/usr/bin/env bash
# make test: the suite's steps one after another, each timed, stopping at
# the first that fails. Whether the run passed or not it ends by writing
# test-artifacts/summary.md: how long each step took, every test package's
# time and counts, and the slowest tests and subtests (test/testreport, from
# the go test -json streams the unit steps record). The summary is how a
# slow run is explained; CI's log prints it last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
art=test-artifacts
mkdir -p "$art"
rm -f "$art"/steps.tsv "$art"/go-test-*.json "$art"/summary.md
make=${MAKE:-make}

status=0
for step in deps image lint unit-light unit-sandbox fuzz-ci; do
  echo "=== make $step"
  start=$(date +%s%N)
  "$make" --no-print-directory "$step"
  st=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '%s\t%d.%03d\t%s\n' "$step" $((ms / 1000)) $((ms % 1000)) "$st" >>"$art/steps.tsv"
  if [ "$st" -ne 0 ]; then
    echo "=== make $step failed (exit $st)"
    status=$st
    break
  fi
done

echo "=== summary (test-artifacts/summary.md)"
report=bin/testreport
[ -x "$report" ] || report="go run ./test/testreport"
shopt -s nullglob
# shellcheck disable=SC2086 # $report is a command and its arguments
if ! $report summary -steps "$art/steps.tsv" -out "$art/summary.md" "$art"/go-test-*.json; then
  echo "=== the summary could not be written"
  [ "$status" -ne 0 ] || status=1
fi
exit "$status"
