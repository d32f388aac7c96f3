#!/usr/bin/env bash
# The dashboard in a real browser (docs/dashboard.md): starts `gpufleet dev` on loopback ports
# and runs web/test/dashboard_test.mjs (playwright-core driving Debian's chromium, both installed
# by scripts/setup) against it. Usage: dashboard_browser.sh [--newcomer] PATH/TO/gpufleet
# [SCREENSHOT_DIR]. Bounded: about 35 s. With SCREENSHOT_DIR (docs/img to refresh the docs'
# pictures) the fleet is the README's 32 nodes and the screenshots are written there.
# --newcomer runs web/test/newcomer_test.mjs instead, the README's walk (every example, the CLI
# and the dashboard) on the README's fleet: about 60 s.
set -euo pipefail

newcomer=
if [ "${1:-}" = --newcomer ]; then
  newcomer=1
  shift
fi
gpufleet=$1
shots=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT

fail() {
  echo "dashboard_browser: $*" >&2
  [ -f "$work/log" ] && tail -c 4000 "$work/log" >&2
  exit 1
}
[ -x "${GPUFLEET_CHROMIUM:-/usr/bin/chromium}" ] || fail "no chromium: run scripts/setup"
[ -d "$repo/web/node_modules/playwright-core" ] || fail "no web/node_modules: run scripts/setup"

fleet=(--nodes 8 --leaves 2 --playback-minutes 1 --target-load 0.4 --run-seconds 90)
if [ -n "$shots" ] || [ -n "$newcomer" ]; then
  fleet=(--playback-minutes 10 --run-seconds 300)
fi
# Prices, so that the Usage page has its cost column (`--prices`, docs/usage.md).
printf 'model,price_per_gpu_hour\nH100-80GB,2.49\n' >"$work/prices.csv"
"$gpufleet" dev --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 "${fleet[@]}" \
  --heartbeat-ms 1000 --quiet --data-dir "$work/data" --prices "$work/prices.csv" \
  >"$work/log" 2>&1 &
pid=$!

for _ in $(seq 200); do
  grep -q "^try: " "$work/log" && break
  kill -0 "$pid" 2>/dev/null || fail "gpufleet dev exited early"
  sleep 0.1
done
url=$(sed -n 's/^gpufleet dev: open the dashboard: \(http[^#]*\)\/#token=.*/\1/p' "$work/log")
token=$(sed -n 's/^gpufleet dev: open the dashboard: .*#token=\(.*\)$/\1/p' "$work/log")
[ -n "$url" ] && [ -n "$token" ] || fail "no dashboard address printed first"
# Every node registered before the browser counts them (and before the newcomer's examples are
# checked against the fleet).
nodes=8
[ ${#fleet[@]} -eq 4 ] && nodes=32  # the README's fleet
for _ in $(seq 100); do
  ready=$(curl -sf -H "Authorization: Bearer $token" "$url/v1/nodes" | grep -o '"state":"Ready"' | wc -l || true)
  [ "$ready" -ge "$nodes" ] && break
  sleep 0.1
done
if [ -n "$newcomer" ]; then
  timeout 150 node "$repo/web/test/newcomer_test.mjs" "$url" "$token" "$gpufleet" "$repo/examples" \
    $shots || fail "newcomer checks failed"
  exit 0
fi
if [ -n "$shots" ]; then
  sleep 50  # the README's fleet a minute in: the warm start has reached its load
fi
timeout 60 node "$repo/web/test/dashboard_test.mjs" "$url" "$token" $shots || fail "browser checks failed"
