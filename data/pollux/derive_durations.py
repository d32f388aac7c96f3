#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Derives the Pollux duration table of src/gpufleet/sim/trace_loaders.cc.

For each (application, num_replicas, batch_size) of the Pollux and Sia workloads, the run time of
the job alone on Pollux's testbed (nodes of 4 T4 GPUs) with that fixed configuration, computed as
Pollux's simulator estimates it for its "TunedJobs" baseline (`Application.get_configurations` in
simulator/applications.py of petuum/adaptdl, branch osdi21-artifact, commit c793c708):

  placement   = num_replicas packed onto 4-GPU nodes, e.g. 10 -> (4, 4, 2)
  local_bsz   = ceil(batch_size / num_replicas)
  accum_steps = ceil(local_bsz / max_local_bsz) - 1, atomic_bsz = ceil(local_bsz / (accum_steps + 1))
  step_time   = throughput profile at (placement, atomic_bsz) + accum_steps * (step - sync time)
  duration    = iterations after the last epoch (validation-<batch_size>.csv) * step_time

Usage: derive_durations.py <adaptdl>/simulator/traces <workload.csv>... (needs pandas and scipy).
Prints `application,num_replicas,batch_size,duration_seconds` rows.
"""
import collections
import csv
import glob
import math
import os
import sys

import pandas
from scipy.interpolate import LinearNDInterpolator, interp1d

MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80,
              "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}


class Application:
    def __init__(self, trace_dir, name):
        self.name = name
        validation = {}
        for path in glob.glob(os.path.join(trace_dir, "validation-*.csv")):
            validation[int(path.split("-")[-1].split(".")[0])] = pandas.read_csv(path)
        self.validation = collections.OrderedDict(sorted(validation.items()))
        self.placements = pandas.read_csv(os.path.join(trace_dir, "placements.csv"))
        self.placements["num_nodes"] = self.placements.placement.apply(lambda p: len(str(p)))
        self.placements["num_replicas"] = self.placements.placement.apply(
            lambda p: sum(map(int, str(p))))
        self.scalability = pandas.read_csv(os.path.join(trace_dir, "scalability.csv"))
        self.max_local_bsz = MAX_LOCAL_BSZ.get(name, self.placements.local_bsz.max())
        self.max_epochs = MAX_EPOCHS[name]

    def throughput(self, placement, local_bsz):
        placement = min(placement[i:] + placement[:i] for i in range(len(placement)))
        placement_id = int("".join(map(str, placement)))
        xs = ["num_nodes", "num_replicas", "local_bsz"]
        ys = ["step_time", "sync_time"]
        if placement_id in self.placements.placement.values:
            df = self.placements[self.placements.placement == placement_id]
            return interp1d(df.local_bsz.values, df[ys].values, axis=0)(local_bsz)
        df = self.placements.groupby(xs)[xs + ys].mean()
        df = pandas.concat([df, self.scalability], ignore_index=True)
        point = [min(len(placement), 16), sum(placement), local_bsz]
        return LinearNDInterpolator(df[xs].values, df[ys].values)([point])[0]

    def duration(self, num_replicas, batch_size):
        placement = ()
        while sum(placement) < num_replicas:
            placement = (*placement, min(num_replicas - sum(placement), 4))
        local_bsz = math.ceil(batch_size / num_replicas - 1e-8)
        accum_steps = math.ceil(local_bsz / self.max_local_bsz - 1e-8) - 1
        atomic_bsz = math.ceil(local_bsz / (accum_steps + 1) - 1e-8)
        step_time, sync_time = self.throughput(placement, atomic_bsz)
        step_time += accum_steps * (step_time - sync_time)
        return self.validation[batch_size].iteration[self.max_epochs - 1] * step_time


def main():
    traces = sys.argv[1]
    configs = set()
    for path in sys.argv[2:]:
        with open(path) as f:
            for row in csv.DictReader(f):
                configs.add((row["application"], int(row["num_replicas"]),
                             int(row["batch_size"])))
    apps = {}
    print("application,num_replicas,batch_size,duration_seconds")
    for name, replicas, batch in sorted(configs):
        if name not in apps:
            apps[name] = Application(os.path.join(traces, name), name)
        print(f"{name},{replicas},{batch},{round(float(apps[name].duration(replicas, batch)))}")


if __name__ == "__main__":
    main()
