#!/usr/bin/env bash
# Prepares a fresh bare-metal Debian 12+ or Ubuntu 22.04+ x86_64 host for
# cubicle: checks KVM, installs Firecracker and its jailer at a pinned
# version (checksum-verified), the pinned runsc (scripts/runsc.sh), the
# Debian packages, kernel modules and
# sysctls (persisted), the cubicle users and directories, the systemd unit,
# and builds the desktop image. Idempotent: run it again after an upgrade.
# With the cluster options it also makes the host a node of a cluster
# (README "A cluster: several hosts behind one API"), and with --etcd-init
# a member of the cluster's etcd.
#
# Usage (as root, from a checkout with bin/ built by `make build`, or with
# the binaries already in /usr/local/bin):
#   deploy/provision.sh [--no-kvm-ok] [--skip-image] [cluster options] [etcd options]
#   deploy/provision.sh --etcd-init --etcd-only [etcd options]
#   deploy/provision.sh --list
#
# --no-kvm-ok  continue on a host without usable KVM (gvisor/runc only)
# --skip-image do not build the desktop image now
# --list       print what it installs ("deb PACKAGE", "file PATH") and exit;
#              read by the dependency check (test/depcheck)
#
# Cluster options, written to /etc/cubicle/cubicled.env (run again without
# them and the file keeps what it has):
# --etcd URLS          etcd's client URLs, comma-separated, e.g.
#                      http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379
#                      (CUBICLE_CLUSTER_ETCD); turns cluster mode on
# --node-name NAME     this node's name, unique in the cluster; default: the
#                      host name (CUBICLE_NODE_NAME)
# --advertise-url URL  http(s)://host:port the other nodes reach this node's
#                      API at; needed when --listen names no one address
#                      (CUBICLE_ADVERTISE_URL)
# --listen ADDR        the API's address, e.g. 10.0.0.2:7171 (CUBICLE_LISTEN);
#                      a cluster node must not listen on loopback only
# --join URL           the API URL of a node already in the cluster: before
#                      changing anything, check that it answers /healthz and,
#                      with this node's API key, a /v1/info in cluster mode,
#                      and that no other node has this name; at the end, that
#                      it lists this node. Needs --etcd: a node does not tell
#                      its etcd endpoints.
# CUBICLE_API_KEYS in the environment is written to the env file: every node
# of a cluster needs the same keys. Without it, a new env file gets a new key.
#
# etcd options (Debian's etcd-server and etcd-client, configured in
# /etc/default/etcd, data in /var/lib/etcd/cubicle; plain HTTP, no TLS):
# --etcd-init          install and configure this host's etcd member
# --etcd-cluster LIST  every member as NAME=PEER_URL, comma-separated, e.g.
#                      e1=http://10.0.0.1:2380,e2=http://10.0.0.2:2380,e3=http://10.0.0.3:2380;
#                      clients reach each member on port 2379 of its peer host
# --etcd-name NAME     this member's name in that list; default: the host name
# --etcd-state STATE   new (default: the members bootstrap together) or
#                      existing (join a running etcd: the member is added
#                      through --etcd first)
# --etcd-token TOKEN   the initial cluster token (default cubicle)
# --etcd-only          configure the etcd member only: nothing of cubicled
#                      (a host that runs etcd and no sandboxes)
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
ENV_FILE=/etc/cubicle/cubicled.env
SRC_DIR=$(cd "$(dirname "$0")/.." && pwd)

# The Debian packages a production host needs. scripts/deps.sh installs the
# same and more for development and tests.
packages=(
  runc                             # runc backend (gvisor's runsc: scripts/runsc.sh, below)
  qemu-system-x86 qemu-utils       # qemu backend
  debootstrap e2fsprogs            # image builds (rootfs, ext4 disks)
  nftables iproute2 kmod           # sandbox networking
  util-linux mount                 # unshare, loop-mounted sandbox disks
  ca-certificates curl rsync acl
)

# The cluster's store, installed with --etcd-init only: Debian's etcd 3.4
# server, and etcdctl to add a member to a running etcd.
etcd_packages=(etcd-server etcd-client)
ETCD_DATA_DIR=/var/lib/etcd/cubicle
ETCD_CLIENT_PORT=2379

if [ "${1:-}" = --list ]; then
  printf 'deb %s\n' "${packages[@]}" "${etcd_packages[@]}"
  printf 'file %s\n' "$PREFIX/firecracker" "$PREFIX/jailer" /usr/local/libexec/cubicle/runsc
  exit 0
fi

no_kvm_ok=0
skip_image=0
etcd="" node_name="" advertise="" listen="" join=""
etcd_init=0 etcd_only=0 etcd_cluster="" etcd_name="" etcd_state=new etcd_token=cubicle
usage() { sed -n '2,/^set -euo pipefail$/{/^#/p}' "$0"; }
# need OPTION VALUE: an option's value must be there.
need() { [ -n "${2:-}" ] || { echo "provision: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  opt=$1
  shift
  case "$opt" in
    --*=*) set -- "${opt#*=}" "$@"; opt=${opt%%=*} ;;
  esac
  case "$opt" in
    --no-kvm-ok) no_kvm_ok=1 ;;
    --skip-image) skip_image=1 ;;
    --etcd) need "$opt" "${1:-}"; etcd=$1; shift ;;
    --node-name) need "$opt" "${1:-}"; node_name=$1; shift ;;
    --advertise-url) need "$opt" "${1:-}"; advertise=${1%/}; shift ;;
    --listen) need "$opt" "${1:-}"; listen=$1; shift ;;
    --join) need "$opt" "${1:-}"; join=${1%/}; shift ;;
    --etcd-init) etcd_init=1 ;;
    --etcd-only) etcd_only=1 ;;
    --etcd-cluster) need "$opt" "${1:-}"; etcd_cluster=$1; shift ;;
    --etcd-name) need "$opt" "${1:-}"; etcd_name=$1; shift ;;
    --etcd-state) need "$opt" "${1:-}"; etcd_state=$1; shift ;;
    --etcd-token) need "$opt" "${1:-}"; etcd_token=$1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "provision: unknown argument $opt" >&2; exit 2 ;;
  esac
done

log() { echo "provision: $*"; }
die() { echo "provision: $*" >&2; exit 1; }
usage_error() { echo "provision: $*" >&2; exit 2; }

# --- the options, checked before anything changes ---------------------------
url_re='^https?://[^/,[:space:]]+$'
name_re='^[A-Za-z0-9][A-Za-z0-9._-]*$'
if [ -n "$etcd" ]; then
  IFS=, read -r -a etcd_urls <<< "$etcd"
  for u in "${etcd_urls[@]}"; do
    [[ $u =~ $url_re ]] || usage_error "--etcd: want comma-separated http://host:port client URLs, not \"$u\""
  done
fi
[ -n "$etcd" ] || [ -z "$node_name$advertise$join" ] ||
  usage_error "--node-name, --advertise-url and --join are cluster mode's: they need --etcd (the cluster's etcd client URLs)"
[ -z "$node_name" ] || [[ $node_name =~ $name_re ]] ||
  usage_error "--node-name: letters, digits, '.', '_' and '-' only, not \"$node_name\""
[ -z "$advertise" ] || [[ $advertise =~ $url_re ]] ||
  usage_error "--advertise-url: want http(s)://host:port, not \"$advertise\""
[ -z "$join" ] || [[ $join =~ $url_re ]] ||
  usage_error "--join: want the http(s)://host:port of a node's API, not \"$join\""
[ -z "$listen" ] || [[ $listen =~ ^[^/[:space:]]*:[0-9]+$ ]] ||
  usage_error "--listen: want HOST:PORT, not \"$listen\""
[[ ${CUBICLE_API_KEYS:-} != *[[:space:]]* ]] ||
  usage_error "CUBICLE_API_KEYS: comma-separated keys without spaces or newlines"
if [ "$etcd_only" -eq 1 ]; then
  [ "$etcd_init" -eq 1 ] || usage_error "--etcd-only goes with --etcd-init"
  [ -z "$node_name$advertise$listen$join" ] ||
    usage_error "--etcd-only configures etcd only: --node-name, --advertise-url, --listen and --join are cubicled's"
fi
if [ "$etcd_init" -eq 1 ]; then
  [ -n "$etcd_cluster" ] || usage_error "--etcd-init needs --etcd-cluster NAME=PEER_URL,..."
  etcd_name=${etcd_name:-$(uname -n)}
  case "$etcd_state" in
    new) ;;
    existing) [ -n "$etcd" ] || usage_error "--etcd-state existing needs --etcd: the running etcd to add this member to" ;;
    *) usage_error "--etcd-state: want new or existing, not \"$etcd_state\"" ;;
  esac
  [[ $etcd_token =~ $name_re ]] || usage_error "--etcd-token: letters, digits, '.', '_' and '-' only"
  etcd_peer=""
  IFS=, read -r -a etcd_members <<< "$etcd_cluster"
  for m in "${etcd_members[@]}"; do
    # Peers talk plain HTTP: the script sets up no certificates for etcd.
    [[ $m =~ ^[A-Za-z0-9][A-Za-z0-9._-]*=http://[^/,:[:space:]]+:[0-9]+$ || $m =~ ^[A-Za-z0-9][A-Za-z0-9._-]*=http://\[[0-9A-Fa-f:.]+\]:[0-9]+$ ]] ||
      usage_error "--etcd-cluster: want NAME=http://host:port members, comma-separated, not \"$m\""
    [ "${m%%=*}" != "$etcd_name" ] || etcd_peer=${m#*=}
  done
  [ -n "$etcd_peer" ] || usage_error "--etcd-cluster names no member $etcd_name (this host's; pick another with --etcd-name)"
elif [ -n "$etcd_cluster$etcd_name" ] || [ "$etcd_state" != new ] || [ "$etcd_token" != cubicle ]; then
  usage_error "the --etcd-* options go with --etcd-init"
fi

[ "$(id -u)" -eq 0 ] || die "run as root"
[ "$(uname -m)" = x86_64 ] || die "only x86_64 hosts are supported (found $(uname -m))"
# shellcheck source=/dev/null
. /etc/os-release
case "${ID:-}" in
  debian|ubuntu) ;;
  *) die "unsupported distribution ${ID:-unknown}: Debian or Ubuntu expected" ;;
esac

# install_packages PACKAGE...: apt-get install those not installed yet.
install_packages() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# env_get KEY: KEY's value in the env file, or in the example a new env
# file starts from.
env_get() {
  local f=$ENV_FILE
  [ -f "$f" ] || f=$SRC_DIR/deploy/cubicled.env.example
  [ -f "$f" ] || return 0
  sed -n "s/^$1=//p" "$f" | tail -n1
}

# set_env KEY VALUE: KEY=VALUE in the env file, on KEY's line (or, when it
# has none, on the example's commented-out #KEY= line), else appended.
set_env() {
  local out
  out=$(mktemp "$ENV_FILE.XXXXXX")
  KEY=$1 VALUE=$2 awk '
    BEGIN { k = ENVIRON["KEY"]; line = k "=" ENVIRON["VALUE"] }
    NR == FNR { if (index($0, k "=") == 1) set = 1; next }
    !done && (index($0, k "=") == 1 || (!set && index($0, "#" k "=") == 1)) { print line; done = 1; next }
    index($0, k "=") == 1 { next }
    { print }
    END { if (!done) print line }
  ' "$ENV_FILE" "$ENV_FILE" > "$out"
  chown --reference="$ENV_FILE" "$out"
  chmod --reference="$ENV_FILE" "$out"
  mv "$out" "$ENV_FILE"
  if [ "$1" = CUBICLE_API_KEYS ]; then
    log "set CUBICLE_API_KEYS in $ENV_FILE (from the environment)"
  else
    log "set $1=$2 in $ENV_FILE"
  fi
}

# api_get URL: GET URL with this node's API key (kept off the command
# line); prints the body and, on a line of its own, the HTTP status.
api_get() {
  printf 'header = "X-API-Key: %s"\n' "$api_key" |
    curl -sS --max-time 5 -K - -w '\n%{http_code}' "$1"
}

# wait_for SECONDS COMMAND...: run COMMAND once a second until it succeeds.
wait_for() {
  local n=$1
  shift
  until "$@"; do
    n=$((n - 1))
    [ "$n" -gt 0 ] || return 1
    sleep 1
  done
}

# --- cluster node: checked before anything changes -----------------------------
if [ -n "$etcd" ]; then
  listen_now=${listen:-$(env_get CUBICLE_LISTEN)}
  listen_now=${listen_now:-127.0.0.1:7171}
  lhost=${listen_now%:*}
  lhost=${lhost#[}
  lhost=${lhost%]}
  self_url=${advertise:-$(env_get CUBICLE_ADVERTISE_URL)}
  case "$lhost" in
    127.*|localhost|::1)
      die "cubicled would listen on $listen_now, loopback only, where the other nodes cannot reach it: pass --listen HOST:PORT (an address they reach, or 0.0.0.0:PORT with --advertise-url)" ;;
    ""|0.0.0.0|::)
      [ -n "$self_url" ] ||
        die "cubicled would listen on every address ($listen_now): pass --advertise-url http://HOST:PORT, the address the other nodes reach it at" ;;
  esac
  self_url=${self_url:-http://$listen_now}
  self_name=${node_name:-$(env_get CUBICLE_NODE_NAME)}
  self_name=${self_name:-$(uname -n)}
  api_keys=${CUBICLE_API_KEYS:-$(env_get CUBICLE_API_KEYS)}
  api_key=${api_keys%%,*}
fi
if [ -n "$join" ]; then
  [ -n "$api_key" ] ||
    die "--join: this node needs the cluster's API keys; run again with CUBICLE_API_KEYS set to those of the other nodes (CUBICLE_API_KEYS in their $ENV_FILE)"
  health=$(curl -sS --max-time 5 "$join/healthz") || die "--join: $join/healthz does not answer"
  case "$health" in
    *'"status":"ok"'*) ;;
    *'"status":"degraded"'*) log "warning: $join says it is degraded: $health" ;;
    *) die "--join: $join/healthz answered \"$health\", not cubicled's status" ;;
  esac
  resp=$(api_get "$join/v1/info") || true
  code=${resp##*$'\n'}
  body=${resp%$'\n'*}
  case "$code" in
    200) ;;
    401) die "--join: $join refuses this node's API key: every node of a cluster needs the same CUBICLE_API_KEYS" ;;
    *) die "--join: GET $join/v1/info answered ${code:-nothing}: $body" ;;
  esac
  [[ $body == *'"cluster":{'* ]] ||
    die "--join: $join is not in cluster mode (its /v1/info has no \"cluster\"): give it CUBICLE_CLUSTER_ETCD first"
  other=$(sed -n 's/.*"name":"'"$self_name"'","url":"\([^"]*\)".*/\1/p' <<< "$body")
  [ -z "$other" ] || [ "$other" = "$self_url" ] ||
    die "--join: the cluster has a node named $self_name at $other already (this one would be at $self_url): choose another --node-name"
  log "joining the cluster of $join, $(grep -o '"name":"[^"]*","url":' <<< "$body" | wc -l) node(s) now, as $self_name at $self_url"
fi

# --- etcd member (--etcd-init) ------------------------------------------------
# Debian's etcd-server runs /usr/bin/etcd as the etcd user under systemd,
# with /etc/default/etcd as its environment. The package starts a
# one-member etcd of its own on install (data in /var/lib/etcd/default);
# this member keeps its data in a directory of its own, so that the
# ETCD_INITIAL_* settings, which count only while that directory is empty,
# bootstrap the cluster given here.
if [ "$etcd_init" -eq 1 ]; then
  install_packages "${etcd_packages[@]}"
  export ETCDCTL_API=3
  etcd_hostport=${etcd_peer#http://}
  etcd_host=${etcd_hostport%:*}
  etcd_client=http://$etcd_host:$ETCD_CLIENT_PORT
  if [[ $etcd_host =~ ^[0-9]+(\.[0-9]+){3}$ || $etcd_host == \[*\] ]]; then
    etcd_listen_peer=$etcd_peer
    etcd_listen_client=$etcd_client
    # cubicled on this host may use the loopback address too.
    [ "$etcd_host" = 127.0.0.1 ] || etcd_listen_client+=,http://127.0.0.1:$ETCD_CLIENT_PORT
  else
    # etcd binds addresses, not names.
    etcd_listen_peer=http://0.0.0.0:${etcd_hostport##*:}
    etcd_listen_client=http://0.0.0.0:$ETCD_CLIENT_PORT
    log "$etcd_host is a name and etcd binds addresses: the member listens on every address"
  fi
  if [ "$etcd_state" = existing ]; then
    # A member joins a running etcd once the others know it.
    members=$(etcdctl --endpoints="$etcd" --command-timeout=5s member list) ||
      die "the etcd at $etcd does not answer: cannot add the member $etcd_name to it"
    if grep -qF ", $etcd_peer," <<< "$members"; then
      log "etcd member $etcd_name ($etcd_peer) is in the cluster already"
    else
      log "adding the etcd member $etcd_name ($etcd_peer) to the etcd at $etcd"
      etcdctl --endpoints="$etcd" --command-timeout=5s member add "$etcd_name" --peer-urls="$etcd_peer" >/dev/null
    fi
  fi
  etcd_conf=$(cat <<EOF
# /etc/default/etcd: written by cubicle's deploy/provision.sh --etcd-init (run
# it again to change it); Debian's etcd.service reads it. The ETCD_INITIAL_*
# settings count only at the first start, while ETCD_DATA_DIR is empty.
ETCD_NAME=$etcd_name
ETCD_DATA_DIR=$ETCD_DATA_DIR
ETCD_LISTEN_PEER_URLS=$etcd_listen_peer
ETCD_INITIAL_ADVERTISE_PEER_URLS=$etcd_peer
ETCD_LISTEN_CLIENT_URLS=$etcd_listen_client
ETCD_ADVERTISE_CLIENT_URLS=$etcd_client
ETCD_INITIAL_CLUSTER=$etcd_cluster
ETCD_INITIAL_CLUSTER_STATE=$etcd_state
ETCD_INITIAL_CLUSTER_TOKEN=$etcd_token
EOF
)
  install -d -m 0700 -o etcd -g etcd "$ETCD_DATA_DIR"
  etcd_changed=0
  if [ "$(cat /etc/default/etcd 2>/dev/null)" != "$etcd_conf" ]; then
    printf '%s\n' "$etcd_conf" > /etc/default/etcd
    etcd_changed=1
    log "wrote /etc/default/etcd: member $etcd_name of $etcd_cluster"
  fi
  systemctl enable etcd.service >/dev/null 2>&1
  if [ "$etcd_changed" -eq 1 ] || ! systemctl is-active --quiet etcd.service; then
    # --no-block: a member of a new cluster tells systemd it is ready only
    # once a majority of the members runs, which may be later.
    systemctl restart --no-block etcd.service
  fi
  etcd_healthy() { etcdctl --endpoints="http://127.0.0.1:$ETCD_CLIENT_PORT" --command-timeout=2s endpoint health >/dev/null 2>&1; }
  if wait_for 15 etcd_healthy; then
    log "etcd member $etcd_name is healthy (clients: $etcd_client)"
  else
    if [ "$etcd_state" = new ]; then
      log "etcd member $etcd_name is not serving yet: it serves once a majority of the ${#etcd_members[@]} members runs; provision the others, then: etcdctl --endpoints=$etcd_client endpoint health --cluster"
    else
      log "warning: etcd member $etcd_name is not serving after 15 s; see journalctl -u etcd"
    fi
  fi
  if [ "$etcd_only" -eq 1 ]; then
    log "done: etcd member $etcd_name is $(systemctl is-active etcd.service || true); nothing of cubicled was changed (--etcd-only)"
    exit 0
  fi
fi

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
install_packages "${packages[@]}"

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

# --- runsc, the gvisor backend ------------------------------------------------
# The very build the tests ran: gvisor.dev/gvisor at the version
# deploy/runsc/go.mod pins, its sources checked against go.sum, built with
# the Go that built bin/ (scripts/runsc.sh says why not gVisor's release
# download). Once per version, about 4 minutes on 2 cores.
command -v go >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null 2>&1 || die "the pinned runsc is built with Go, as bin/ is: no go on PATH or in /usr/local/go/bin"
"$SRC_DIR/scripts/runsc.sh"

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
if [ ! -f "$ENV_FILE" ]; then
  install -m 0640 "$SRC_DIR/deploy/cubicled.env.example" "$ENV_FILE"
  if [ -z "${CUBICLE_API_KEYS:-}" ]; then
    key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
    sed -i "s/^CUBICLE_API_KEYS=.*/CUBICLE_API_KEYS=$key/" "$ENV_FILE"
    log "wrote $ENV_FILE with a new API key"
    [ -z "$etcd" ] || log "every node of the cluster needs the same keys: run provision.sh on the others with CUBICLE_API_KEYS from $ENV_FILE"
  else
    log "wrote $ENV_FILE"
  fi
fi
# What this run was given: the API keys of the environment, the cluster's
# settings.
[ -z "${CUBICLE_API_KEYS:-}" ] || set_env CUBICLE_API_KEYS "$CUBICLE_API_KEYS"
[ -z "$listen" ] || set_env CUBICLE_LISTEN "$listen"
[ -z "$etcd" ] || set_env CUBICLE_CLUSTER_ETCD "$etcd"
[ -z "$node_name" ] || set_env CUBICLE_NODE_NAME "$node_name"
[ -z "$advertise" ] || set_env CUBICLE_ADVERTISE_URL "$advertise"
install -m 0644 "$SRC_DIR/deploy/cubicled.service" /etc/systemd/system/cubicled.service
systemctl daemon-reload
systemctl enable cubicled.service >/dev/null

# --- image ------------------------------------------------------------------
if [ "$skip_image" -eq 0 ]; then
  log "building the desktop image (cached by recipe hash)"
  "$PREFIX/cubicle" image build desktop --image-dir /var/lib/cubicle/images
fi

systemctl restart cubicled.service

# --- cluster: this node registered, and seen by the node it joined --------------
if [ -n "$etcd" ]; then
  # /healthz says ok, not degraded, once the node is registered in etcd and
  # has loaded the cluster's state.
  node_ok() { local h; h=$(curl -sS --max-time 3 "$self_url/healthz" 2>/dev/null) && [[ $h == *'"status":"ok"'* ]]; }
  if wait_for 60 node_ok; then
    log "cubicled is node $self_name of the cluster, at $self_url"
  else
    log "warning: after 60 s cubicled is not a working node of the cluster yet ($self_url/healthz: $(curl -sS --max-time 3 "$self_url/healthz" 2>&1 || true)); see journalctl -u cubicled, and whether a majority of etcd ($etcd) runs"
  fi
  if [ -n "$join" ]; then
    listed() { local r; r=$(api_get "$join/v1/info" 2>/dev/null) && [[ $r == *"\"name\":\"$self_name\",\"url\":"* ]]; }
    wait_for 15 listed || die "$join does not list this node ($self_name) among the cluster's nodes; see journalctl -u cubicled"
    log "$join lists this node: joined"
  fi
fi
log "done: cubicled is $(systemctl is-active cubicled.service); backends: curl -s -H \"X-API-Key: \$KEY\" ${self_url:-http://127.0.0.1:7171}/v1/info"
