#!/usr/bin/env bash
# `gpufleet dev --simulated-mig-nodes` end to end: a job asking for a MIG slice that fits no
# node's layout (GPU 0 starts as seven 1g.10gb, the others as one whole-GPU instance each) makes
# the server repartition a GPU,
# the simulated agent applies the new layout, and the job runs on a MIG device (MIG-... UUID).
# Usage: dev_mig_smoke.sh PATH/TO/gpufleet. Bounded: under 30 s.
set -euo pipefail

gpufleet=$1
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$work"' EXIT

fail() {
  echo "dev_mig_smoke: $*" >&2
  cat "$work/log" >&2 || true
  exit 1
}

"$gpufleet" dev --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --nodes 2 --leaves 1 \
  --gpus-per-node 2 --simulated-mig-nodes 1 --no-trace --heartbeat-ms 200 --run-seconds 40 \
  --quiet --data-dir "$work/data" >"$work/log" 2>&1 &
pid=$!

for _ in $(seq 100); do
  grep -q "^try: " "$work/log" && break
  kill -0 "$pid" 2>/dev/null || fail "gpufleet dev exited early"
  sleep 0.1
done
grep -q "^  MIG       dev-node-000: every GPU MIG-enabled, GPU 0 as 7 1g.10gb, the others one 7g.80gb" "$work/log" ||
  fail "no MIG line in the banner"
addr=$(sed -n 's/^try: GPUFLEET_ADDR=\([^ ]*\) .*/\1/p' "$work/log")
token=$(sed -n 's/^try: .*GPUFLEET_TOKEN=\([^ ]*\) .*/\1/p' "$work/log")
[ -n "$addr" ] && [ -n "$token" ] || fail "no address or token printed"
export GPUFLEET_ADDR=$addr GPUFLEET_TOKEN=$token

# 3g.40gb fits no current layout (GPU 0 is seven 1g.10gb instances, GPU 1 one 7g.80gb).
cat >"$work/small.yaml" <<'YAML'
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: mig-small}
spec:
  tasks:
    - name: main
      command: [sleep, "60"]
      env: {GPUFLEET_SIM_DURATION_MS: "60000"}
      resources: {gpus: {migProfile: 3g.40gb}}
YAML
# The agents register on their first heartbeat; until then the job would only wait longer.
for _ in $(seq 100); do
  "$gpufleet" get nodes >"$work/nodes" 2>/dev/null || true
  [ "$(grep -c " Ready " "$work/nodes" || true)" -eq 2 ] && break
  sleep 0.1
done
"$gpufleet" submit -f "$work/small.yaml" >/dev/null || fail "submit"

state=
for _ in $(seq 150); do
  "$gpufleet" get jobs mig-small -o json >"$work/job.json" 2>/dev/null || true
  state=$(sed -n 's/^ *"state": *"\([A-Za-z]*\)".*/\1/p' "$work/job.json" | head -1)
  [ "$state" = "Running" ] && break
  sleep 0.1
done
[ "$state" = "Running" ] || fail "job mig-small is $state, not Running: $(cat "$work/job.json")"

# Its instance is a 3g.40gb device the agent reports on dev-node-000, with a MIG UUID.
"$gpufleet" get nodes dev-node-000 -o json >"$work/node.json" || fail "get node"
python3 - "$work/job.json" "$work/node.json" <<'PY' || fail "no MIG device for the job"
import json, sys
job = json.load(open(sys.argv[1]))
node = json.load(open(sys.argv[2]))
placement = job["placements"][0]
assert placement["node"] == "dev-node-000", placement
assignment = placement["assignments"][0]
assert assignment["mig_profile"] == "3g.40gb", assignment
gpu = next(g for g in node["gpus"] if g["index"] == placement["gpus"][0])
device = next(d for d in gpu["mig_devices"]
              if d["profile"] == "3g.40gb" and d["start"] == assignment["mig_start"])
assert device["uuid"].startswith("MIG-"), device
print(f"dev_mig_smoke: mig-small runs on {device['uuid']} (gpu {gpu['index']} of dev-node-000)")
PY
"$gpufleet" describe job mig-small >"$work/describe" || fail "describe job"
grep -q "MIG layout of dev-node-000 gpu [0-9] changed for it" "$work/describe" ||
  fail "no repartition event: $(cat "$work/describe")"

kill -TERM "$pid"
wait "$pid" || fail "gpufleet dev did not stop cleanly on SIGTERM"
pid=
echo "dev_mig_smoke: ok"
