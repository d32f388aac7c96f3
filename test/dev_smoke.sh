#!/usr/bin/env bash
# `gpufleet dev` end to end, as a newcomer meets it: it starts, its fleet /metrics shows
# dcgm-exporter series, the simulated agents register, trace jobs run to completion, and it
# stops cleanly on SIGTERM. Usage: dev_smoke.sh PATH/TO/gpufleet. Bounded: about 30 s.
set -euo pipefail

gpufleet=$1
work=$(mktemp -d)
trap 'kill -KILL "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT

"$gpufleet" dev --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --nodes 8 --leaves 2 \
  --playback-minutes 0.25 --heartbeat-ms 500 --run-seconds 60 --quiet \
  --data-dir "$work/data" >"$work/log" 2>&1 &
pid=$!

fail() {
  echo "dev_smoke: $*" >&2
  cat "$work/log" >&2
  exit 1
}

for _ in $(seq 200); do
  grep -q "^try: " "$work/log" && break
  kill -0 "$pid" 2>/dev/null || fail "gpufleet dev exited early"
  sleep 0.1
done
metrics=$(grep -o 'http://127\.0\.0\.1:[0-9]*/metrics (dcgm' "$work/log" | cut -d' ' -f1)
addr=$(sed -n 's/^try: GPUFLEET_ADDR=\([^ ]*\) .*/\1/p' "$work/log")
token=$(sed -n 's/^try: .*GPUFLEET_TOKEN=\([^ ]*\) .*/\1/p' "$work/log")
[ -n "$metrics" ] && [ -n "$addr" ] && [ -n "$token" ] || fail "no addresses printed"

# The fleet's metrics: a GPU_UTIL series per GPU of the 8 nodes, with dcgm-exporter's labels,
# but for the GPUs of the 2 MIG nodes (one per leaf by default), which report no GPU-level
# utilization, as dcgm-exporter on MIG-enabled GPUs does not.
# (Each scrape goes to a file first: `curl | grep -q` fails under pipefail when grep stops early.)
grep -q "^  MIG       dev-node-000, dev-node-004: every GPU MIG-enabled" "$work/log" ||
  fail "not one MIG node per leaf by default"
series=0
for _ in $(seq 100); do
  curl -sf "$metrics" >"$work/metrics" || true
  series=$(grep -c '^DCGM_FI_DEV_GPU_UTIL{gpu="' "$work/metrics" || true)
  [ "$series" -ge 48 ] && break
  sleep 0.2
done
[ "$series" -eq 48 ] || fail "expected 48 DCGM_FI_DEV_GPU_UTIL series, got $series"
grep -q '^# TYPE DCGM_FI_DEV_GPU_UTIL gauge$' "$work/metrics" || fail "no TYPE line"
grep -q 'Hostname="dev-node-007"' "$work/metrics" || fail "no Hostname label"

# The agents registered and trace jobs ran through the real lifecycle to Succeeded.
# While they run, their GPUs show utilization.
export GPUFLEET_ADDR=$addr GPUFLEET_TOKEN=$token
busy=0
succeeded=0
for _ in $(seq 200); do
  curl -sf "$metrics" >"$work/metrics" || true
  now_busy=$(grep '^DCGM_FI_DEV_GPU_UTIL{' "$work/metrics" | awk '$NF > 0' | wc -l)
  busy=$((now_busy > busy ? now_busy : busy))
  "$gpufleet" get jobs -o json >"$work/jobs.json" 2>/dev/null || true
  succeeded=$(grep -c '"state": *"Succeeded"' "$work/jobs.json" || true)
  [ "$busy" -gt 0 ] && [ "$succeeded" -gt 0 ] && break
  sleep 0.25
done
[ "$succeeded" -gt 0 ] || fail "no job succeeded"
[ "$busy" -gt 0 ] || fail "no GPU showed utilization while jobs ran"
"$gpufleet" get nodes >"$work/nodes" || fail "get nodes failed"
ready=$(grep -c " Ready " "$work/nodes" || true)
[ "$ready" -eq 8 ] || fail "expected 8 Ready nodes, got $ready"

# Every example submits: the demo has the teams and queues they name. The 128-node gang cannot
# fit 8 nodes: a strict submit refuses it, naming what is missing.
examples=$(cd "$(dirname "$0")/../examples" && pwd)
count=0
for spec in "$examples"/*.yaml; do
  "$gpufleet" submit -f "$spec" >"$work/submit" 2>"$work/submit.err" ||
    fail "submitting $(basename "$spec") failed: $(cat "$work/submit" "$work/submit.err")"
  count=$((count + 1))
done
"$gpufleet" submit -f "$examples/gang-128-leaf.yaml" --strict >"$work/strict" 2>&1 &&
  fail "a strict submit of the 128-node gang was accepted"
grep -q "never fits" "$work/strict" || fail "no never-fits refusal: $(cat "$work/strict")"

kill -TERM "$pid"
wait "$pid" || fail "gpufleet dev did not stop cleanly on SIGTERM"
grep -q "state kept in" "$work/log" || fail "no clean-stop message"
echo "dev_smoke: ok ($series GPU series, $ready nodes Ready, $busy GPUs busy, $count examples submitted)"
