// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/status.h"
#include "gpufleet/sim/replay.h"
#include "gpufleet/sim/trace.h"

// `gpufleet sim replay --engine control-plane` (docs/simulator.md): a trace replayed through the
// control plane itself. The trace's jobs are submitted through the API at their arrival times, as
// the CLI submits them; the production server on simulated time queues, backfills and places them;
// the production agents with the simulated runner run each task for its trace duration. The
// fleet runs event-driven (FleetOptions::event_driven), so a month of simulated time costs the
// events in it, not its seconds.
namespace gpufleet::fleetsim {

// The queue policies of sim::QueuePolicyNames that the server has:
//   fifo           one queue in arrival order, no runtime estimates: a job that does not fit is
//                  skipped and later ones may start (the server reserves nothing without them)
//   easy-backfill  one queue in arrival order, the trace's runtime estimates in the specs: the
//                  server's EASY backfill step (control::BackfillStep) reserves for the head
//   fair-share     one server queue per queue name of the trace (equal weights, no guarantees
//                  or limits, as the loops' default tree): the server's queue tree orders by
//                  hierarchical fair share of decayed usage and preempts as its rules allow
// The others cannot be mapped: strict-fifo (the server never blocks the queue behind a job that
// does not fit), sjf and gpufleet (the server orders by priority, fair share and age, never by
// runtime), tiresias (the server preempts by queue guarantees and priority, not by attained
// service), fair-share-no-preempt (the server always lets a job preempt a lower-priority one of
// its own queue; see docs/simulator.md).
const std::vector<std::string>& ControlPlaneQueuePolicies();

// The replay's outcome in sim::ReplayResult's shape. Fragmentation is not measured (the server
// keeps no fragmentation model): each sample's fragmentation_gpus is NaN (null in the JSON).
// kInvalidArgument for a queue policy the server has not (ControlPlaneQueuePolicies), an option
// only the replay loops have (fabric, topology, learned workload, interactive activity, idle
// reclaim, time limits, queue trees) or a cluster whose nodes differ (the simulated fleet's nodes
// are all alike: same GPU count and model); the fleet's errors otherwise.
Result<sim::ReplayResult> RunReplayThroughControlPlane(const Cluster& cluster,
                                                       const sim::Trace& trace,
                                                       const sim::ReplayOptions& options);

}  // namespace gpufleet::fleetsim
