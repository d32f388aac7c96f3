#!/usr/bin/env bash
# `gpufleet admin backup` and `restore` on a server's SQLite store (docs/operations.md, "Back up and
# restore"): a backup taken while the server runs; a restore refused while it runs, naming its pid;
# after the server stops, the restore brings back the state of the backup (a job submitted after
# it is gone), which a restarted server serves. Usage: admin_backup.sh PATH/TO/gpufleet.
set -euo pipefail

gpufleet=$1
work=$(mktemp -d)
server_pid=
cleanup() {
  kill -TERM $server_pid 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "admin_backup: $*" >&2
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
start_server() {  # start_server LOG
  "$gpufleet" server --data-dir "$work/data" --listen 127.0.0.1:0 --cycle-interval-ms 200 \
    --admin-token-file "$work/admin-token" >"$work/$1" 2>&1 &
  server_pid=$!
  wait_for "$work/$1" "listening on"
  GPUFLEET_ADDR=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/$1" | head -1)
  export GPUFLEET_ADDR
}
job() {  # job NAME: a one-GPU job spec file
  cat >"$work/$1.yaml" <<YAML
apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: $1}
spec:
  tasks:
    - name: main
      command: [sleep, "1"]
      resources:
        gpus: {count: 1}
YAML
  echo "$work/$1.yaml"
}

echo "backup-admin-token-0123456789" >"$work/admin-token"
export GPUFLEET_TOKEN=backup-admin-token-0123456789
start_server server-1.log
"$gpufleet" submit -f "$(job before-backup)" >>"$work/submit.log" 2>&1 || fail "cannot submit"

"$gpufleet" admin backup --data-dir "$work/data" "$work/backup.db" >"$work/backup.log" 2>&1 ||
  fail "backup while the server runs failed"
grep -q "backed up $work/data/gpufleet.db to $work/backup.db" "$work/backup.log" ||
  fail "backup said: $(cat "$work/backup.log")"
"$gpufleet" submit -f "$(job after-backup)" >>"$work/submit.log" 2>&1 || fail "cannot submit"

if "$gpufleet" admin restore --data-dir "$work/data" "$work/backup.db" >"$work/refused.log" 2>&1; then
  fail "restore over a running server's store was not refused"
fi
grep -q "in use by process $server_pid" "$work/refused.log" ||
  fail "the refusal does not name the server: $(cat "$work/refused.log")"

kill -TERM $server_pid
wait $server_pid || true
"$gpufleet" admin restore --data-dir "$work/data" "$work/backup.db" >"$work/restore.log" 2>&1 ||
  fail "restore failed"

start_server server-2.log
"$gpufleet" get job before-backup >/dev/null || fail "before-backup is missing after the restore"
if "$gpufleet" get job after-backup >/dev/null 2>&1; then
  fail "after-backup came back, but it was submitted after the backup"
fi
echo "admin backup ok"
