#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds gpufleet, reads the GPUs once with
# `gpufleet probe --backend nvml --format dcgm` and once with `nvidia-smi --query-gpu`, prints the
# two side by side and exits 1 if any reading differs beyond its tolerance.
#
# Read-only: it runs only queries (nvidia-smi --query-gpu and NVML getters); it never changes
# clocks, power limits, MIG mode, persistence mode or anything else on the GPU.
#
# Tolerances (the two tools sample at slightly different moments; override through the
# environment):
#   identity (UUID, PCI bus id, name)      exact
#   temperature                            TEMP_TOL_C            (default 3 C)
#   power draw                             POWER_TOL_W / _PCT    (default 15 W or 10 %, larger)
#   GPU and memory utilisation             UTIL_TOL_PCT          (default 25 points)
#   framebuffer used and free              MEM_TOL_MIB / _PCT    (default 64 MiB or 2 %, larger);
#                                          "used" also matches used + reserved (older drivers'
#                                          nvidia-smi counts reserved memory as used)
#   SM and memory clocks                   CLOCK_TOL_PCT         (default 10 %)
# On MIG-enabled GPUs only identity, temperature, power and clocks are compared.
#
# Then, where the driver's nvidia-cuda-mps-control and a python3 with PyTorch are found, the MPS
# step (docs/sharing.md): one MPS control daemon for GPU 0, started as the agent starts it (pipe
# and log directories of its own, CUDA_VISIBLE_DEVICES naming the GPU by UUID), and two clients
# with the variables gpufleet's runner gives an MPS share (CUDA_MPS_PIPE_DIRECTORY,
# CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "0=<MiB>M", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). Each client
# is limited to MPS_LIMIT_MIB (default 2048); one allocates twice its limit and must fail, the
# other allocates half of it and must still run after the first has failed. The daemon is told to
# quit at the end (and killed if it has not after 10 s). It changes no GPU setting either: MPS
# runs in the GPU's current compute mode. Skipped, with a line saying why, where either program
# is missing; MPS_CHECK=0 skips it too.
#
# Then the built-in diagnostic of every GPU (`gpufleet probe --diagnose`, below).
#
# Environment: BUILD_DIR (default build), GPUFLEET (a built binary: skips the build), BUNDLE (a
# directory scripts/gpu-bundle made, for a machine without Debian's packages: its gpufleet),
# NVML_LIBRARY (passed to --nvml-library), NVIDIA_SMI (default nvidia-smi), MPS_CONTROL (default
# nvidia-cuda-mps-control), PYTHON (default python3), MPS_LIMIT_MIB, MPS_CHECK, CUDA_LIBRARY
# (passed to --cuda-library), PATTERN_MIB, DIAGNOSE.
set -euo pipefail
cd "$(dirname "$0")/.."

TEMP_TOL_C="${TEMP_TOL_C:-3}"
POWER_TOL_W="${POWER_TOL_W:-15}"
POWER_TOL_PCT="${POWER_TOL_PCT:-10}"
UTIL_TOL_PCT="${UTIL_TOL_PCT:-25}"
MEM_TOL_MIB="${MEM_TOL_MIB:-64}"
MEM_TOL_PCT="${MEM_TOL_PCT:-2}"
CLOCK_TOL_PCT="${CLOCK_TOL_PCT:-10}"
NVIDIA_SMI="${NVIDIA_SMI:-nvidia-smi}"

if ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
  echo "gpu-check: $NVIDIA_SMI not found: this script needs a machine with an NVIDIA GPU" >&2
  exit 2
fi

if [ -n "${BUNDLE:-}" ]; then
  GPUFLEET="$BUNDLE/gpufleet"  # a carried build (scripts/gpu-bundle): nothing to build there
fi
if [ -z "${GPUFLEET:-}" ]; then
  build_dir="${BUILD_DIR:-build}"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build_dir" --target gpufleet >/dev/null
  GPUFLEET="$build_dir/apps/gpufleet/gpufleet"
fi

probe_args=(probe --backend nvml --format dcgm)
if [ -n "${NVML_LIBRARY:-}" ]; then
  probe_args+=(--nvml-library "$NVML_LIBRARY")
fi
metrics="$("$GPUFLEET" "${probe_args[@]}")"
smi="$("$NVIDIA_SMI" --query-gpu=index,uuid,pci.bus_id,name,utilization.gpu,utilization.memory,memory.used,memory.free,temperature.gpu,power.draw,clocks.sm,clocks.mem --format=csv,noheader,nounits)"

# Both outputs go to one awk program: the dcgm text first, then the CSV. Its verdict is the
# script's, after the MPS step.
compared=0
{
  printf '%s\n' "$metrics"
  echo "@@SMI@@"
  printf '%s\n' "$smi"
} | awk -v temp_tol="$TEMP_TOL_C" -v power_tol_w="$POWER_TOL_W" -v power_tol_pct="$POWER_TOL_PCT" \
  -v util_tol="$UTIL_TOL_PCT" -v mem_tol_mib="$MEM_TOL_MIB" -v mem_tol_pct="$MEM_TOL_PCT" \
  -v clock_tol_pct="$CLOCK_TOL_PCT" '
function label(line, name,    pattern, start, rest) {
  pattern = name "=\""
  start = index(line, pattern)
  if (start == 0) return ""
  rest = substr(line, start + length(pattern))
  return substr(rest, 1, index(rest, "\"") - 1)
}
function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
function abs(x) { return x < 0 ? -x : x }
function max(a, b) { return a > b ? a : b }
function missing(s) { return s == "" || s ~ /N\/A|Not Supported|Unknown|Insufficient/ }
function report(gpu, field, smi_value, ours, tolerance, ok) {
  printf "%-4s %-18s %-42s %-42s %-14s %s\n", gpu, field, smi_value, ours, tolerance, ok ? "ok" : "MISMATCH"
  if (!ok) mismatches++
}
function exact(gpu, field, smi_value, ours) {
  report(gpu, field, smi_value, ours == "" ? "-" : ours, "exact", smi_value == ours)
}
function near(gpu, field, smi_value, key, tolerance, text,    ours) {
  if (missing(smi_value)) return
  if (!(key in value)) { report(gpu, field, smi_value, "-", text, 0); return }
  ours = value[key]
  report(gpu, field, smi_value, ours, text, abs(smi_value - ours) <= tolerance)
}
BEGIN { section = "dcgm"; mismatches = 0; gpus = 0 }
$0 == "@@SMI@@" { section = "smi"; next }
section == "dcgm" {
  if ($0 ~ /^#/ || $0 == "") next
  metric = substr($0, 1, index($0, "{") - 1)
  gpu = label($0, "gpu")
  if (index($0, "GPU_I_ID=") > 0) { mig[gpu] = 1 }
  else { value[metric ":" gpu] = $NF }
  uuid[gpu] = label($0, "UUID"); bus[gpu] = label($0, "pci_bus_id"); name[gpu] = label($0, "modelName")
  next
}
section == "smi" {
  n = split($0, f, ",")
  for (i = 1; i <= n; i++) f[i] = trim(f[i])
  gpu = f[1]
  gpus++
  if (gpus == 1) printf "%-4s %-18s %-42s %-42s %-14s %s\n", "GPU", "FIELD", "NVIDIA-SMI", "GPUFLEET", "TOLERANCE", "RESULT"
  exact(gpu, "uuid", f[2], uuid[gpu])
  exact(gpu, "pci.bus_id", f[3], bus[gpu])
  exact(gpu, "name", f[4], name[gpu])
  near(gpu, "temperature.gpu", f[9], "DCGM_FI_DEV_GPU_TEMP:" gpu, temp_tol, "+-" temp_tol " C")
  if (!missing(f[10])) {
    tol = max(power_tol_w, f[10] * power_tol_pct / 100)
    near(gpu, "power.draw", f[10], "DCGM_FI_DEV_POWER_USAGE:" gpu, tol, sprintf("+-%.0f W", tol))
  }
  if (!missing(f[11])) {
    tol = f[11] * clock_tol_pct / 100
    near(gpu, "clocks.sm", f[11], "DCGM_FI_DEV_SM_CLOCK:" gpu, tol, "+-" clock_tol_pct " %")
  }
  if (!missing(f[12])) {
    tol = f[12] * clock_tol_pct / 100
    near(gpu, "clocks.mem", f[12], "DCGM_FI_DEV_MEM_CLOCK:" gpu, tol, "+-" clock_tol_pct " %")
  }
  if (gpu in mig) next
  near(gpu, "utilization.gpu", f[5], "DCGM_FI_DEV_GPU_UTIL:" gpu, util_tol, "+-" util_tol " pt")
  near(gpu, "utilization.memory", f[6], "DCGM_FI_DEV_MEM_COPY_UTIL:" gpu, util_tol, "+-" util_tol " pt")
  if (!missing(f[7])) {
    tol = max(mem_tol_mib, f[7] * mem_tol_pct / 100)
    key = "DCGM_FI_DEV_FB_USED:" gpu
    # Older drivers count the reserved memory as used.
    if ((key in value) && ("DCGM_FI_DEV_FB_RESERVED:" gpu in value) &&
        abs(f[7] - value[key]) > tol &&
        abs(f[7] - value[key] - value["DCGM_FI_DEV_FB_RESERVED:" gpu]) <= tol) {
      report(gpu, "memory.used", f[7], value[key] " + " value["DCGM_FI_DEV_FB_RESERVED:" gpu] " reserved", sprintf("+-%.0f MiB", tol), 1)
    } else {
      near(gpu, "memory.used", f[7], key, tol, sprintf("+-%.0f MiB", tol))
    }
  }
  if (!missing(f[8])) {
    tol = max(mem_tol_mib, f[8] * mem_tol_pct / 100)
    near(gpu, "memory.free", f[8], "DCGM_FI_DEV_FB_FREE:" gpu, tol, sprintf("+-%.0f MiB", tol))
  }
}
END {
  if (gpus == 0) { print "gpu-check: nvidia-smi listed no GPU" > "/dev/stderr"; exit 1 }
  if (mismatches > 0) { printf "gpu-check: %d mismatch(es)\n", mismatches > "/dev/stderr"; exit 1 }
  printf "gpu-check: %d GPU(s) agree within tolerance\n", gpus
}' || compared=$?

mps_check() {
  local control="${MPS_CONTROL:-nvidia-cuda-mps-control}" python="${PYTHON:-python3}"
  local limit="${MPS_LIMIT_MIB:-2048}"
  if [ "${MPS_CHECK:-1}" = 0 ]; then
    echo "gpu-check: MPS step skipped (MPS_CHECK=0)"
    return 0
  fi
  if ! command -v "$control" >/dev/null 2>&1; then
    echo "gpu-check: MPS step skipped: $control not found"
    return 0
  fi
  if ! "$python" -c 'import torch' >/dev/null 2>&1; then
    echo "gpu-check: MPS step skipped: $python has no PyTorch"
    return 0
  fi
  local uuid dir
  uuid="$("$NVIDIA_SMI" --query-gpu=uuid --format=csv,noheader --id=0 | tr -d ' ')"
  dir="$(mktemp -d /tmp/gpufleet-mps-check.XXXXXX)"
  mkdir -p "$dir/pipe" "$dir/log"
  local -a daemon_env=(env "CUDA_VISIBLE_DEVICES=$uuid" "CUDA_MPS_PIPE_DIRECTORY=$dir/pipe"
    "CUDA_MPS_LOG_DIRECTORY=$dir/log")
  "${daemon_env[@]}" "$control" -d
  local waited=0
  while [ ! -s "$dir/pipe/nvidia-cuda-mps-control.pid" ] && [ "$waited" -lt 50 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  local daemon_pid
  daemon_pid="$(cat "$dir/pipe/nvidia-cuda-mps-control.pid" 2>/dev/null || true)"
  if [ -z "$daemon_pid" ]; then
    echo "gpu-check: MPS step FAILED: the daemon wrote no pid file" >&2
    return 1
  fi
  # A client allocates MIB MiB, says so, holds it for HOLD seconds and prints its end.
  local client='
import sys, time, torch
mib, hold = int(sys.argv[1]), float(sys.argv[2])
try:
    block = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
except RuntimeError as error:
    print(f"allocation of {mib} MiB refused: {str(error).splitlines()[0]}", flush=True)
    sys.exit(3)
print(f"allocated {mib} MiB", flush=True)
time.sleep(hold)
print("still running", flush=True)
'
  local -a client_env=(env "CUDA_VISIBLE_DEVICES=$uuid" "CUDA_MPS_PIPE_DIRECTORY=$dir/pipe"
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=${limit}M" "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50")
  "${client_env[@]}" "$python" -c "$client" $((limit / 2)) 30 >"$dir/within.log" 2>&1 &
  local within_pid=$!
  local over=0
  "${client_env[@]}" timeout 120 "$python" -c "$client" $((limit * 2)) 0 >"$dir/over.log" 2>&1 ||
    over=$?
  local within_alive=0
  if kill -0 "$within_pid" 2>/dev/null; then within_alive=1; fi
  local within=0
  wait "$within_pid" || within=$?
  echo quit | env "CUDA_MPS_PIPE_DIRECTORY=$dir/pipe" "$control" || true
  waited=0
  while kill -0 "$daemon_pid" 2>/dev/null && [ "$waited" -lt 100 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill -9 "$daemon_pid" 2>/dev/null || true
  echo "gpu-check: MPS client over its ${limit} MiB limit: exit $over: $(tail -n 1 "$dir/over.log")"
  echo "gpu-check: MPS client within its limit: exit $within, running when the other ended:" \
    "$within_alive: $(tail -n 1 "$dir/within.log")"
  if [ "$over" -ne 0 ] && [ "$within" -eq 0 ] && [ "$within_alive" -eq 1 ] &&
    grep -q "still running" "$dir/within.log"; then
    echo "gpu-check: MPS limits hold (logs in $dir)"
    return 0
  fi
  echo "gpu-check: MPS step FAILED (logs in $dir)" >&2
  return 1
}
mps_check || compared=1

# The built-in diagnostic (docs/reliability.md, "Active diagnostics"), as the agent runs it when
# the server asks: NVML sanity of each GPU, then the memory-pattern and compute check through the
# CUDA driver (libcuda.so.1 opened at run time, its kernels PTX built into gpufleet). It changes
# no GPU setting; the check writes and reads back PATTERN_MIB (default 256) of device memory it
# allocates itself. Where libcuda.so.1 does not load the CUDA check says unavailable and the step
# still passes on NVML's answers. DIAGNOSE=0 skips it (a GPU busy with others' work).
diagnose_check() {
  if [ "${DIAGNOSE:-1}" = 0 ]; then
    echo "gpu-check: diagnostic step skipped (DIAGNOSE=0)"
    return 0
  fi
  local -a args=(probe --diagnose --pattern-mib "${PATTERN_MIB:-256}")
  if [ -n "${NVML_LIBRARY:-}" ]; then args+=(--nvml-library "$NVML_LIBRARY"); fi
  if [ -n "${CUDA_LIBRARY:-}" ]; then args+=(--cuda-library "$CUDA_LIBRARY"); fi
  if "$GPUFLEET" "${args[@]}"; then
    echo "gpu-check: diagnostic passed"
    return 0
  fi
  echo "gpu-check: diagnostic FAILED" >&2
  return 1
}
diagnose_check || compared=1
exit "$compared"
