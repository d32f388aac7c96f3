#!/usr/bin/env bash
# Issue 14's acceptance check: the real `gpufleet server` with two real agents (simulated GPUs)
# on loopback, under CLIENTS slow clients for SECONDS (each sends one header line every 2 s and
# never finishes its request). /healthz must answer within MAX_LATENCY seconds throughout and
# both nodes stay Ready (heartbeats every second, a 4 s lease).
# Usage: slow_clients.sh PATH/TO/gpufleet [SECONDS] [CLIENTS] [MAX_LATENCY]
set -euo pipefail

gpufleet=$1
seconds=${2:-60}
clients=${3:-64}
max_latency=${4:-1}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "slow_clients: $*" >&2
  tail -n 20 "$work"/*.log >&2 || true
  exit 1
}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
token=slow-clients-admin-token-0123456789
echo "$token" >"$work/admin-token"
"$gpufleet" server --data-dir "$work/server" --listen "127.0.0.1:$port" --cycle-interval-ms 500 \
  --heartbeat-interval-ms 1000 --node-timeout-s 4 --stop-grace-s 2 \
  --admin-token-file "$work/admin-token" >"$work/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
export GPUFLEET_ADDR=http://127.0.0.1:$port GPUFLEET_TOKEN=$token
"$gpufleet" create token --role agent --name slow-clients >"$work/token.out" || fail "create token"
sed -n 's/^token (shown once, keep it): \([0-9a-f]*\)$/\1/p' "$work/token.out" >"$work/join-token"
for n in 0 1; do
  "$gpufleet" agent --server "http://127.0.0.1:$port" --token-file "$work/join-token" \
    --node-name "slow-$n" --backend simulated --simulated-gpus 2 --runner simulated \
    --state-dir "$work/agent-$n" --metrics-listen 127.0.0.1:0 >"$work/agent-$n.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do
  [ "$("$gpufleet" get nodes 2>/dev/null | grep -c Ready || true)" -ge 2 ] && break
  sleep 0.1
done
python3 "$here/slow_clients.py" --port "$port" --token "$token" --seconds "$seconds" \
  --clients "$clients" --max-latency "$max_latency" --nodes 2 || fail "the server starved"
