#!/usr/bin/env bash
# Runs every fuzz target of the module for a short budget each (default 10s).
set -euo pipefail
budget=${1:-10s}
cd "$(dirname "$0")/.."
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  # shellcheck disable=SC2013 # one Go identifier per match: words are lines
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    echo "fuzz $pkg $target ($budget)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$budget" "$pkg" >/tmp/cubicle-fuzz.log 2>&1 || { cat /tmp/cubicle-fuzz.log; exit 1; }
  done
done
echo "fuzz: all targets passed"
