#!/usr/bin/env bash
# `gpufleet server` and a real `gpufleet agent` (simulated GPUs, real processes): the agent
# registers with an agent token, a job's command runs as a process with its GPU UUIDs in
# CUDA_VISIBLE_DEVICES and its output in the task log, the job ends Succeeded; a failing command
# fails its job; the agent serves dcgm-exporter metrics. Usage: agent_smoke.sh PATH/TO/gpufleet.
set -euo pipefail

gpufleet=$1
work=$(mktemp -d)
server_pid=
agent_pid=
cleanup() {
  kill -TERM $agent_pid $server_pid 2>/dev/null || true
  # Tasks outlive their agent by design: end the ones this script left running.
  pkill -KILL -f "$work/ledger" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "agent_smoke: $*" >&2
  cat "$work"/*.log >&2 || true
  exit 1
}
wait_for() {  # wait_for FILE PATTERN
  for _ in $(seq 200); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "timed out waiting for '$2' in $1"
}

echo "smoke-admin-token-0123456789" >"$work/admin-token"
"$gpufleet" server --data-dir "$work/server" --listen 127.0.0.1:0 --cycle-interval-ms 200 \
  --heartbeat-interval-ms 500 --admin-token-file "$work/admin-token" >"$work/server.log" 2>&1 &
server_pid=$!
wait_for "$work/server.log" "listening on"
addr=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/server.log" | head -1)
export GPUFLEET_ADDR=$addr GPUFLEET_TOKEN=smoke-admin-token-0123456789

"$gpufleet" create token --role agent --name smoke-agent >"$work/token.json" ||
  fail "cannot create an agent token"
sed -n 's/^token (shown once, keep it): \([0-9a-f]*\)$/\1/p' "$work/token.json" >"$work/agent-token"
[ -s "$work/agent-token" ] || fail "no token in $(cat "$work/token.json")"

# A root agent runs each run's tasks as a user of its own (docs/agent.md, "The task sandbox"); they
# reach their directories under $work/agent through $work. The uids are this script's alone.
chmod 755 "$work"
uid_first=$((2001000000 + ($$ % 100000) * 64))
uid_last=$((uid_first + 63))
"$gpufleet" agent --server "$addr" --token-file "$work/agent-token" --node-name smoke-node \
  --topology leaf=leaf-0 --backend simulated --simulated-gpus 4 --runner process \
  --state-dir "$work/agent" --metrics-listen 127.0.0.1:0 --stop-grace-s 2 \
  --task-uid-range "$uid_first-$uid_last" >"$work/agent.log" 2>&1 &
agent_pid=$!
wait_for "$work/agent.log" "registered"
metrics=$(grep -o 'http://127\.0\.0\.1:[0-9]*/metrics' "$work/agent.log" | head -1)

cat >"$work/ok.yaml" <<'YAML'
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: smoke-ok}
spec:
  tasks:
    - name: main
      command: [sh, -c, 'echo "hello from $GPUFLEET_TASK_ID on $CUDA_VISIBLE_DEVICES as $(id -u) in $(pwd)"']
      resources: {gpus: {count: 2}}
YAML
cat >"$work/bad.yaml" <<'YAML'
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: smoke-bad}
spec:
  tasks:
    - name: main
      command: [sh, -c, 'exit 3']
      resources: {gpus: {count: 1}}
YAML
"$gpufleet" submit -f "$work/ok.yaml" >/dev/null || fail "submit ok.yaml"
"$gpufleet" submit -f "$work/bad.yaml" >/dev/null || fail "submit bad.yaml"

for _ in $(seq 300); do
  "$gpufleet" get jobs >"$work/jobs" 2>/dev/null || true
  grep -q "smoke-ok .*Succeeded" "$work/jobs" && grep -q "smoke-bad .*Failed" "$work/jobs" && break
  sleep 0.1
done
grep -q "smoke-ok .*Succeeded" "$work/jobs" || fail "smoke-ok did not succeed: $(cat "$work/jobs")"
grep -q "smoke-bad .*Failed" "$work/jobs" || fail "smoke-bad did not fail: $(cat "$work/jobs")"
"$gpufleet" describe job smoke-bad >"$work/describe" || fail "describe job"
grep -q "exited with code 3" "$work/describe" || fail "no exit code in: $(cat "$work/describe")"

log=$(ls "$work"/agent/logs/smoke-ok_main-0_1.log) || fail "no task log"
grep -q "hello from smoke-ok/main-0/1 on GPU-" "$log" || fail "task log: $(cat "$log")"
# An agent running as root runs each run's tasks as a user of the run's own, in a directory of the
# run's own, unless told otherwise (--run-as); its logs are its alone.
if [ "$(id -u)" -eq 0 ]; then
  task_uid=$(sed -n 's/.* as \([0-9]*\) in .*/\1/p' "$log")
  [ -n "$task_uid" ] && [ "$task_uid" -ge "$uid_first" ] && [ "$task_uid" -le "$uid_last" ] ||
    fail "a root agent's task ran as: $(cat "$log")"
  grep -q " in $work/agent/runs/smoke-ok%1.run/work$" "$log" ||
    fail "the task did not start in its run's directory: $(cat "$log")"
  [ "$(stat -c %a "$work/agent/logs")" = 700 ] ||
    fail "logs/ is $(stat -c %a "$work/agent/logs"), not 700"
  [ "$(stat -c %a "$log")" = 600 ] || fail "$log is $(stat -c %a "$log"), not 600"
fi

# One server per data directory: a second one refuses to start and names the first.
if "$gpufleet" server --data-dir "$work/server" --listen 127.0.0.1:0 >"$work/second.log" 2>&1; then
  fail "a second server started on the same data directory"
fi
grep -q "is in use by process $server_pid" "$work/second.log" ||
  fail "the second server did not name the first: $(cat "$work/second.log")"

# A cancelled job that takes 1.5 s to exit after SIGTERM (it writes a checkpoint) keeps its GPUs
# until it has exited: the next job on them starts only then. Each task writes START/END with
# its GPUs to a ledger; the order in the ledger is the physical truth.
ledger="$work/ledger"
# The tasks run as users of their own when this script runs as root: they need to write the ledger.
: >"$ledger"
chmod 666 "$ledger"
cat >"$work/slow.yaml" <<YAML
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: smoke-slow}
spec:
  tasks:
    - name: main
      command: [sh, -c, 'echo "START \$GPUFLEET_JOB \$CUDA_VISIBLE_DEVICES" >>$ledger; trap "sleep 1.5; echo END \$GPUFLEET_JOB >>$ledger; exit 0" TERM; while :; do sleep 0.1; done']
      resources: {gpus: {count: 4}}
YAML
sed 's/smoke-slow/smoke-next/' "$work/slow.yaml" >"$work/next.yaml"
"$gpufleet" submit -f "$work/slow.yaml" >/dev/null || fail "submit slow.yaml"
wait_for "$ledger" "START smoke-slow"
"$gpufleet" submit -f "$work/next.yaml" >/dev/null || fail "submit next.yaml"
"$gpufleet" cancel smoke-slow >/dev/null || fail "cancel smoke-slow"
"$gpufleet" describe job smoke-slow >"$work/describe-slow" || fail "describe smoke-slow"
grep -q "Stopping" "$work/describe-slow" || fail "not Stopping: $(cat "$work/describe-slow")"
wait_for "$ledger" "START smoke-next"
sed -n '1,3p' "$ledger" | tr '\n' ';' >"$work/order"
grep -q "^START smoke-slow GPU-[^;]*;END smoke-slow;START smoke-next GPU-" "$work/order" ||
  fail "the next job started beside the stopping one: $(cat "$ledger")"
"$gpufleet" cancel smoke-next >/dev/null || fail "cancel smoke-next"

curl -sf "$metrics" >"$work/metrics" || fail "no agent metrics"
[ "$(grep -c '^DCGM_FI_DEV_GPU_UTIL{' "$work/metrics")" -eq 4 ] || fail "expected 4 GPU_UTIL series"
"$gpufleet" describe node smoke-node >"$work/node" || fail "describe node"
grep -q "gpufleet.io/driver-version=" "$work/node" || fail "no driver label"
echo "agent_smoke: ok"
