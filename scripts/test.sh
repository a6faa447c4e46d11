#!/usr/bin/env bash
# make test: the suite's steps one after another, each timed, stopping at
# the first that fails. Whether the run passed or not it ends by writing
# test-artifacts/summary.md: how long each step took, every test package's
# time and counts, and the slowest tests and subtests (test/testreport, from
# the go test -json streams the unit steps record). The summary is how a
# slow run is explained; CI's log prints it last.
#
# The fuzzing runs beside unit-sandbox, at nice 19: the end-to-end tests
# wait on sandboxes for about a third of their time (a 2-core machine was
# 62 % busy over them), and a niced fuzzer takes only the CPU they leave,
# so its minutes are no longer added to the run's. Each target gets
# FUZZ_BESIDE_TIME (30 s) there, against 10 s alone, for about the same
# share of the machine.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
art=test-artifacts
mkdir -p "$art"
rm -f "$art"/steps.tsv "$art"/go-test-*.json "$art"/summary.md "$art"/fuzz.log
make=${MAKE:-make}

# step NAME [BESIDE]: runs make NAME, timed, into steps.tsv; BESIDE names
# the step it ran beside (its time is then not the run's).
step() {
  local start st ms
  echo "=== make $1${2:+ (beside $2, at nice 19)}"
  start=$(date +%s%N)
  if [ -n "${2:-}" ]; then
    FUZZTIME=${FUZZ_BESIDE_TIME:-30s} nice -n 19 "$make" --no-print-directory "$1"
  else
    "$make" --no-print-directory "$1"
  fi
  st=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '%s\t%d.%03d\t%s\t%s\n' "$1" $((ms / 1000)) $((ms % 1000)) "$st" "${2:-}" >>"$art/steps.tsv"
  return "$st"
}

status=0
for s in deps image lint unit-light; do
  step "$s" || { status=$?; break; }
done
if [ "$status" -eq 0 ]; then
  # In a process group of its own (job control on for the start), so
  # that all of it can be stopped: when unit-sandbox fails, or this
  # script is interrupted.
  set -m
  step fuzz-ci unit-sandbox >"$art/fuzz.log" 2>&1 &
  fuzz=$!
  set +m
  trap 'kill -- -"$fuzz" 2>/dev/null' EXIT
  trap 'exit 130' INT TERM
  step unit-sandbox || status=$?
  if [ "$status" -ne 0 ]; then
    echo "=== unit-sandbox failed: stopping make fuzz-ci"
    kill -- -"$fuzz" 2>/dev/null
  fi
  echo "=== waiting for make fuzz-ci (log: $art/fuzz.log)"
  start=$(date +%s%N)
  wait "$fuzz"
  st=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf 'fuzz-ci, left when unit-sandbox ended\t%d.%03d\t%s\n' $((ms / 1000)) $((ms % 1000)) "$st" >>"$art/steps.tsv"
  trap - EXIT
  cat "$art/fuzz.log"
  [ "$status" -ne 0 ] || status=$st
fi
[ "$status" -eq 0 ] || echo "=== make test failed (exit $status)"

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
