#!/usr/bin/env bash
# Real Slurm (Debian's slurm-wlm 22.05): munge with a key made here, MariaDB, slurmdbd, slurmctld
# and four slurmd (four "a100" GPUs each, backed by plain files) on loopback in a temporary
# directory, all stopped afterwards. Submits GPU jobs of the shapes a site has, reads sacct back
# and replays it: every job that ran is replayed, the skipped rows are counted, and each job's
# GPU count in the replay equals Slurm's. Runs as root (slurmd must). Usage: slurm_replay.sh
# GPUFLEET. Exit 77 (skipped) without Slurm, unless GPUFLEET_REQUIRE_SLURM=1. The cluster's
# set-up is slurm_cluster.sh's.
set -euo pipefail

gpufleet=$(realpath "$1")
slurm_test=slurm_replay
slurm_accounting=1
# shellcheck source=slurm_cluster.sh
source "$(dirname "$0")/slurm_cluster.sh"
slurm_start
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
