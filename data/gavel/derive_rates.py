#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Derives the Gavel steps-per-second table of src/gpufleet/sim/trace_loaders.cc.

Gavel's msr traces carry total_steps, not a duration, and the script that made them is not in the
Gavel repository. Their arrival offsets match the Pollux artifact's philly.csv: a Gavel job at
offset t with g GPUs in the file of virtual cluster VC is the philly.csv job of cluster VC
submitted t seconds after that cluster's first job, with g GPUs. Over the jobs matched one to one
that way, total_steps / duration is a constant per job type (whatever the GPU count), e.g.
1.707 for "Transformer (batch size 256)". This prints that constant per job type: the mode of the
ratios (3 decimals), refined as sum(steps) / sum(durations) over the jobs within 0.2 % of it.
(Gavel's own simulation_throughputs.json does not reproduce these ratios.)

Usage: derive_rates.py <philly.csv> <gavel seed=0 dir with *.trace>
"""
import collections
import csv
import datetime
import glob
import os
import sys


def main():
    philly = collections.defaultdict(list)
    with open(sys.argv[1]) as f:
        for row in csv.DictReader(f):
            if not row["timestamp"]:
                continue
            t = datetime.datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S")
            philly[row["cluster"]].append((t, float(row["duration"]), int(row["num_gpus"])))
    pairs = collections.defaultdict(list)
    total = 0
    for path in sorted(glob.glob(os.path.join(sys.argv[2], "*.trace"))):
        jobs = sorted(philly[os.path.basename(path)[:-len(".trace")]])
        first = jobs[0][0]
        by_offset = collections.defaultdict(list)
        for t, duration, gpus in jobs:
            by_offset[(int((t - first).total_seconds()), gpus)].append(duration)
        with open(path) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                total += 1
                key = (int(float(fields[5])), int(fields[6]))
                if len(by_offset.get(key, [])) == 1:
                    pairs[fields[0]].append((int(fields[4]), by_offset[key][0]))
    print(f"# {sum(map(len, pairs.values()))} of {total} jobs matched")
    print("job_type,steps_per_second,matched_jobs")
    for job_type in sorted(pairs):
        ratios = [steps / duration for steps, duration in pairs[job_type]]
        mode = collections.Counter(round(r, 3) for r in ratios).most_common(1)[0][0]
        good = [(s, d) for s, d in pairs[job_type] if abs(s / d - mode) / mode < 0.002]
        rate = sum(s for s, _ in good) / sum(d for _, d in good)
        print(f'"{job_type}",{rate:.6f},{len(pairs[job_type])}')


if __name__ == "__main__":
    main()
