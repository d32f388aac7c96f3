#!/usr/bin/env bash
# The fault-injection harness (issue 14): the real `gpufleet server` and three real `gpufleet
# agent`s (simulated GPUs, process runner) on loopback, each agent behind a proxy the harness can
# cut. A seeded workload of single-GPU jobs and 2-task gangs whose tasks write START/END with
# their GPU UUIDs to a ledger and take 0.8 s to exit after SIGTERM, under a seeded schedule of
# faults: cancels, preemption and idle-reclaim storms, agent SIGKILL and restart, an agent killed and left dead
# past its lease and stop grace (its tasks must stop themselves), an agent cut off for longer than
# its lease, server SIGKILL and restart, an agent registering again with a GPU fewer, slow
# clients, oversized submissions. Then every job is cancelled and drained, and check_ledger.py checks the
# invariants from the ledger. With RUNNER podman the agents run `--runner podman` and every task
# is a container (a busybox image the harness imports; CDI devices for the simulated GPUs that
# also mount the ledger), so the checks hold for containers: stopped, fenced and adopted as
# the units that hold GPUs. Needs root, podman and busybox-static for that; exits 77 without.
# Usage: chaos.sh PATH/TO/gpufleet [SEED] [FAULT_SECONDS] [RUNNER]
set -euo pipefail

gpufleet=$1
seed=${2:-14}
fault_seconds=${3:-60}
runner=${4:-process}
here=$(cd "$(dirname "$0")" && pwd)
if [ "$runner" = podman ] && { [ "$(id -u)" -ne 0 ] || ! command -v podman >/dev/null ||
  [ ! -x /bin/busybox ]; }; then
  echo "chaos: RUNNER podman needs root, podman and busybox-static; skipped"
  exit 77
fi
work=$(mktemp -d)
# The ledger has a directory of its own: containers mount it, and nothing else of $work.
mkdir "$work/ledger-dir"
ledger="$work/ledger-dir/ledger"
: >"$ledger"
# The agents run as root here, so each run's tasks run as a user of their own: let them write the
# ledger. Each agent takes uids no other agent of this machine (another test's included) takes.
chmod 755 "$work" "$work/ledger-dir"
uid_base=$((2001000000 + ($$ % 100000) * 64))
chmod 666 "$ledger"
# Where a task writes the ledger, and how it reads a clock with sub-second resolution (busybox's
# date has no %N; in a container /proc/uptime is the host's, the same for every task).
task_ledger=$ledger
clock='date +%s.%N'
cdi_spec=
# The node lease and the stop graces. Every podman command takes 0.3 s on an idle machine and
# several seconds on a busy one; the agent runs none in its loop (docs/containers.md), so
# containers get the same 4 s lease, but longer stop graces and gang window: a stop is a
# `podman kill` and its end is seen at a `podman ps`.
lease_s=4
server_grace_s=6
agent_grace_s=3
# A gang part-started for the server's gang start timeout (8 s) is stopped within a heartbeat,
# the 0.8 s its tasks take to exit and a cycle (with podman: its commands too).
gang_timeout_s=8
gang_window_s=12
if [ "$runner" = podman ]; then
  task_ledger=/chaos/ledger
  clock='cut -d\  -f1 /proc/uptime'
  cdi_spec=/var/run/cdi/gpufleet-chaos-$$.yaml
  server_grace_s=12
  agent_grace_s=5
  gang_window_s=20
fi
# CHAOS_LEASE_S overrides the lease.
lease_s=${CHAOS_LEASE_S:-$lease_s}
: >"$work/acked"
: >"$work/faults"
RANDOM=$seed
pids=()
server_pid=
declare -A agent_pid proxy_pid
cleanup() {
  kill -KILL "${pids[@]}" $server_pid "${agent_pid[@]}" "${proxy_pid[@]}" 2>/dev/null || true
  # Tasks the agents left behind (their shims lead their own process groups).
  pkill -KILL -f "$ledger" 2>/dev/null || true
  if [ "$runner" = podman ]; then
    "$work/podman" rm --all --force --time 0 >/dev/null 2>&1 || true
    "$work/podman" rmi --all --force >/dev/null 2>&1 || true
    rm -f "$cdi_spec"
  fi
  wait 2>/dev/null || true
  [ -n "${KEEP_CHAOS_DIR:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "chaos: $*" >&2
  tail -n 30 "$work"/*.log >&2 || true
  exit 1
}
wait_for() {  # wait_for FILE PATTERN
  for _ in $(seq 300); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "timed out waiting for '$2' in $1"
}

runner_flags=(--runner process)
if [ "$runner" = podman ]; then
  # podman with the harness's own storage, shared by the three agents; the image is a busybox
  # rootfs imported here, so no task pulls.
  printf '[containers]\ndefault_ulimits = []\n' >"$work/containers.conf"
  export CONTAINERS_CONF=$work/containers.conf
  cat >"$work/podman" <<SH
#!/bin/sh
exec podman --root "$work/storage" --runroot "$work/run" --tmpdir "$work/tmp" \\
  --storage-driver vfs "\$@"
SH
  chmod 755 "$work/podman"
  mkdir -p "$work/tmp" "$work/rootfs/bin"
  cp /bin/busybox "$work/rootfs/bin/"
  for applet in sh echo sleep cut cat; do ln -sf busybox "$work/rootfs/bin/$applet"; done
  tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
  "$work/podman" import "$work/rootfs.tar" localhost/chaos-tiny:1 >/dev/null 2>&1 ||
    fail "cannot import the task image"
  runner_flags=(--runner podman --podman "$work/podman")
fi

port=$(python3 "$here/restartable_port.py")  # the server is killed and started again on it
echo "chaos-admin-token-0123456789" >"$work/admin-token"
start_server() {
  "$gpufleet" server --data-dir "$work/server" --listen "127.0.0.1:$port" --cycle-interval-ms 200 \
    --heartbeat-interval-ms 500 --node-timeout-s "$lease_s" --stop-grace-s "$server_grace_s" \
    --min-runtime-before-preemption-s 1 --gang-start-timeout-s "$gang_timeout_s" \
    --idle-reclaim --idle-reclaim-threshold-pct 100 --idle-reclaim-after-s 3 \
    --idle-reclaim-warning-s 1 --idle-reclaim-action preempt \
    --admin-token-file "$work/admin-token" >>"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  fail "the server did not start"
}
start_server
export GPUFLEET_ADDR=http://127.0.0.1:$port GPUFLEET_TOKEN=chaos-admin-token-0123456789
"$gpufleet" create token --role agent --name chaos-agents >"$work/token.out" || fail "create token"
sed -n 's/^token (shown once, keep it): \([0-9a-f]*\)$/\1/p' "$work/token.out" >"$work/join-token"

start_agent() {  # start_agent N GPUS
  "$gpufleet" agent --server "http://127.0.0.1:$(cat "$work/proxy-$1.port")" \
    --token-file "$work/join-token" --node-name "chaos-$1" --topology leaf=leaf-0 \
    --backend simulated --simulated-gpus "$2" "${runner_flags[@]}" --state-dir "$work/agent-$1" \
    --metrics-listen 127.0.0.1:0 --stop-grace-s "$agent_grace_s" \
    --task-uid-range "$((uid_base + $1 * 16))-$((uid_base + $1 * 16 + 15))" \
    >>"$work/agent-$1.log" 2>&1 &
  agent_pid[$1]=$!
}
for n in 0 1 2; do
  python3 "$here/cut_proxy.py" "$work/proxy-$n.port" "$port" "$work/cut-$n" &
  proxy_pid[$n]=$!
  for _ in $(seq 50); do [ -s "$work/proxy-$n.port" ] && break; sleep 0.1; done
  start_agent "$n" 2
done
for n in 0 1 2; do wait_for "$work/agent-$n.log" "registered"; done
if [ "$runner" = podman ]; then
  # A CDI device per simulated GPU (agents keep their GPUs' UUIDs across restarts); the spec's
  # own edits mount the ledger's directory in every container that holds a GPU.
  mkdir -p /var/run/cdi
  # A run killed before its cleanup leaves its spec, naming the same simulated GPUs: podman then
  # refuses every device as ambiguous. Specs of harnesses no longer running go first.
  for stale in /var/run/cdi/gpufleet-chaos-*.yaml; do
    [ -e "$stale" ] || continue
    owner=${stale##*/gpufleet-chaos-}
    owner=${owner%.yaml}
    kill -0 "$owner" 2>/dev/null || rm -f "$stale"
  done
  {
    echo 'cdiVersion: "0.5.0"'
    echo 'kind: nvidia.com/gpu'
    echo 'containerEdits:'
    echo '  mounts:'
    echo "  - {hostPath: $work/ledger-dir, containerPath: /chaos, options: [rw, bind]}"
    echo 'devices:'
    for n in 0 1 2; do
      "$gpufleet" get node "chaos-$n" -o json |
        python3 -c 'import json, sys; [print(g["uuid"]) for g in json.load(sys.stdin)["gpus"]]'
    done | while read -r uuid; do
      echo "- name: $uuid"
      echo '  containerEdits: {env: [GPUFLEET_CHAOS_DEVICE=1]}'
    done
  } >"$cdi_spec"
  grep -q -- '- name: GPU-' "$cdi_spec" || fail "no GPUs for the CDI spec"
fi

submit() {  # submit NAME REPLICAS SECONDS [PRIORITY [KIND]]
  local ticks=$(($3 * 10)) image=
  [ "$runner" = podman ] && image="image: localhost/chaos-tiny:1"
  cat >"$work/$1.yaml" <<YAML
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: $1}
spec:
  kind: ${5:-batch}
  priority: ${4:-0}
  tasks:
    - name: main
      replicas: $2
      $image
      command: [sh, -c, 'L=$task_ledger; id=\$GPUFLEET_TASK_ID; echo "START \$id \$($clock) \${CUDA_VISIBLE_DEVICES:--}" >>\$L; trap "sleep 0.8; echo END \$id \\\$($clock) >>\$L; exit 0" TERM; i=0; while [ \$i -lt $ticks ]; do sleep 0.1; i=\$((i+1)); done; echo "END \$id \$($clock)" >>\$L']
      resources: {gpus: {count: 1}}
YAML
  if "$gpufleet" submit -f "$work/$1.yaml" >/dev/null 2>>"$work/submit.log"; then
    echo "$1" >>"$work/acked"
  fi
}

fault() { echo "$*" >>"$work/faults"; }
slow_clients() {  # 8 connections that send a header line every second for 5 s
  python3 - "$port" <<'PY' &
import socket, sys, threading, time
def slow():
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
        s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")
        for i in range(5):
            time.sleep(1)
            s.sendall(b"X-Slow-%d: 1\r\n" % i)
        s.close()
    except OSError:
        pass
threads = [threading.Thread(target=slow) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
PY
  pids+=($!)
}

job=0
deadline=$((SECONDS + fault_seconds))
while [ $SECONDS -lt $deadline ]; do
  for _ in 1 2; do
    replicas=$((RANDOM % 3 == 0 ? 2 : 1))
    # One job in five runs 20 s: long enough to be running when its agent is cut off or dies.
    seconds=$((RANDOM % 5 == 0 ? 20 : 1 + RANDOM % 4))
    submit "chaos-$job" "$replicas" "$seconds"
    job=$((job + 1))
  done
  case $((RANDOM % 11)) in
    0 | 1)
      victim=$(shuf -n 1 --random-source=<(yes "$RANDOM") "$work/acked" 2>/dev/null || true)
      if [ -n "$victim" ]; then
        "$gpufleet" cancel "$victim" >/dev/null 2>&1 || true
        fault cancel "$victim"
      fi
      ;;
    2)
      n=$((RANDOM % 3))
      kill -KILL "${agent_pid[$n]}" 2>/dev/null || true
      wait "${agent_pid[$n]}" 2>/dev/null || true
      fault agent-kill "chaos-$n"
      sleep 1
      start_agent "$n" 2
      ;;
    3)
      n=$((RANDOM % 3))
      touch "$work/cut-$n"
      fault cut "chaos-$n"
      sleep $((lease_s + 3))
      rm -f "$work/cut-$n"
      ;;
    4)
      kill -KILL "$server_pid" 2>/dev/null || true
      wait "$server_pid" 2>/dev/null || true
      fault server-kill
      start_server
      ;;
    5)
      n=$((RANDOM % 3))
      kill -TERM "${agent_pid[$n]}" 2>/dev/null || true
      wait "${agent_pid[$n]}" 2>/dev/null || true
      start_agent "$n" 1
      fault gpu-fewer "chaos-$n"
      sleep 2
      kill -TERM "${agent_pid[$n]}" 2>/dev/null || true
      wait "${agent_pid[$n]}" 2>/dev/null || true
      start_agent "$n" 2
      ;;
    6)
      slow_clients
      fault slow-clients
      ;;
    7)
      cat >"$work/big.yaml" <<'YAML'
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: chaos-oversized}
spec:
  tasks:
    - name: web
      command: [serve]
      replicas: 20000
      resources: {cpu: 100m, memory: 64Mi}
YAML
      if "$gpufleet" submit -f "$work/big.yaml" >/dev/null 2>&1; then
        fail "an oversized submission was accepted"
      fi
      fault oversized
      ;;
    8)
      # The agent of a node that runs a 30 s task dies and stays dead.
      long="chaos-$job"
      job=$((job + 1))
      submit "$long" 1 30 50
      node=
      for _ in $(seq 50); do
        node=$(curl -sf -H "Authorization: Bearer $GPUFLEET_TOKEN" "$GPUFLEET_ADDR/v1/jobs/$long" |
          python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["placements"][0]["node"] if j["state"]=="Running" else "")' 2>/dev/null || true)
        [ -n "$node" ] && break
        sleep 0.1
      done
      n=${node#chaos-}
      [ -n "$n" ] || n=$((RANDOM % 3))
      kill -KILL "${agent_pid[$n]}" 2>/dev/null || true
      wait "${agent_pid[$n]}" 2>/dev/null || true
      fault agent-dead "chaos-$n"
      # Past the node's lease and stop grace: the server frees its GPUs and places its jobs
      # again, so its tasks must have stopped themselves by then.
      sleep $((lease_s + server_grace_s + 2))
      start_agent "$n" 2
      ;;
    9)
      # A preemption storm: high-priority jobs for every GPU, so running jobs are preempted
      # (through Stopping) and requeued behind them.
      for _ in 1 2 3; do
        submit "chaos-$job" 2 2 100
        job=$((job + 1))
      done
      fault preempt-storm
      ;;
    10)
      # An idle-reclaim storm: interactive jobs, idle by the server's measure (under 100%), are
      # warned and then preempted for the jobs that wait.
      for _ in 1 2 3; do
        submit "chaos-$job" 1 20 0 interactive
        job=$((job + 1))
      done
      fault idle-reclaim-storm
      ;;
  esac
  sleep 1
done

# Drain: everything cancelled, every task ended, every job in a final state.
for n in 0 1 2; do rm -f "$work/cut-$n"; done
for name in $(cat "$work/acked"); do "$gpufleet" cancel "$name" >/dev/null 2>&1 || true; done
for _ in $(seq 120); do
  curl -sf -H "Authorization: Bearer $GPUFLEET_TOKEN" "$GPUFLEET_ADDR/v1/jobs" >"$work/jobs.json" || true
  if python3 -c 'import json,sys; sys.exit(any(j["state"] not in ("Succeeded","Failed","Cancelled") for j in json.load(open(sys.argv[1]))["items"]))' "$work/jobs.json" 2>/dev/null; then
    break
  fi
  sleep 0.5
done
sleep 1  # the last ENDs reach the ledger
# Self-fencings: an agent that could not renew its lease in time stopped its own tasks.
for n in 0 1 2; do
  echo "chaos: agent chaos-$n fenced itself $(grep -c 'lease expired' "$work/agent-$n.log" || true) times"
done
python3 "$here/check_ledger.py" "$ledger" "$work/jobs.json" "$work/acked" "$work/faults" \
  "$gang_window_s" ||
  fail "invariants violated (seed $seed)"
