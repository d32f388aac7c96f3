#!/usr/bin/env bash
# `gpufleet agent --once --slurm-health` against a real slurmctld (slurm_cluster.sh's four nodes,
# no accounting) and the fake NVML: an XID 79 drains the node with gpufleet's reason in `sinfo -R`,
# clean GPUs resume it, a node an admin drained is left alone whatever its GPUs say, and slurmd
# itself runs the check as HealthCheckProgram (SLURMD_NODENAME names the node). Runs as root.
# Usage: slurm_health.sh GPUFLEET FAKE_NVML_LIBRARY. Exit 77 (skipped) without Slurm, unless
# GPUFLEET_REQUIRE_SLURM=1.
set -euo pipefail

gpufleet=$(realpath "$1")
fake_nvml=$(realpath "$2")
slurm_test=slurm_health
slurm_accounting=0
# shellcheck source=slurm_cluster.sh
source "$(dirname "$0")/slurm_cluster.sh"

# The fake NVML's answers per node: nvml/NODE.json, clean unless a test writes XIDs into it.
mkdir -p "$dir/nvml"
gpus() {  # gpus NODE [XID on GPU 3]
  local xids="[]"
  [ $# -gt 1 ] && xids="[$2]"
  python3 - "$xids" >"$dir/nvml/$1.json.new" <<'EOF'
import json, sys
devices = [{"name": "NVIDIA A100-SXM4-40GB", "uuid": f"GPU-{g}", "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0",
            "temperature_c": 40, "slowdown_temperature_c": 87, "xid_events": True,
            "xids": json.loads(sys.argv[1]) if g == 3 else []} for g in range(4)]
print(json.dumps({"driver_version": "550.54.15", "devices": devices}))
EOF
  mv "$dir/nvml/$1.json.new" "$dir/nvml/$1.json"
}
for node in 1 2 3 4; do gpus "node$node"; done
# What slurmd runs: the check with the node's fake GPUs.
cat >"$dir/health-check" <<EOF
#!/bin/bash
exec env GPUFLEET_FAKE_NVML_SCRIPT="$dir/nvml/\$SLURMD_NODENAME.json" SLURM_CONF="$dir/etc/slurm.conf" \\
  "$gpufleet" agent --once --slurm-health --nvml-library "$fake_nvml" >>"$dir/health-check.log" 2>&1
EOF
chmod 755 "$dir/health-check"
slurm_conf_extra="HealthCheckProgram=$dir/health-check
HealthCheckInterval=2
HealthCheckNodeState=ANY"
slurm_start
wait_for 60 bash -c '[ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" -eq 4 ]'

check() {  # check NODE: one health check as an admin would run it by hand
  env GPUFLEET_FAKE_NVML_SCRIPT="$dir/nvml/$1.json" \
    "$gpufleet" agent --once --slurm-health --slurm-node "$1" --nvml-library "$fake_nvml"
}
reason() { sinfo -h -R -n "$1" -o %E; }
state() { sinfo -h -N -n "$1" -o %T | head -n 1; }
fail() { echo "slurm_health: FAIL: $*"; sinfo -R; exit 1; }

# 1. XID 79 on node1's GPU 3: drained, with gpufleet's reason.
gpus node1 79
check node1 | tee "$dir/check1.out"
# slurmd may have run the same check first: then the drain stands.
grep -Eq "slurm node node1: (still )?drained \(gpufleet: XID 79 on GPU 3\)" "$dir/check1.out" \
  || fail "no drain"
[ "$(reason node1)" = "gpufleet: XID 79 on GPU 3" ] || fail "node1 reason '$(reason node1)'"
sinfo -R
# 2. Clean again: resumed.
gpus node1
check node1 | tee "$dir/check2.out"
grep -Eq "slurm node node1: (resumed|none)" "$dir/check2.out" || fail "no resume"
wait_for 10 bash -c "[ -z \"\$(sinfo -h -R -n node1 -o %E)\" ]" || fail "node1 still drained: $(reason node1)"
# 3. An admin's drain on node2 stands, whatever its GPUs say.
scontrol update nodename=node2 state=drain reason="bad fan"
gpus node2 79
check node2 | tee "$dir/check3.out"
grep -q "slurm node node2: left drained" "$dir/check3.out" || fail "admin drain not left alone"
gpus node2
check node2 >/dev/null
[ "$(reason node2)" = "bad fan" ] || fail "node2 reason '$(reason node2)'"
# 4. slurmd runs the check by itself: node3's XID drains it, clean GPUs resume it.
gpus node3 79
wait_for 30 bash -c "[ \"\$(sinfo -h -R -n node3 -o %E)\" = 'gpufleet: XID 79 on GPU 3' ]" \
  || fail "HealthCheckProgram did not drain node3; log: $(tail -n 5 "$dir/health-check.log")"
gpus node3
wait_for 30 bash -c "[ -z \"\$(sinfo -h -R -n node3 -o %E)\" ]" || fail "node3 not resumed"
[ "$(reason node2)" = "bad fan" ] || fail "node2 reason '$(reason node2)' after slurmd's checks"
sinfo -N -o "%N %T %E"
echo "slurm_health: OK: drained on XID 79, resumed when clean, an admin's drain left alone, HealthCheckProgram drives it"
