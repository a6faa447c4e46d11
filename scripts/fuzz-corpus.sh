#!/usr/bin/env bash
# Copies the inputs Go's fuzzing found interesting (kept in the build
# cache, $(go env GOCACHE)/fuzz) into each target's testdata/fuzz/<Target>,
# so that they are committed: every `go test` then replays them as
# regression cases, and every fuzzing run starts from them.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(go env GOCACHE)/fuzz
n=0
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  src="$cache/$pkg"
  [[ -d $src ]] || continue
  for t in "$src"/Fuzz*; do
    [[ -d $t ]] || continue
    target=$(basename "$t")
    grep -q "^func $target(" "$dir"/*_test.go 2>/dev/null || continue # a target since removed
    mkdir -p "$dir/testdata/fuzz/$target"
    for f in "$t"/*; do
      if [[ ! -e "$dir/testdata/fuzz/$target/$(basename "$f")" ]]; then
        cp "$f" "$dir/testdata/fuzz/$target/"
        n=$((n + 1))
      fi
    done
  done
done
echo "fuzz-corpus: $n new inputs copied into testdata/fuzz"
