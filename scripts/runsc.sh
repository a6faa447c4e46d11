#!/usr/bin/env bash
# Builds and installs the runsc (gVisor) that cubicle runs, at the version
# deploy/runsc/go.mod pins, idempotently: when the installed binary already
# says that version, nothing is built. scripts/deps.sh and
# deploy/provision.sh both run it, so a test machine and a production host
# run the same runsc.
#
#   scripts/runsc.sh           build and install it when missing (as root)
#   scripts/runsc.sh --path    print the path cubicled finds it at
#   scripts/runsc.sh --version print the pinned version
#
# Why a build and not gVisor's release download: the module's sources are
# what the tests ran, go.sum pins their hashes (checked against the Go
# checksum database on a first download), and the machines this project is
# built on reach the Go module proxy but not gVisor's release bucket. The
# build takes about 4 minutes on 2 cores, once per version (Go's build
# cache makes a rebuild of the same version a minute).
#
# The binary goes to /usr/local/libexec/cubicle/runsc-VERSION, and
# /usr/local/libexec/cubicle/runsc points at it: cubicled's --runsc default
# (internal/driver/oci.DefaultRunscPath), so no PATH order decides which
# runsc runs. Debian's runsc package (/usr/bin/runsc, 20221219) stays for
# the old-against-new benchmark only; cubicled refuses it.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
mod="$here/deploy/runsc"
dir=/usr/local/libexec/cubicle
link="$dir/runsc"

version=$(cd "$mod" && go list -m -f '{{.Version}}' gvisor.dev/gvisor)
bin="$dir/runsc-$version"

case "${1:-}" in
--path) echo "$link"; exit 0 ;;
--version) echo "$version"; exit 0 ;;
"") ;;
*) echo "usage: $0 [--path|--version]" >&2; exit 2 ;;
esac

log() { echo "runsc: $*"; }

# says_version FILE: FILE runs and names the pinned version. Its output is
# read whole first: in a pipe to head (under pipefail), runsc writing its
# second line after head had exited died of SIGPIPE, and a good build
# failed the check now and then.
says_version() {
  local out
  [ -x "$1" ] || return 1
  out=$("$1" --version 2>/dev/null) || return 1
  [ "${out%%$'\n'*}" = "runsc version $version" ]
}

if ! says_version "$bin"; then
  [ "$(id -u)" -eq 0 ] || { echo "runsc: $bin missing; run as root to build it" >&2; exit 1; }
  log "building gvisor.dev/gvisor/runsc $version (once per version; ~4 min on 2 cores)"
  mkdir -p "$dir"
  tmp="$bin.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
    -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$version" \
    -o "$tmp" gvisor.dev/gvisor/runsc)
  says_version "$tmp" || { echo "runsc: the build does not run: $("$tmp" --version 2>&1 | head -n 1)" >&2; exit 1; }
  mv "$tmp" "$bin"
  trap - EXIT
fi
if [ "$(readlink "$link" 2>/dev/null)" != "$bin" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "runsc: $link does not point at $bin; run as root" >&2; exit 1; }
  # A new link beside the old, renamed over it: a cubicled starting
  # meanwhile finds one runsc or the other, never none.
  ln -sfn "$bin" "$link.new.$$"
  mv -T "$link.new.$$" "$link"
  log "$link -> $bin"
fi
