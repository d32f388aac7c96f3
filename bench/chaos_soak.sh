#!/usr/bin/env bash
# The chaos harness's soak (issue 14): test/chaos/chaos.sh for several seeds and a longer fault
# schedule, one line of figures per seed (faults injected, task runs, acknowledged and lost jobs,
# overlaps, GPU reuse after a run's end). Usage: bench/chaos_soak.sh PATH/TO/gpufleet [SEEDS]
# [FAULT_SECONDS]; defaults: seeds 101-103, 150 s each. Record the figures in bench/RESULTS.md.
set -uo pipefail
gpufleet=$1
seeds=${2:-101-103}
seconds=${3:-150}
here=$(cd "$(dirname "$0")/.." && pwd)
status=0
for seed in $(seq "${seeds%-*}" "${seeds#*-}"); do
  line=$("$here/test/chaos/chaos.sh" "$gpufleet" "$seed" "$seconds" 2>&1 | grep '^chaos: [0-9]')
  [ $? -eq 0 ] && [[ $line == *" 0 problems" ]] || status=1
  echo "seed $seed: ${line#chaos: }"
done
exit $status
