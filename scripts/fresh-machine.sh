#!/usr/bin/env bash
# Proves on a brand-new Debian 12 system that scripts/deps.sh installs every
# program cubicle runs: it debootstraps a minimal bookworm into a directory,
# gives it what every machine of the project's kind has before any install
# step (Go, from this host's /usr/local/go), clones this repository's HEAD
# into it, runs scripts/deps.sh there as root, and then the dependency check
# (test/depcheck) inside it. Not part of `make test` (it downloads about
# 1 GB); run it after changing deps.sh. Needs root and debootstrap.
#
#   scripts/fresh-machine.sh [DIR]   (default: a new directory under /var/tmp;
#                                     removed at the end unless KEEP=1)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "fresh-machine: run as root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "fresh-machine: needs debootstrap (scripts/deps.sh installs it)" >&2; exit 1; }
[ -x /usr/local/go/bin/go ] || { echo "fresh-machine: needs Go at /usr/local/go" >&2; exit 1; }

root=${1:-$(mktemp -d /var/tmp/cubicle-fresh.XXXXXX)}
mirror=${MIRROR:-http://deb.debian.org/debian}
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  if [ "${KEEP:-0}" != 1 ]; then rm -rf "$root"; fi
}
trap cleanup EXIT
t0=$(date +%s)
say() { echo "fresh-machine [$(( $(date +%s) - t0 ))s]: $*"; }

say "debootstrap --variant=minbase bookworm $root"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
  { tail -20 "$root.debootstrap.log" >&2; exit 1; }
rm -f "$root.debootstrap.log"
# Debian's security and update suites, as on the machines of the kind.
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
# What the kind has before any install step: Go (MACHINE.md), and the
# certificate authorities of its network (this workplace reaches the
# registries through a TLS proxy: its CA, in /usr/local/share/ca-certificates,
# goes into the system bundle when deps.sh installs ca-certificates) with the
# environment that points programs at that bundle. No service may start
# inside the chroot.
cp -a /usr/local/go "$root/usr/local/go"
mkdir -p "$root/usr/local/share/ca-certificates"
cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
kind_env=()
for v in NODE_EXTRA_CA_CERTS SSL_CERT_FILE SSL_CERT_DIR CURL_CA_BUNDLE GIT_SSL_CAINFO; do
  [ -n "${!v:-}" ] && kind_env+=("$v=${!v}")
done
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 0755 "$root/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$root/etc/resolv.conf"
for m in proc sys dev dev/pts; do
  mkdir -p "$root/$m"
  mount --bind "/$m" "$root/$m"
  mounted+=("$root/$m")
done
git clone -q "$PWD" "$root/src"

say "what the new system lacks before deps.sh"
# shellcheck disable=SC2016 # expanded inside the chroot
chroot "$root" /bin/sh -c 'for p in make git curl nft runsc runc qemu-system-x86_64 debootstrap Xvfb chromium node npm shellcheck xz; do command -v $p >/dev/null || printf " %s" $p; done; echo'

say "scripts/deps.sh"
chroot "$root" /usr/bin/env -i "${kind_env[@]}" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  bash -c 'cd /src && time bash scripts/deps.sh'

say "the dependency check, inside the new system"
chroot "$root" /usr/bin/env -i "${kind_env[@]}" PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  bash -c 'cd /src && go test -count=1 -v -run TestDepsInstallEveryProgram ./test/depcheck/'
say "passed: scripts/deps.sh installs every program cubicle runs on a fresh Debian 12"
