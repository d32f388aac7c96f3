#!/usr/bin/env bash
# Times the simulator speed targets of issue 3 and prints a table (wall seconds, one run each).
# Usage: bench/sim_speed.sh [path/to/gpufleet]   (after scripts/build)
set -euo pipefail
cd "$(dirname "$0")/.."
gpufleet="${1:-build/apps/gpufleet/gpufleet}"

time_run() {
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { print b - a }'
}

printf '%-58s %10s %8s\n' "run" "wall (s)" "target"
printf '%-58s %10.2f %8s\n' "fill, default trace, fgd, 1 seed, 1 thread" \
  "$(time_run "$gpufleet" sim fill --policy fgd --seeds 42 --threads 1)" "<= 1"
printf '%-58s %10.2f %8s\n' "fill, default trace, gpufleet, 1 seed, 1 thread" \
  "$(time_run "$gpufleet" sim fill --policy gpufleet --seeds 42 --threads 1)" "<= 1"
printf '%-58s %10.2f %8s\n' "fill, default trace, 6 FGD-paper policies x 10 seeds" \
  "$(time_run "$gpufleet" sim fill --policy random,dot-prod,gpu-clustering,gpu-packing,best-fit,fgd --seeds 42-51 --threads "$(nproc)")" "<= 30"
printf '%-58s %10.2f %8s\n' "replay, Philly 82,247 jobs, 2,000 GPUs, fifo, 1 thread" \
  "$(time_run "$gpufleet" sim replay --trace data/philly/philly.csv --format philly --cluster 250x8 --policy fifo --threads 1)" "<= 10"
printf '%-58s %10.2f %8s\n' "replay, Philly 82,247 jobs, 2,000 GPUs, tiresias, 1 thread" \
  "$(time_run "$gpufleet" sim replay --trace data/philly/philly.csv --format philly --cluster 250x8 --policy tiresias --threads 1)" "<= 10"
