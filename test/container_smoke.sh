#!/usr/bin/env bash
# `gpufleet server` and a real `gpufleet agent --runner podman` (simulated GPUs, real containers):
# a job whose image the agent pulls from Debian's docker-registry on loopback runs to Succeeded in
# a container that sees exactly its GPUs (CDI devices the script writes for the simulated GPUs),
# and `describe job` shows the pull time, the digest and the events; a job whose registry never
# answers is Pulling while the agent goes on heartbeating, and a cancel ends it with no container
# ever made. Then podman is made slow (every command waits 1 s, as on a busy node) and eight
# containers start at once on a 4 s lease: the agent goes on heartbeating (it never fences itself,
# each task runs once) and no GPU is in two live containers (the tasks' own ledger says).
# Needs root (CDI specs live in /var/run/cdi), podman, runc, docker-registry and
# busybox-static (scripts/setup installs them); exits 77 (skipped) without them.
# Usage: container_smoke.sh PATH/TO/gpufleet.
set -euo pipefail

gpufleet=$1
if [ "$(id -u)" -ne 0 ] || ! command -v podman >/dev/null || [ ! -x /usr/bin/docker-registry ] ||
  [ ! -x /bin/busybox ]; then
  echo "container_smoke: needs root, podman, docker-registry and busybox-static; skipped"
  exit 77
fi
work=$(mktemp -d)
chmod 755 "$work"
server_pid=
agent_pid=
registry_pid=
silent_pid=
cdi_spec=/var/run/cdi/gpufleet-container-smoke-$$.yaml
cleanup() {
  kill -TERM $agent_pid $server_pid $registry_pid $silent_pid 2>/dev/null || true
  wait 2>/dev/null || true
  "$work/podman" rm --all --force >/dev/null 2>&1 || true
  "$work/podman" rmi --all --force >/dev/null 2>&1 || true
  rm -f "$cdi_spec"
  # A process podman started may still be writing under it for a moment: try again once, and
  # never let the cleanup turn a verdict already given into a failure.
  rm -rf "$work" 2>/dev/null || { sleep 1; rm -rf "$work" 2>/dev/null; } || true
}
trap cleanup EXIT
fail() {
  echo "container_smoke: $*" >&2
  tail -n 40 "$work"/*.log >&2 || true
  exit 1
}
wait_for() { # wait_for FILE PATTERN
  for _ in $(seq 300); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "timed out waiting for '$2' in $1"
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# podman with the script's own storage: the agent runs it through --podman.
cat >"$work/containers.conf" <<'CONF'
[containers]
default_ulimits = []
CONF
export CONTAINERS_CONF=$work/containers.conf
cat >"$work/podman" <<SH
#!/bin/sh
# While \$work/slow holds a number, every podman command waits that many seconds first.
if [ -s "$work/slow" ]; then sleep "\$(cat "$work/slow")"; fi
exec podman --root "$work/storage" --runroot "$work/run" --tmpdir "$work/tmp" \
  --storage-driver vfs "\$@"
SH
chmod 755 "$work/podman"
mkdir -p "$work/tmp" "$work/rootfs/bin"

# The image: a busybox-static rootfs, pushed to a registry on loopback, then removed here so that
# the agent must pull it.
cp /bin/busybox "$work/rootfs/bin/"
for applet in sh echo cat ls sleep; do ln -sf busybox "$work/rootfs/bin/$applet"; done
tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
"$work/podman" import "$work/rootfs.tar" localhost/smoke-tiny:1 >/dev/null
port=$(free_port)
cat >"$work/registry.yml" <<YAML
version: 0.1
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: 127.0.0.1:$port}
YAML
/usr/bin/docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
image=127.0.0.1:$port/smoke/tiny:1
for _ in $(seq 100); do
  "$work/podman" push --tls-verify=false localhost/smoke-tiny:1 "$image" >/dev/null 2>&1 && break
  sleep 0.1
done
grep -q 'PUT /v2/smoke/tiny/manifests/1' "$work/registry.log" || fail "cannot push to the registry"
"$work/podman" rmi --all --force >/dev/null

# A registry that takes connections and never answers: pulls from it hang.
silent_port=$(free_port)
python3 -c "
import socket, time
s = socket.socket(); s.bind(('127.0.0.1', $silent_port)); s.listen(64)
time.sleep(600)" &
silent_pid=$!

echo "container-smoke-admin-token-0123456789" >"$work/admin-token"
"$gpufleet" server --data-dir "$work/server" --listen 127.0.0.1:0 --cycle-interval-ms 200 \
  --heartbeat-interval-ms 500 --node-timeout-s 4 --stop-grace-s 4 --admin-token-file "$work/admin-token" >"$work/server.log" 2>&1 &
server_pid=$!
wait_for "$work/server.log" "listening on"
addr=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/server.log" | head -1)
export GPUFLEET_ADDR=$addr GPUFLEET_TOKEN=container-smoke-admin-token-0123456789
"$gpufleet" create token --role agent --name smoke-agent >"$work/token.json" ||
  fail "cannot create an agent token"
sed -n 's/^token (shown once, keep it): \([0-9a-f]*\)$/\1/p' "$work/token.json" >"$work/agent-token"

"$gpufleet" agent --server "$addr" --token-file "$work/agent-token" --node-name box \
  --topology leaf=leaf-0 --backend simulated --simulated-gpus 8 --runner podman \
  --podman "$work/podman" --podman-insecure-registry "127.0.0.1:$port" \
  --podman-insecure-registry "127.0.0.1:$silent_port" \
  --state-dir "$work/agent" --stop-grace-s 2 --metrics-listen 127.0.0.1:0 \
  --task-uid-range "$((2001000000 + ($$ % 100000) * 64))-$((2001000000 + ($$ % 100000) * 64 + 63))" \
  >"$work/agent.log" 2>&1 &
agent_pid=$!
wait_for "$work/agent.log" "registered"

# A CDI device for each simulated GPU: a file holding its UUID, seen in the container at
# /dev/gpufleet/UUID, so that what the container holds is visible from inside it.
"$gpufleet" get node box -o json >"$work/node.json"
mapfile -t uuids < <(python3 -c "
import json, sys
for gpu in json.load(open(sys.argv[1]))['gpus']: print(gpu['uuid'])" "$work/node.json")
[ "${#uuids[@]}" -eq 8 ] || fail "expected 8 GPUs: $(cat "$work/node.json")"
mkdir -p /var/run/cdi "$work/devices" "$work/ledger-dir"
: >"$work/ledger-dir/ledger"
{
  echo 'cdiVersion: "0.5.0"'
  echo 'kind: nvidia.com/gpu'
  echo 'containerEdits:'
  echo '  mounts:'
  echo "  - {hostPath: $work/ledger-dir, containerPath: /smoke, options: [rw, bind]}"
  echo 'devices:'
  for uuid in "${uuids[@]}"; do
    echo "$uuid" >"$work/devices/$uuid"
    echo "- name: $uuid"
    echo "  containerEdits:"
    echo "    mounts:"
    echo "    - {hostPath: $work/devices/$uuid, containerPath: /dev/gpufleet/$uuid, options: [ro, bind]}"
  done
} >"$cdi_spec"

cat >"$work/boxed.yaml" <<YAML
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: boxed}
spec:
  tasks:
    - name: main
      image: $image
      command: [sh, -c, 'echo "in a container with \$(ls /dev/gpufleet) as \$CUDA_VISIBLE_DEVICES"']
      resources: {gpus: {count: 1}}
YAML
"$gpufleet" submit -f "$work/boxed.yaml" >/dev/null || fail "submit boxed.yaml"
for _ in $(seq 600); do
  "$gpufleet" get jobs >"$work/jobs" 2>/dev/null || true
  grep -q "boxed .*\(Succeeded\|Failed\)" "$work/jobs" && break
  sleep 0.1
done
"$gpufleet" describe job boxed >"$work/describe" || fail "describe job"
grep -q "boxed .*Succeeded" "$work/jobs" || fail "boxed did not succeed: $(cat "$work/describe")"
# A finished job keeps no placements: its events say what was pulled, at which digest, how fast.
grep -q "task main-0 pulled $image (sha256:[0-9a-f]\{64\}) in [0-9.]* s on box" "$work/describe" ||
  fail "no pull event with the digest and the time: $(cat "$work/describe")"
log=$work/agent/logs/boxed_main-0_1.log
uuid=$(grep -o 'as GPU-[0-9a-f-]*' "$log" | cut -c4-) || fail "task log: $(cat "$log")"
grep -q "in a container with $uuid as $uuid$" "$log" ||
  fail "the container did not see exactly its GPU: $(cat "$log")"
grep -q 'GET /v2/smoke/tiny/manifests/1' "$work/registry.log" || fail "the registry served no pull"
# The provenance record of the run names the image and the digest the container ran.
grep -q "^  main-0 .*$image .*sha256:" "$work/describe" ||
  fail "no provenance record with the digest: $(cat "$work/describe")"

# A pull that hangs: the job shows Pulling, the agent keeps heartbeating (the node stays Ready
# past its lease), and a cancel ends the pull without a container.
sed -e "s/name: boxed/name: hanging/" -e "s|$image|127.0.0.1:$silent_port/smoke/tiny:1|" \
  "$work/boxed.yaml" >"$work/hanging.yaml"
"$gpufleet" submit -f "$work/hanging.yaml" >/dev/null || fail "submit hanging.yaml"
for _ in $(seq 300); do
  "$gpufleet" describe job hanging >"$work/describe-hanging" 2>/dev/null || true
  grep -q "main-0 pulling: " "$work/describe-hanging" && break
  sleep 0.1
done
grep -q "main-0 .*Pulling" "$work/describe-hanging" || fail "not Pulling: $(cat "$work/describe-hanging")"
grep -q "task main-0 pulling 127.0.0.1:$silent_port/smoke/tiny:1 on box" "$work/describe-hanging" ||
  fail "no pulling event: $(cat "$work/describe-hanging")"
sleep 3 # six heartbeat intervals: a pull that blocked the agent would leave the node silent
"$gpufleet" get nodes >"$work/nodes"
grep -q "box .*Ready" "$work/nodes" || fail "the node is not Ready while pulling: $(cat "$work/nodes")"
"$gpufleet" cancel hanging >/dev/null || fail "cancel hanging"
for _ in $(seq 300); do
  "$gpufleet" get jobs >"$work/jobs" 2>/dev/null || true
  grep -q "hanging .*Cancelled" "$work/jobs" && break
  sleep 0.1
done
grep -q "hanging .*Cancelled" "$work/jobs" || fail "hanging was not cancelled: $(cat "$work/jobs")"
"$work/podman" ps --all --format '{{.Names}}' >"$work/containers"
if grep -q hanging "$work/containers"; then
  fail "a container was made for the cancelled pull: $(cat "$work/containers")"
fi
# podman slowed down: eight containers start at once, each podman command taking 1 s. Each
# task writes START and END with its GPU to the ledger and runs 0.5 s.
echo 1 >"$work/slow"
: >"$work/acked"
for n in 0 1 2 3 4 5 6 7; do
  cat >"$work/slow-$n.yaml" <<YAML
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: slow-$n}
spec:
  tasks:
    - name: main
      image: $image
      imagePullPolicy: Never
      command: [sh, -c, 'echo "START \$GPUFLEET_TASK_ID \$(cut -d" " -f1 /proc/uptime) \$CUDA_VISIBLE_DEVICES" >>/smoke/ledger; sleep 0.5; echo "END \$GPUFLEET_TASK_ID \$(cut -d" " -f1 /proc/uptime)" >>/smoke/ledger']
      resources: {gpus: {count: 1}}
YAML
  "$gpufleet" submit -f "$work/slow-$n.yaml" >/dev/null || fail "submit slow-$n.yaml"
  echo "slow-$n" >>"$work/acked"
done
for _ in $(seq 600); do
  "$gpufleet" get jobs >"$work/jobs" 2>/dev/null || true
  [ "$(grep -c "slow-.*\(Succeeded\|Failed\)" "$work/jobs")" -eq 8 ] && break
  sleep 0.1
done
rm -f "$work/slow"
[ "$(grep -c "slow-.*Succeeded" "$work/jobs")" -eq 8 ] ||
  fail "the slow-podman jobs did not all succeed: $(cat "$work/jobs")"
if grep -q "lease expired" "$work/agent.log"; then
  fail "the agent fenced itself while podman was slow: $(grep "lease expired" "$work/agent.log")"
fi
# Each task ran once (a self-fenced node's tasks would have run again as attempt 2).
[ "$(grep -c '^START slow-' "$work/ledger-dir/ledger")" -eq 8 ] ||
  fail "expected 8 starts: $(cat "$work/ledger-dir/ledger")"
curl -sf -H "Authorization: Bearer $GPUFLEET_TOKEN" "$GPUFLEET_ADDR/v1/jobs" >"$work/jobs.json" ||
  fail "cannot list the jobs"
: >"$work/faults"
python3 "$(dirname "$0")/chaos/check_ledger.py" "$work/ledger-dir/ledger" "$work/jobs.json" \
  "$work/acked" "$work/faults" 20 || fail "a GPU was in two live containers, or a job was lost"
echo "container_smoke: ok"
