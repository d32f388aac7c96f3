#!/usr/bin/env bash
# The Grafana dashboard (deploy/grafana/gpufleet-control-plane.json) against real series: Debian's
# Prometheus scrapes `gpufleet dev` (the server's /metrics with a bearer token as job
# gpufleet-server, the simulated fleet's dcgm-exporter /metrics as job gpufleet-agent), and every
# query of every panel must evaluate and return series, every metric it names must exist. A
# renamed metric or a typo in a query fails here. Usage: grafana_dashboard.sh PATH/TO/gpufleet
# DASHBOARD.json. Bounded: about 40 s.
set -euo pipefail

gpufleet=$1
dashboard=$2
work=$(mktemp -d)
dev_pid=""
prom_pid=""
cleanup() {
  for pid in $prom_pid $dev_pid; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  sleep 0.5
  for pid in $prom_pid $dev_pid; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "grafana_dashboard: $*" >&2
  tail -20 "$work/dev.log" "$work/prometheus.log" >&2 2>/dev/null || true
  exit 1
}

command -v prometheus >/dev/null || fail "prometheus is not installed (scripts/setup installs it)"

"$gpufleet" dev --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --nodes 4 --leaves 2 \
  --playback-minutes 0.5 --heartbeat-ms 500 --run-seconds 120 --quiet \
  --data-dir "$work/data" >"$work/dev.log" 2>&1 &
dev_pid=$!
for _ in $(seq 200); do
  grep -q "^try: " "$work/dev.log" && break
  kill -0 "$dev_pid" 2>/dev/null || fail "gpufleet dev exited early"
  sleep 0.1
done
fleet=$(grep -o 'http://127\.0\.0\.1:[0-9]*/metrics (dcgm' "$work/dev.log" | cut -d/ -f3)
addr=$(sed -n 's/^try: GPUFLEET_ADDR=\([^ ]*\) .*/\1/p' "$work/dev.log")
token=$(sed -n 's/^try: .*GPUFLEET_TOKEN=\([^ ]*\) .*/\1/p' "$work/dev.log")
[ -n "$fleet" ] && [ -n "$addr" ] && [ -n "$token" ] || fail "no addresses printed"
printf '%s' "$token" >"$work/token"

# A job no node can hold stays pending, so that the pending-jobs panel has a series.
cat >"$work/wide.yaml" <<'EOF'
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: too-wide}
spec:
  tasks:
    - name: main
      command: [sleep, "60"]
      resources: {cpu: "1", memory: 1Gi, gpus: {count: 16}}
EOF
GPUFLEET_ADDR=$addr GPUFLEET_TOKEN=$token "$gpufleet" submit -f "$work/wide.yaml" \
  >"$work/submit" 2>&1 || fail "submit failed: $(cat "$work/submit")"

prom_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpufleet-server
    authorization:
      credentials_file: $work/token
    static_configs:
      - targets: ['${addr#http://}']
  - job_name: gpufleet-agent
    static_configs:
      - targets: ['$fleet']
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
prom="http://127.0.0.1:$prom_port"

# Both targets up, then enough samples for the rates (the queries' $__rate_interval is 15 s).
up=0
for _ in $(seq 150); do
  kill -0 "$prom_pid" 2>/dev/null || fail "prometheus exited"
  up=$(curl -sf "$prom/api/v1/query" --data-urlencode 'query=count(up == 1)' |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)' \
      2>/dev/null || echo 0)
  [ "$up" = "2" ] && break
  sleep 0.2
done
[ "$up" = "2" ] || fail "the two scrape targets are not up: $(curl -sf "$prom/api/v1/targets")"
sleep 12

python3 - "$dashboard" "$prom" <<'EOF' || fail "the dashboard's queries do not all return series"
import json, re, sys, urllib.parse, urllib.request

dashboard_path, prom = sys.argv[1], sys.argv[2]
dashboard = json.load(open(dashboard_path))
problems = []

def api(path, **params):
    url = f"{prom}/api/v1/{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)

ids = [p["id"] for p in dashboard["panels"]]
if len(ids) != len(set(ids)):
    problems.append(f"panel ids repeat: {ids}")
if dashboard.get("uid") != "gpufleet-control-plane":
    problems.append(f"uid {dashboard.get('uid')!r}")
if not any(v.get("name") == "datasource" and v.get("type") == "datasource"
           for v in dashboard["templating"]["list"]):
    problems.append("no datasource variable")

queries = 0
for panel in dashboard["panels"]:
    grid = panel.get("gridPos", {})
    if grid.get("x", -1) < 0 or grid.get("x", 0) + grid.get("w", 99) > 24:
        problems.append(f"panel {panel['title']!r}: gridPos {grid} leaves the 24 columns")
    if panel["type"] == "row":
        continue
    if panel.get("datasource", {}).get("uid") != "${datasource}":
        problems.append(f"panel {panel['title']!r}: datasource {panel.get('datasource')}")
    if not panel.get("targets"):
        problems.append(f"panel {panel['title']!r}: no query")
    for target in panel.get("targets", []):
        expr = target["expr"].replace("$__rate_interval", "15s")
        queries += 1
        answer = api("query", query=expr)
        result = answer.get("data", {}).get("result", [])
        if answer.get("status") != "success" or not result:
            problems.append(f"panel {panel['title']!r}: {expr} gave {answer.get('status')} "
                            f"with {len(result)} series")
        for name in sorted(set(re.findall(r"\b(?:gpufleet_[a-z_]+|DCGM_[A-Z_]+)\b", expr))):
            if not api("series", **{"match[]": name})["data"]:
                problems.append(f"panel {panel['title']!r}: no series named {name}")
        print(f"{panel['title']:32} {target['refId']}: {len(result)} series")

print(f"{queries} queries in {len(ids)} panels")
for problem in problems:
    print("problem:", problem, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
echo "grafana_dashboard: every query of the dashboard returns series"
