#!/usr/bin/env bash
# Starts cubicled (if it is not already answering) and shows it working: a
# desktop sandbox is created, a page opened in its Chromium, clicked and typed
# into, and a screenshot saved. cubicled keeps running in the foreground.
set -euo pipefail
cd "$(dirname "$0")/.."

export CUBICLE_URL=${CUBICLE_URL:-http://127.0.0.1:7171}
cli=./bin/cubicle
daemon_pid=""

if ! curl -fsS "$CUBICLE_URL/healthz" >/dev/null 2>&1; then
  mkdir -p /var/log/cubicle
  echo "== starting cubicled (log: /var/log/cubicle/cubicled.log)"
  ./bin/cubicled --listen "${CUBICLE_URL#http://}" --novnc-dir "$PWD/web/node_modules/@novnc/novnc" \
    >>/var/log/cubicle/cubicled.log 2>&1 &
  daemon_pid=$!
  for _ in $(seq 100); do
    curl -fsS "$CUBICLE_URL/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
fi
$cli info

echo "== creating a desktop sandbox"
start=$(date +%s%N)
id=$($cli create --json | sed -n 's/.*"id": *"\([a-z0-9]*\)".*/\1/p' | head -1)
echo "sandbox $id ready in $(( ($(date +%s%N) - start) / 1000000 )) ms"

echo "== waiting for Chromium's window"
for _ in $(seq 150); do
  $cli windows "$id" | grep -qi chromium && break
  sleep 0.2
done
$cli windows "$id"

echo "== opening a page in its Chromium, clicking and typing"
$cli cp scripts/demo/page.html "$id:/tmp/demo.html"
$cli key "$id" ctrl+l
$cli type "$id" "file:///tmp/demo.html"
$cli key "$id" Return
for _ in $(seq 75); do
  $cli windows "$id" | grep -q "cubicle demo" && break
  sleep 0.2
done
sleep 1 # the title comes with the page's head; let the rest load
$cli click "$id" 512 300
# The first click on the window makes XFCE's window manager activate it;
# keys sent while Chromium takes the focus back are lost. An agent looks
# at the screen between the two; the demo waits as long.
sleep 0.5
$cli type "$id" "hello from cubicle ✓"
sleep 0.5
# shellcheck disable=SC2016 # expanded inside the sandbox, not here
$cli exec "$id" -- sh -c 'echo "uname: $(uname -sr)"; echo "DISPLAY=$DISPLAY"'
$cli screenshot "$id" -o demo.png
echo
echo "Screenshot saved to $(pwd)/demo.png (the page turned green and shows your text)."
echo "Watch and control it live in a browser (link valid 1 h):"
echo "  $($cli view "$id" --interactive --ttl 1h)"
echo "Dashboard of all sandboxes: $CUBICLE_URL/"
echo "The sandbox $id stays up until it is idle for 30 minutes. Try:"
echo "  curl -s $CUBICLE_URL/v1/sandboxes | head"
echo "  ./bin/cubicle screenshot $id -o now.png"
echo "  ./bin/cubicle exec $id -- ls /"
echo "  ./bin/cubicle rm $id"
if [ -n "$daemon_pid" ]; then
  echo "cubicled runs in the foreground now (pid $daemon_pid); Ctrl-C stops it and leaves sandboxes for the next start."
  trap 'kill -TERM $daemon_pid; wait $daemon_pid' INT TERM
  wait "$daemon_pid"
fi
