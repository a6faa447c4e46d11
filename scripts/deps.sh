#!/usr/bin/env bash
# Installs the Debian packages cubicle needs on the host, idempotently: apt is
# touched only when something is missing. Run as root.
set -euo pipefail

packages=(
  runsc runc            # the gvisor and runc backends
  qemu-system-x86 qemu-utils  # the qemu backend (qemu-img makes the per-VM overlays)
  debootstrap           # building the desktop image
  xvfb xdotool x11-utils openbox  # the agent's X11 integration tests
  e2fsprogs iproute2 ca-certificates curl
  chromium              # the live-view browser test (chromedp drives it headless)
)
# npm fetches noVNC for the live-view page; NodeSource's nodejs ships npm
# itself, Debian's needs the separate package.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# noVNC for the live-view page, pinned by web/package-lock.json; installed
# again only when the lockfile changed.
web="$(dirname "$0")/../web"
stamp="$web/node_modules/.package-lock.json"
if [ ! -f "$stamp" ] || [ "$web/package-lock.json" -nt "$stamp" ]; then
  echo "deps: npm ci (noVNC)"
  npm ci --prefix "$web" --no-audit --no-fund --loglevel=error >/dev/null
fi

# The E2B SDK test (test/e2b-js) needs Node >= 20.18.1; Debian 12's own
# nodejs is 18. Say so here rather than let the test fail obscurely.
if ! node -e 'const [a,b,c]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&(b>18||(b===18&&c>=1)))?0:1)' 2>/dev/null; then
  echo "deps: warning: node $(node --version 2>/dev/null || echo missing) is older than 20.18.1, which the E2B SDK test needs (install Node 20 or 22, e.g. from NodeSource)" >&2
fi
