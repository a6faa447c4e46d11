#!/usr/bin/env bash
# Prepares a fresh bare-metal Debian 12+ or Ubuntu 22.04+ x86_64 host for
# cubicle: checks KVM, installs Firecracker and its jailer at a pinned
# version (checksum-verified), the Debian packages, kernel modules and
# sysctls (persisted), the cubicle users and directories, the systemd unit,
# and builds the desktop image. Idempotent: run it again after an upgrade.
#
# Usage (as root, from a checkout with bin/ built by `make build`, or with
# the binaries already in /usr/local/bin):
#   deploy/provision.sh [--no-kvm-ok] [--skip-image]
#   deploy/provision.sh --list
#
# --no-kvm-ok  continue on a host without usable KVM (gvisor/runc only)
# --skip-image do not build the desktop image now
# --list       print what it installs ("deb PACKAGE", "file PATH") and exit;
#              read by the dependency check (test/depcheck)
set -euo pipefail

# Pinned Firecracker release. The SHA-256 is of the release tarball
# firecracker-${FC_VERSION}-x86_64.tgz; it is also checked against the
# .sha256.txt published next to it. To upgrade: change both, run again.
FC_VERSION=v1.10.1
FC_SHA256=36112969952b0e34fadcfca769d48a55dc22cbba99af17e02bd0e24fc35adc77
FC_URL=https://github.com/firecracker-microvm/firecracker/releases/download/${FC_VERSION}/firecracker-${FC_VERSION}-x86_64.tgz
# The oldest release cubicle runs (internal/driver/firecracker MinVersion):
# its guests find their virtio devices through the ACPI tables Firecracker
# added in v1.8.0.
FC_MIN_VERSION=v1.8.0

PREFIX=/usr/local/bin
SRC_DIR=$(cd "$(dirname "$0")/.." && pwd)

# The Debian packages a production host needs. scripts/deps.sh installs the
# same and more for development and tests.
packages=(
  runsc runc                       # gvisor and runc backends
  qemu-system-x86 qemu-utils       # qemu backend
  debootstrap e2fsprogs            # image builds (rootfs, ext4 disks)
  nftables iproute2 kmod           # sandbox networking
  util-linux mount                 # unshare, loop-mounted sandbox disks
  ca-certificates curl rsync acl
)

if [ "${1:-}" = --list ]; then
  printf 'deb %s\n' "${packages[@]}"
  printf 'file %s\n' "$PREFIX/firecracker" "$PREFIX/jailer"
  exit 0
fi

no_kvm_ok=0
skip_image=0
for arg in "$@"; do
  case "$arg" in
    --no-kvm-ok) no_kvm_ok=1 ;;
    --skip-image) skip_image=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "provision: unknown argument $arg" >&2; exit 2 ;;
  esac
done

log() { echo "provision: $*"; }
die() { echo "provision: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root"
[ "$(uname -m)" = x86_64 ] || die "only x86_64 hosts are supported (found $(uname -m))"
# shellcheck source=/dev/null
. /etc/os-release
case "${ID:-}" in
  debian|ubuntu) ;;
  *) die "unsupported distribution ${ID:-unknown}: Debian or Ubuntu expected" ;;
esac

# --- KVM ---------------------------------------------------------------
# /dev/kvm existing is not enough: a paravirtual KVM (kvm_pvm) or a CPU
# without vmx/svm cannot boot a standard guest kernel.
kvm_ok=1
if ! grep -qwE 'vmx|svm' /proc/cpuinfo; then
  log "the CPU shows neither vmx nor svm: no hardware virtualization (enable it in the firmware, or nested virtualization on a cloud VM)"
  kvm_ok=0
fi
if [ -d /sys/module/kvm_pvm ]; then
  log "/dev/kvm is PVM (kvm_pvm): standard guest kernels do not boot on it"
  kvm_ok=0
fi
if [ "$kvm_ok" -eq 1 ]; then
  if grep -qw vmx /proc/cpuinfo; then modprobe kvm_intel; else modprobe kvm_amd; fi
  [ -c /dev/kvm ] || { log "no /dev/kvm after loading the KVM module"; kvm_ok=0; }
fi
if [ "$kvm_ok" -eq 0 ] && [ "$no_kvm_ok" -eq 0 ]; then
  die "no usable KVM: the firecracker and qemu backends need it (pass --no-kvm-ok to provision for gvisor/runc only)"
fi

# --- packages ------------------------------------------------------------
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)   # fetches noVNC for the live view
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- Firecracker and jailer ------------------------------------------------
installed=$("$PREFIX/firecracker" --version 2>/dev/null | head -n1 || true)
if [ "$installed" = "Firecracker ${FC_VERSION}" ] && [ -x "$PREFIX/jailer" ]; then
  log "firecracker ${FC_VERSION} already installed"
else
  log "installing firecracker ${FC_VERSION}"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  tarball="$tmp/firecracker.tgz"
  curl -fsSL --retry 3 -o "$tarball" "$FC_URL"
  curl -fsSL --retry 3 -o "$tmp/published.sha256" "${FC_URL}.sha256.txt"
  echo "${FC_SHA256}  ${tarball}" | sha256sum -c --quiet - ||
    die "checksum mismatch for $FC_URL (expected $FC_SHA256)"
  published=$(awk '{print $1}' "$tmp/published.sha256")
  [ "$published" = "$FC_SHA256" ] || die "the published checksum $published differs from the pinned $FC_SHA256"
  tar -xzf "$tarball" -C "$tmp"
  rel="$tmp/release-${FC_VERSION}-x86_64"
  install -m 0755 "$rel/firecracker-${FC_VERSION}-x86_64" "$PREFIX/firecracker"
  install -m 0755 "$rel/jailer-${FC_VERSION}-x86_64" "$PREFIX/jailer"
  "$PREFIX/firecracker" --version | head -n1
  "$PREFIX/jailer" --version | head -n1
fi

# The daemon refuses an older Firecracker, or a jailer of another release;
# say so here rather than at the first sandbox.
fc_release() { "$1" --version 2>/dev/null | head -n1 | grep -oE 'v[0-9]+\.[0-9]+\.[0-9]+' | head -n1; }
fc_have=$(fc_release "$PREFIX/firecracker" || true)
jailer_have=$(fc_release "$PREFIX/jailer" || true)
[ -n "$fc_have" ] || die "$PREFIX/firecracker --version names no release"
[ "$(printf '%s\n%s\n' "$FC_MIN_VERSION" "$fc_have" | sort -V | head -n1)" = "$FC_MIN_VERSION" ] ||
  die "firecracker $fc_have is older than $FC_MIN_VERSION, the oldest cubicle runs"
[ "$jailer_have" = "$fc_have" ] || die "jailer ${jailer_have:-?} and firecracker $fc_have are from different releases"

# --- kernel modules and sysctls ---------------------------------------------
modules=(tun vhost_vsock br_netfilter overlay)
if [ "$kvm_ok" -eq 1 ]; then
  if grep -qw vmx /proc/cpuinfo; then modules=(kvm kvm_intel "${modules[@]}"); else modules=(kvm kvm_amd "${modules[@]}"); fi
fi
printf '%s\n' "# cubicle: loaded at boot (deploy/provision.sh)" "${modules[@]}" > /etc/modules-load.d/cubicle.conf
for m in "${modules[@]}"; do
  modprobe "$m" || log "warning: modprobe $m failed"
done

cat > /etc/sysctl.d/90-cubicle.conf <<'EOF'
# cubicle (deploy/provision.sh): sandboxes reach the outside through
# cubicle's bridge and NAT. Bridged frames are filtered by cubicle's own
# nftables "bridge" table and isolated bridge ports; they must not also go
# through the IP hooks, where a host firewall's rules would see them.
net.ipv4.ip_forward = 1
net.bridge.bridge-nf-call-iptables = 0
net.bridge.bridge-nf-call-ip6tables = 0
net.bridge.bridge-nf-call-arptables = 0
# Many VMs and containers: inotify and file handles for each.
fs.inotify.max_user_instances = 8192
fs.inotify.max_user_watches = 1048576
EOF
sysctl -q --system

# --- users and directories --------------------------------------------------
# cubicle-vm: the unprivileged user the jailer runs Firecracker as. The
# daemon itself runs as root (it creates namespaces, mounts and cgroups).
if ! id cubicle-vm >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin cubicle-vm
fi
if ! id cubicle >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /var/lib/cubicle --shell /usr/sbin/nologin cubicle
fi
install -d -m 0755 /var/lib/cubicle /var/lib/cubicle/images
install -d -m 0750 -g cubicle /var/cache/cubicle /var/log/cubicle
install -d -m 0711 /srv/cubicle
install -d -m 0750 /etc/cubicle
# KVM for the jailed VMM user (the jailer makes its own /dev/kvm node in
# each jail; this is for tools run by hand).
if [ -c /dev/kvm ]; then
  setfacl -m u:cubicle-vm:rw /dev/kvm || log "warning: setfacl on /dev/kvm failed"
fi

# --- noVNC for the live-view page (pinned by web/package-lock.json) -------------
NOVNC_DIR=/usr/local/share/cubicle/novnc
npm ci --prefix "$SRC_DIR/web" --no-audit --no-fund --loglevel=error >/dev/null
rm -rf "$NOVNC_DIR.new"
install -d -m 0755 "$(dirname "$NOVNC_DIR")"
cp -r "$SRC_DIR/web/node_modules/@novnc/novnc" "$NOVNC_DIR.new"
rm -rf "$NOVNC_DIR"
mv "$NOVNC_DIR.new" "$NOVNC_DIR"
log "noVNC $(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$NOVNC_DIR/package.json" | head -n1) in $NOVNC_DIR"

# --- binaries and the unit ----------------------------------------------------
for b in cubicled cubicle cubicle-agent; do
  if [ -x "$SRC_DIR/bin/$b" ]; then
    install -m 0755 "$SRC_DIR/bin/$b" "$PREFIX/$b"
  elif [ ! -x "$PREFIX/$b" ]; then
    die "$b: neither $SRC_DIR/bin/$b (run make build) nor $PREFIX/$b exists"
  fi
done
if [ ! -f /etc/cubicle/cubicled.env ]; then
  install -m 0640 "$SRC_DIR/deploy/cubicled.env.example" /etc/cubicle/cubicled.env
  key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  sed -i "s/^CUBICLE_API_KEYS=.*/CUBICLE_API_KEYS=$key/" /etc/cubicle/cubicled.env
  log "wrote /etc/cubicle/cubicled.env with a new API key"
fi
install -m 0644 "$SRC_DIR/deploy/cubicled.service" /etc/systemd/system/cubicled.service
systemctl daemon-reload
systemctl enable cubicled.service >/dev/null

# --- image ------------------------------------------------------------------
if [ "$skip_image" -eq 0 ]; then
  log "building the desktop image (cached by recipe hash)"
  "$PREFIX/cubicle" image build desktop --image-dir /var/lib/cubicle/images
fi

systemctl restart cubicled.service
log "done: cubicled is $(systemctl is-active cubicled.service); backends: curl -s -H \"X-API-Key: \$KEY\" http://127.0.0.1:7171/v1/info"
