#!/usr/bin/env bash
# The agent's telemetry footprint (issue 5 target: sampling 8 GPUs at 1 Hz through the fake
# NVML, scraped every 15 s, <= 1 % of one core and <= 30 MB resident). Runs agent_telemetry_soak
# (the TelemetrySampler over the fake libnvidia-ml, serving /metrics on loopback), scrapes it
# with curl every SCRAPE seconds, and reads the process's CPU time and memory from /proc.
# The CPU share counts the steady state only: it starts after a warm-up of WARMUP seconds.
#
# Usage: bench/agent_telemetry.sh [SECONDS]    (default 120; BUILD_DIR, GPUS, SCRAPE, WARMUP)
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-120}"
build_dir="${BUILD_DIR:-build}"
gpus="${GPUS:-8}"
scrape="${SCRAPE:-15}"
warmup="${WARMUP:-5}"

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" --target agent_telemetry_soak gpufleet_fake_nvml >/dev/null
soak="$build_dir/src/gpufleet/agent/agent_telemetry_soak"

out="$(mktemp)"
"$soak" --gpus "$gpus" --interval-ms 1000 >"$out" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 100); do
  grep -q '^port ' "$out" && break
  sleep 0.1
done
port="$(awk '/^port /{print $2}' "$out")"
[ -n "$port" ] || { echo "agent_telemetry_soak did not start" >&2; exit 1; }

ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }  # utime + stime
hz="$(getconf CLK_TCK)"
sleep "$warmup"
start_ticks="$(ticks)"
start_ns="$(date +%s%N)"
scrapes=0
bytes=0
end=$((SECONDS + duration))
while [ "$SECONDS" -lt "$end" ]; do
  bytes="$(curl -sf "http://127.0.0.1:$port/metrics" | wc -c)"
  scrapes=$((scrapes + 1))
  sleep "$scrape"
done
end_ticks="$(ticks)"
end_ns="$(date +%s%N)"
rss_kb="$(awk '/^VmRSS:/{print $2}' "/proc/$pid/status")"
hwm_kb="$(awk '/^VmHWM:/{print $2}' "/proc/$pid/status")"
threads="$(awk '/^Threads:/{print $2}' "/proc/$pid/status")"
kill -TERM "$pid"
wait "$pid" || true
samples="$(awk '/^samples /{print $2}' "$out")"

cpu_pct="$(awk -v t=$((end_ticks - start_ticks)) -v hz="$hz" -v ns=$((end_ns - start_ns)) \
  'BEGIN { printf "%.3f", 100 * (t / hz) / (ns / 1e9) }')"
rss_mb="$(awk -v k="$rss_kb" 'BEGIN { printf "%.1f", k / 1024 }')"
hwm_mb="$(awk -v k="$hwm_kb" 'BEGIN { printf "%.1f", k / 1024 }')"
verdict="$(awk -v c="$cpu_pct" -v m="$hwm_mb" 'BEGIN { print (c <= 1 && m <= 30) ? "met" : "MISSED" }')"

echo "| GPUs | sample interval | scrape interval | measured | samples | scrapes | /metrics bytes | CPU (% of one core) | RSS | peak RSS | threads | target (<= 1 %, <= 30 MB) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
echo "| $gpus | 1 s | ${scrape} s | ${duration} s | $samples | $scrapes | $bytes | $cpu_pct | $rss_mb MiB | $hwm_mb MiB | $threads | $verdict |"
