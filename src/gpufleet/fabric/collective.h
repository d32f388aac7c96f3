// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/fabric/fabric.h"

// The cost of a collective on a placement: an alpha-beta model whose bandwidth terms are
// nccl-tests bus bandwidths (busbw = algbw x factor, the factor per collective from nccl-tests'
// doc/PERFORMANCE.md), calibrated on the published figures: ~370 GB/s for an 8 x H100 ring
// all-reduce over NVLink (450 GB/s raw), 46-48 GB/s per 400G NIC, ~380 GB/s multi-node with
// 8 x 400G per node. Network stages slow down by the oversubscription of every tier the
// placement's traffic climbs through.
namespace gpufleet::fabric {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll };

const char* CollectiveName(Collective collective);
// "all-reduce", "all-gather", "reduce-scatter", "all-to-all" (also "allreduce", ...).
Result<Collective> ParseCollective(std::string_view name);

// nccl-tests' bus bandwidth factor for `ranks` ranks: 2(n-1)/n for all-reduce, (n-1)/n for the
// others.
double BusBandwidthFactor(Collective collective, int ranks);

// Calibration of the model, defaults from NCCL and nccl-tests (docs/fabric.md).
struct CostModelOptions {
  // Achieved ring bus bandwidth over NVLink per direction: 370 of H100's 450 GB/s.
  double nvlink_efficiency = 370.0 / 450.0;
  // Achieved bus bandwidth per NIC over its line rate: 47.5 of 50 GB/s for NDR 400G.
  double nic_efficiency = 0.95;
  // NCCL's ring latencies (src/graph/tuning.cc, Simple protocol), in microseconds.
  double base_latency_us = 8.4;
  double nvlink_step_latency_us = 3.4;
  double network_step_latency_us = 14.0;
  // Share of the network bandwidth left after ECMP collisions when traffic climbs above a leaf;
  // 1 for adaptive routing or packet spraying. `gpufleet fabric ecmp` measures it for a fabric.
  double ecmp_efficiency = 1.0;
};

// What the model needs to know of a placement.
struct PlacementShape {
  int ranks = 1;            // GPUs
  int domains = 1;          // NVLink domains the ranks span
  int gpus_per_domain = 1;  // ranks in the least-populated domain
  int64_t nvlink_mbps = 0;  // per GPU and direction
  int64_t nic_mbps = 0;     // network line rate per GPU (NIC speed x NICs / GPUs)
  // -1: one NVLink domain; t: the lowest tier whose domain holds every rank (0: under one leaf
  // domain, traffic stays on the leaves); TierCount(): no tier joins them.
  int common_tier = -1;
  // Product of the oversubscription (>= 1) of the tiers below common_tier, whose uplinks the
  // traffic crosses.
  double path_oversubscription = 1;
};

// One rank group of a placement: `gpus` GPUs of fabric node `node`.
struct PlacedGpus {
  int node = 0;
  int gpus = 0;
};

// The shape of a concrete placement. kInvalidArgument for a node index out of range, a node
// placed twice, or more GPUs than the node has.
Result<PlacementShape> ShapeOf(const Fabric& fabric, const std::vector<PlacedGpus>& placement);

// The shape of `ranks` GPUs packed as tightly as `fabric` allows: whole NVLink domains of the
// largest kind first, inside the smallest domain of the lowest tier that holds them. Used as the
// ideal a placement is compared with. REQUIRES: the fabric has a node with GPUs.
PlacementShape CompactShape(const Fabric& fabric, int ranks);

// A shape of `ranks` GPUs, `gpus_per_domain` per NVLink domain, whose traffic reaches tier
// `common_tier`, on nodes like fabric node `like_node`.
PlacementShape UniformShape(const Fabric& fabric, int like_node, int ranks, int gpus_per_domain,
                            int common_tier);

struct CollectiveEstimate {
  double seconds = 0;
  double algbw_gbytes = 0;            // bytes / seconds, GB/s
  double busbw_gbytes = 0;            // algbw x BusBandwidthFactor
  std::string algorithm;              // "nvlink ring", "ring", "hierarchical", "pairwise"
  double network_gbytes_per_gpu = 0;  // effective network bandwidth per GPU; 0 within NVLink
};

// Time of `collective` over `bytes` per rank (the whole buffer for all-reduce, the gathered
// output for all-gather, the input for reduce-scatter, all data a rank sends for all-to-all),
// taking the faster of a flat ring and, for all-reduce across NVLink domains, the hierarchical
// reduce-scatter / network all-reduce / all-gather (pipelined, as NCCL runs it over channels).
CollectiveEstimate EstimateCollective(Collective collective, int64_t bytes,
                                      const PlacementShape& shape,
                                      const CostModelOptions& options = {});

}  // namespace gpufleet::fabric
