#!/usr/bin/env bash
# CPU and memory of an idle `gpufleet dev` (issue 5 target: <= 5% of one core with 32 simulated
# agents). Starts it without trace jobs, lets it settle for 10 s, then reads the process's CPU
# time (utime + stime from /proc/PID/stat) over MEASURE seconds (default 60) and its resident
# memory. Usage: bench/dev_idle.sh [PATH/TO/gpufleet] [MEASURE_SECONDS]
set -euo pipefail
gpufleet=${1:-build/apps/gpufleet/gpufleet}
measure=${2:-60}
work=$(mktemp -d)
"$gpufleet" dev --no-trace --quiet --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --data-dir "$work/data" >"$work/log" 2>&1 &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
sleep 10
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
start=$(ticks)
sleep "$measure"
end=$(ticks)
rss_kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
threads=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status")
awk -v t=$((end - start)) -v hz="$hz" -v s="$measure" -v rss="$rss_kib" -v th="$threads" 'BEGIN {
  printf "%-34s %10s %10s %8s\n", "gpufleet dev, 32 nodes x 8 GPUs", "cpu%core", "rss MiB", "threads"
  printf "%-34s %10.2f %10.1f %8d\n", "idle (no jobs), " s " s", 100 * t / hz / s, rss / 1024, th
}'
