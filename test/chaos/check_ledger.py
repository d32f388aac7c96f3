#!/usr/bin/env python3
# The chaos harness's checker (test/chaos/chaos.sh). Reads the tasks' own ledger, the jobs the
# server holds at the end and the submissions it acknowledged, and checks the control plane's
# invariants from the physical record: no GPU UUID held by two live tasks at any instant, no job
# running in two places at once, every acknowledged submission present, every job in a legal
# final state, every task that started has ended, and some task ran at all (not every job's
# tasks need write the ledger: container_smoke's first jobs do not). Prints a summary line;
# exits 1 on a violation.
# Also: no gang partly running (some of an attempt's tasks live, others not started) for longer
# than GANG_WINDOW seconds (the server's gang start timeout plus the time to stop what started).
# Usage: check_ledger.py LEDGER JOBS_JSON ACKED_FILE FAULTS_FILE [GANG_WINDOW]
import collections
import json
import sys


def split_run(run):
    """A task id, TEAM/NAME/TASK/ATTEMPT (NAME/TASK/ATTEMPT for a team-less admin's job), as
    (job key, task, attempt)."""
    key, task, attempt = run.rsplit("/", 2)
    return key, task, attempt


ledger_path, jobs_path, acked_path, faults_path = sys.argv[1:5]
gang_window = float(sys.argv[5]) if len(sys.argv) > 5 else float("inf")
starts = {}
all_starts = []  # (run, start)
ends = {}  # run -> end, with or without GPUs
intervals = []  # (gpu, start, end, run)
problems = []
for line in open(ledger_path):
    parts = line.split()
    if len(parts) < 3:
        continue
    kind, run, when = parts[0], parts[1], float(parts[2])
    if kind == "START":
        gpus = parts[3].split(",") if parts[3] not in ("-", "") else []
        starts[run] = (when, gpus)
        all_starts.append((run, when))
    elif kind == "END" and run in starts:
        ends[run] = when
        begin, gpus = starts.pop(run)
        for gpu in gpus:
            intervals.append((gpu, begin, when, run))
for run, (begin, gpus) in starts.items():
    problems.append(f"task {run} started at {begin:.3f} on {gpus} and never ended")

by_gpu = collections.defaultdict(list)
for gpu, begin, end, run in intervals:
    by_gpu[gpu].append((begin, end, run))
overlaps = 0
for gpu, spans in by_gpu.items():
    spans.sort()
    for (b1, e1, r1), (b2, e2, r2) in zip(spans, spans[1:]):
        if b2 < e1:
            overlaps += 1
            problems.append(f"{gpu}: {r2} started at {b2:.3f} while {r1} ran until {e1:.3f}")

# A job runs in one place at a time: the runs (attempts) of one job never overlap.
by_job = collections.defaultdict(list)
for gpu, begin, end, run in intervals:
    job, task, attempt = split_run(run)
    by_job[job].append((begin, end, attempt))
for job, spans in by_job.items():
    spans.sort()
    for (b1, e1, a1), (b2, e2, a2) in zip(spans, spans[1:]):
        if a1 != a2 and b2 < e1:
            problems.append(f"job {job}: attempt {a2} started at {b2:.3f} while {a1} ran")

jobs = {(f"{job['team']}/{job['name']}" if job.get("team") else job["name"]): job
        for job in json.load(open(jobs_path))["items"]}

# Gangs: each attempt's tasks either all start, within the window of the first, or what started
# ends within the window.
attempts = collections.defaultdict(list)  # (job, attempt) -> [(start, end)]
for run, begin in all_starts:
    job, task, attempt = split_run(run)
    attempts[(job, attempt)].append((begin, ends.get(run, begin)))
for (job, attempt), spans in attempts.items():
    spec = jobs.get(job, {}).get("spec", {}).get("spec", {})
    size = sum(group.get("replicas", 1) for group in spec.get("tasks", []))
    if size < 2:
        continue
    first = min(begin for begin, _ in spans)
    partial = (max(begin for begin, _ in spans) if len(spans) >= size
               else max(end for _, end in spans)) - first
    if partial > gang_window:
        problems.append(f"job {job} attempt {attempt}: {len(spans)} of {size} tasks ran partly "
                        f"started for {partial:.1f} s (window {gang_window:.0f} s)")
acked = [name.strip() for name in open(acked_path) if name.strip()]
lost = [name for name in acked if name not in jobs]
for name in lost:
    problems.append(f"acknowledged job {name} is lost")
legal = {"Succeeded", "Failed", "Cancelled"}
for name, job in jobs.items():
    if job["state"] not in legal:
        problems.append(f"job {name} ends in {job['state']} ({job.get('reason', '')})")
    if job["state"] in legal and job.get("placements"):
        problems.append(f"job {name} is {job['state']} but holds placements")
# A run in which no task started checked nothing (every start failing, e.g. on a stale CDI spec).
if not all_starts:
    problems.append(f"no task ever started ({len(jobs)} jobs): the run exercised nothing")

# How soon a GPU is reused once the task on it has ended: the control plane's safety costs this.
gaps = []
for gpu, spans in by_gpu.items():
    for (b1, e1, r1), (b2, e2, r2) in zip(spans, spans[1:]):
        if b2 >= e1:
            gaps.append(b2 - e1)
gaps.sort()


def percentile(values, p):
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


faults = collections.Counter(line.split()[0] for line in open(faults_path) if line.strip())
runs = len({run for _, _, _, run in intervals})
print(f"chaos: {sum(faults.values())} faults ({', '.join(f'{k} {v}' for k, v in sorted(faults.items()))}); "
      f"{runs} task runs on {len(by_gpu)} GPUs; {len(acked)} jobs acknowledged, {len(lost)} lost; "
      f"overlaps {overlaps}; GPU reuse after a run's end p50 {percentile(gaps, 50):.2f} s, "
      f"p99 {percentile(gaps, 99):.2f} s; {len(problems)} problems")
for problem in problems[:40]:
    print("  " + problem)
sys.exit(1 if problems else 0)
