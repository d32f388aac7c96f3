#!/usr/bin/env bash
# Real Slurm (Debian's slurm-wlm 22.05): munge with a key made here, MariaDB, slurmdbd, slurmctld
# and four slurmd (four "a100" GPUs each, backed by plain files) on loopback in a temporary
# directory, all stopped afterwards. Submits GPU jobs of the shapes a site has, reads sacct back
# and replays it: every job that ran is replayed, the skipped rows are counted, and each job's
# GPU count in the replay equals Slurm's. Runs as root (slurmd must). Usage: slurm_replay.sh
# GPUFLEET. Exit 77 (skipped) without Slurm, unless GPUFLEET_REQUIRE_SLURM=1.
set -euo pipefail

gpufleet=$(realpath "$1")
for tool in slurmctld slurmd slurmdbd munged mariadbd mariadb-install-db sbatch sacct python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "slurm_replay: $tool missing (scripts/setup --slurm installs it)"
    [ "${GPUFLEET_REQUIRE_SLURM:-0}" = 1 ] && exit 1
    exit 77
  fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "slurm_replay: needs root (slurmd)"
  [ "${GPUFLEET_REQUIRE_SLURM:-0}" = 1 ] && exit 1
  exit 77
fi

dir=$(mktemp -d /tmp/gpufleet-slurm.XXXXXX)
pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [ "$status" -ne 0 ]; then
    for log in "$dir"/*.log; do
      echo "=== $log"; tail -n 20 "$log" || true
    done
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_for() {  # wait_for SECONDS COMMAND...: polls until the command succeeds
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "slurm_replay: timed out waiting for: $*"; return 1
    fi
    sleep 0.5
  done
}

# munge, with a key of our own.
mkdir -p "$dir/munge"
chmod 755 "$dir" "$dir/munge"
head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munge_socket="$dir/munge/munge.socket"
munged --force --key-file="$dir/munge/munge.key" --socket="$munge_socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"
wait_for 20 test -S "$munge_socket"
pids+=("$(cat "$dir/munge/munged.pid")")

# MariaDB on a loopback port, a user for slurmdbd.
db_port=$(free_port)
mariadb-install-db --no-defaults --datadir="$dir/db" --user=root --auth-root-authentication-method=socket \
  >"$dir/mariadb-install.log" 2>&1
mariadbd --no-defaults --datadir="$dir/db" --user=root --bind-address=127.0.0.1 --port="$db_port" \
  --socket="$dir/mysql.sock" --pid-file="$dir/mariadb.pid" --log-error="$dir/mariadb.log" &
pids+=("$!")
wait_for 60 mariadb --no-defaults -S "$dir/mysql.sock" -uroot -e "SELECT 1"
mariadb --no-defaults -S "$dir/mysql.sock" -uroot -e \
  "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'gpufleet'; GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';"

dbd_port=$(free_port)
ctld_port=$(free_port)
mkdir -p "$dir/etc" "$dir/state" "$dir/spool"
for gpu in 0 1 2 3; do : >"$dir/gpu$gpu"; done
cat >"$dir/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$munge_socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
PidFile=$dir/slurmdbd.pid
LogFile=$dir/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=gpufleet
StorageLoc=gpufleet_acct
EOF
chmod 600 "$dir/etc/slurmdbd.conf"
cat >"$dir/etc/slurm.conf" <<EOF
ClusterName=gpufleet
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
AccountingStoragePass=$munge_socket
AccountingStorageTRES=gres/gpu,gres/gpu:a100
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
KillWait=2
OverTimeLimit=0
MinJobAge=2
SlurmdParameters=config_overrides
EOF
ports=()
for node in 1 2 3 4; do
  port=$(free_port)
  ports+=("$port")
  echo "NodeName=node$node NodeHostname=localhost NodeAddr=127.0.0.1 Port=$port CPUs=4 RealMemory=4000 Gres=gpu:a100:4" \
    >>"$dir/etc/slurm.conf"
done
echo "PartitionName=gpu Nodes=node[1-4] Default=YES MaxTime=INFINITE State=UP" >>"$dir/etc/slurm.conf"
echo "NodeName=node[1-4] Name=gpu Type=a100 File=$dir/gpu[0-3]" >"$dir/etc/gres.conf"
export SLURM_CONF="$dir/etc/slurm.conf"

slurmdbd -D >"$dir/slurmdbd.out.log" 2>&1 &
pids+=("$!")
wait_for 60 grep -q "slurmdbd version .* started" "$dir/slurmdbd.log"
sacctmgr -i add cluster gpufleet >/dev/null
slurmctld -D -i >"$dir/slurmctld.out.log" 2>&1 &
pids+=("$!")
wait_for 60 scontrol ping
for node in 1 2 3 4; do
  slurmd -D -N "node$node" >"$dir/slurmd.node$node.out.log" 2>&1 &
  pids+=("$!")
done
wait_for 60 bash -c '[ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" -eq 4 ]'

# Jobs of the shapes a site has. Each writes nothing: --output to /dev/null.
submit() { sbatch --parsable --output=/dev/null "$@"; }
typed=$(submit --gres=gpu:a100:1 --wrap "sleep 2")
untyped=$(submit --gres=gpu:2 --wrap "sleep 2")
multi=$(submit -N 2 --gres=gpu:a100:4 --wrap "srun sleep 2")
array=$(submit --array=1-3 --gres=gpu:1 --wrap "sleep 1")
cat >"$dir/het.sh" <<'EOF'
#!/bin/bash
#SBATCH --gres=gpu:a100:1
#SBATCH hetjob
#SBATCH --gres=gpu:2
sleep 2
EOF
het=$(submit "$dir/het.sh")
failing=$(submit --gres=gpu:1 --wrap "exit 3")
timeout=$(submit --gres=gpu:1 --time=1 --wrap "sleep 300")
running=$(submit --gres=gpu:1 --wrap "sleep 300")
held=$(submit --hold --gres=gpu:1 --wrap "sleep 1")
requeued=$(submit --requeue --gres=gpu:1 --wrap "sleep 4")
cpu_only=$(submit --wrap "sleep 1")
wait_for 60 bash -c "squeue -h -j $running -t R | grep -q ."
wait_for 60 bash -c "squeue -h -j $requeued -t R | grep -q ."
# Every GPU of the fleet while one is busy: pending (eligible, on resources), then cancelled.
blocked=$(submit -N 4 --gres=gpu:a100:4 --wrap "sleep 1")
wait_for 30 bash -c "squeue -h -j $blocked -t PD -o %r | grep -q Resources"
scancel "$blocked"
scancel "$running" "$held"
scontrol requeue "$requeued"
# Everything ends: the timeout takes its minute, the requeued job waits the 2 minutes Slurm
# holds a requeued job back.
wait_for 240 bash -c '[ -z "$(squeue -h)" ]'

format=JobID,JobIDRaw,Partition,Account,User,Submit,Eligible,Start,End,Elapsed,Timelimit,State,ExitCode,NNodes,NodeList,ReqTRES,AllocTRES
# slurmdbd writes asynchronously: wait until sacct shows every job ended.
wait_for 60 bash -c "[ \"\$(sacct -a -X -n -P -S 2000-01-01 -o End | grep -vc Unknown)\" -ge 13 ]"
sacct -a -P -S 2000-01-01 --format="$format" >"$dir/sacct.txt"
echo "--- sacct"; cat "$dir/sacct.txt"

"$gpufleet" sim replay "$dir/sacct.txt" --policy fifo --threads 1 --json "$dir/replay.json" \
  | tee "$dir/replay.out"

# The same history's failures: exit 3 is the job's own, the timeout a hang, the cancel none.
"$gpufleet" report failures --sacct "$dir/sacct.txt" | tee "$dir/failures.out"
grep -q "1 cancelled, 0 preempted, 1 the jobs' own errors .* 1 hangs (TIMEOUT)" "$dir/failures.out"

python3 - "$dir/sacct.txt" "$dir/replay.json" "$dir/replay.out" <<'EOF'
import json, re, sys
rows = [line.rstrip("\n").split("|") for line in open(sys.argv[1]) if line.strip()]
header, rows = rows[0], rows[1:]
col = {name: i for i, name in enumerate(header)}
expected = {}  # job (het components folded) -> GPUs, for the jobs that ran with GPUs
steps = 0
for row in rows:
    job_id = row[col["JobID"]]
    if "." in job_id:
        steps += 1
        continue
    start, end = row[col["Start"]], row[col["End"]]
    if start in ("Unknown", "None", "") or end in ("Unknown", "None", "") or start == end:
        continue
    gpus = 0
    for entry in row[col["AllocTRES"]].split(","):
        if entry.startswith("gres/gpu="):
            gpus = int(entry.split("=")[1])
    job = job_id.split("+")[0]
    expected[job] = expected.get(job, 0) + gpus
expected = {job: gpus for job, gpus in expected.items() if gpus > 0}
run = json.load(open(sys.argv[2]))["runs"][0]
replayed = {job["id"]: job["gpus"] for job in run["jobs"]}
out = open(sys.argv[3]).read()
errors = []
if replayed != expected:
    errors.append(f"replayed {replayed} != Slurm's {expected}")
if run["jobs_finished"] != len(expected) or run["never"]:
    errors.append(f"finished {run['jobs_finished']} of {len(expected)}, never {run['never']}")
if not re.search(r"\d+ \.batch/\.extern steps", out) or "cancelled before start" not in out \
        or "het-job components folded" not in out or "array tasks" not in out \
        or "CPU-only jobs" not in out:
    errors.append("the summary does not count what was left out: " + out.splitlines()[0])
if len(expected) < 10:
    errors.append(f"only {len(expected)} jobs ran with GPUs")
if errors:
    print("slurm_replay: FAIL:", *errors, sep="\n  ")
    sys.exit(1)
print(f"slurm_replay: OK: {len(expected)} jobs replayed with Slurm's GPU counts; {steps} steps skipped")
EOF
