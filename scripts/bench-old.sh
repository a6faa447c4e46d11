#!/usr/bin/env bash
# bench-old.sh builds cubicle as it was before the runsc pin — the last
# commit that ran Debian 12's runsc — and its desktop image, for `make
# bench-runsc`'s old-against-new figures. It prints the directory holding
# bin/ and images/. Built once per commit and cached; only the benchmark
# uses it, never the daemon or the tests.
set -euo pipefail

# The commit just before 9996be9 ("gVisor, current"), which pinned runsc.
OLD_COMMIT=1c1f88f
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${CUBICLE_BENCH_OLD_DIR:-/var/cache/cubicle/bench-old}
dir="$cache/$OLD_COMMIT"
if [[ -x $dir/bin/cubicled && -x $dir/bin/cubicle-agent && -f $dir/images/desktop/.done ]]; then
  echo "$dir"
  exit 0
fi
command -v runsc >/dev/null || { echo "bench-old.sh: Debian's runsc is missing (scripts/deps.sh installs it)" >&2; exit 1; }
mkdir -p "$dir/src"
git -C "$root" archive "$OLD_COMMIT" | tar -x -C "$dir/src"
make -C "$dir/src" build VERSION="$OLD_COMMIT" >&2
rm -rf "${dir:?}/bin"
mv "$dir/src/bin" "$dir/bin"
"$dir/bin/cubicle" image build desktop --image-dir "$dir/images" >&2
touch "$dir/images/desktop/.done"
rm -rf "${dir:?}/src"
echo "$dir"
