#!/usr/bin/env bash
# Builds cubicle, copies the binaries to a provisioned host (see
# provision.sh), restarts the daemon and checks /healthz; when the new
# binaries do not come up healthy, the previous ones are put back.
#
# Usage: deploy/deploy.sh [user@]HOST [PORT]
#   HOST  ssh destination (root, or a user with passwordless sudo)
#   PORT  the daemon's API port on the host (default 7171)
# Environment: SSH_OPTS extra ssh options; HEALTH_TRIES (default 30,
# one per second).
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,11p' "$0"; exit 2; }
host=$1
port=${2:-7171}
tries=${HEALTH_TRIES:-30}
read -r -a ssh_opts <<< "${SSH_OPTS:-}"
cd "$(dirname "$0")/.."

log() { echo "deploy: $*"; }
# The remote command line is built here, on purpose (our variables).
# shellcheck disable=SC2029
remote() { ssh "${ssh_opts[@]}" "$host" "$@"; }

log "building"
make build

bins=(cubicled cubicle cubicle-agent)
stage=/tmp/cubicle-deploy.$$
log "copying to $host:$stage"
remote "mkdir -p $stage"
rsync -az -e "ssh ${ssh_opts[*]}" "${bins[@]/#/bin/}" "$host:$stage/"

# Runs on the host: keep the current binaries as *.prev, install the new
# ones, restart, wait for /healthz, roll back on failure. Sandboxes keep
# running across the restart (KillMode=process) and are re-adopted.
log "installing and restarting cubicled on $host"
if remote "sudo bash -s -- $stage $port $tries ${bins[*]}" <<'EOF'
set -euo pipefail
stage=$1 port=$2 tries=$3
shift 3
prefix=/usr/local/bin
for b in "$@"; do
  if [ -x "$prefix/$b" ]; then cp -p "$prefix/$b" "$prefix/$b.prev"; fi
  install -m 0755 "$stage/$b" "$prefix/$b.new"
  mv -f "$prefix/$b.new" "$prefix/$b"
done
rm -rf "$stage"

healthy() {
  for _ in $(seq "$tries"); do
    if curl -fsS --max-time 2 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  return 1
}

systemctl restart cubicled.service
if healthy; then
  echo "deploy: healthy: $("$prefix/cubicled" -version)"
  exit 0
fi
echo "deploy: /healthz failed after $tries tries; rolling back" >&2
journalctl -u cubicled.service -n 30 --no-pager >&2 || true
for b in "$@"; do
  if [ -x "$prefix/$b.prev" ]; then mv -f "$prefix/$b.prev" "$prefix/$b"; fi
done
systemctl restart cubicled.service
if healthy; then
  echo "deploy: rolled back to the previous binaries, which are healthy" >&2
else
  echo "deploy: the previous binaries are not healthy either" >&2
fi
exit 1
EOF
then
  log "done"
else
  log "FAILED on $host (rolled back)"
  exit 1
fi
