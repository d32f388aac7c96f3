// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/fabric/collective.h"
#include "gpufleet/fabric/fabric.h"

// ECMP: each switch on the way up picks one of its equal-cost uplinks (and on the way down one of
// the parallel cables) by a CRC-32 hash of the packet's 5-tuple, so every flow of a queue pair
// sticks to one path and flows collide. The simulation routes the flows of a collective, gives
// them max-min fair rates, and compares with ideal spreading (adaptive routing, packet spraying).
namespace gpufleet::fabric {

// The 5-tuple of a RoCE v2 queue pair (UDP, destination port 4791).
struct FiveTuple {
  uint32_t source_ip = 0;
  uint32_t destination_ip = 0;
  uint16_t source_port = 0;
  uint16_t destination_port = 4791;
  uint8_t protocol = 17;
};

// CRC-32 (IEEE 802.3, reflected, as zlib) of `bytes`, starting from `seed` (0 for the standard
// checksum).
uint32_t Crc32(std::string_view bytes, uint32_t seed = 0);

// CRC-32 of the tuple's 13 bytes in network order, starting from `seed`:
// the hash switches use to spread flows, with a per-switch or per-tier seed.
uint32_t HashFiveTuple(const FiveTuple& tuple, uint32_t seed);

// One connection of the collective: `source` NIC to `destination` NIC.
struct Flow {
  int source_node = 0;
  int source_nic = 0;
  int destination_node = 0;
  int destination_nic = 0;
};

// The inter-node connections NCCL opens for `collective` on `placement` (rank order): for the
// ring collectives, one ring per rail from each node to the next (rail-aligned, NCCL_CROSS_NIC=0);
// for all-to-all, every ordered pair of nodes on every rail. Traffic inside a node stays on
// NVLink and has no flow. Each node uses as many rails as it has NICs for its placed GPUs.
std::vector<Flow> CollectiveFlows(const Fabric& fabric, const std::vector<PlacedGpus>& placement,
                                  Collective collective);

enum class HashSeeds {
  kPerTier,    // every switch of a tier hashes alike, as switches shipped with one default do
  kPerSwitch,  // every switch its own seed
};

struct EcmpOptions {
  int queue_pairs = 1;  // per connection (NCCL_IB_QPS_PER_CONNECTION), each its own source port
  HashSeeds seeds = HashSeeds::kPerTier;
  uint64_t seed = 1;  // source ports and per-switch seeds
};

struct EcmpResult {
  int flows = 0;
  int subflows = 0;       // flows x queue pairs
  int network_flows = 0;  // flows that leave their leaf switch (the ones ECMP routes)
  // Uplinks and downlinks between switches: how many exist on the routes' switches, how many
  // carry traffic, and the most subflows on one.
  int fabric_links = 0;
  int fabric_links_used = 0;
  int fabric_links_shared = 0;  // carrying two or more subflows
  int max_subflows_per_link = 0;
  // Flows whose path shares a switch-to-switch link with another flow.
  int colliding_flows = 0;
  // Per flow, Gb/s, from the max-min fair rates of its subflows: the data is split evenly over
  // the queue pairs, so the flow moves at queue_pairs x its slowest subflow.
  std::vector<double> flow_gbps;
  double min_flow_gbps = 0;
  // Mean over flows of the sum of their subflows' rates: what elastic traffic would get.
  double mean_flow_gbps = 0;
  // Ideal spreading: every flow split evenly over all equal-cost paths, all flows at one rate.
  double ideal_flow_gbps = 0;
  // The collective moves at its slowest flow: min_flow / ideal. And the aggregate: mean / ideal.
  double collective_ratio = 0;
  double aggregate_ratio = 0;
};

// Routes and rates `flows` once, with source ports drawn from `random`. kInvalidArgument for a
// flow from or to a NIC without a cable, or between switches no path joins.
Result<EcmpResult> SimulateEcmp(const Fabric& fabric, const std::vector<Flow>& flows,
                                const EcmpOptions& options);

// Balls into bins with the same hash: `flows` flows with random source ports hashed onto
// `paths` equal-cost paths, `trials` times.
struct PathUse {
  double mean_paths_used = 0;
  double no_collision_fraction = 0;  // trials in which every flow had a path of its own
  double mean_max_load = 0;          // flows on the busiest path
};
PathUse SimulatePathUse(int paths, int flows, int trials, uint64_t seed);

// Closed forms for k flows hashed uniformly onto n paths: n(1 - (1 - 1/n)^k) paths used, and
// n! / ((n - k)! n^k) for no collision.
double ExpectedPathsUsed(int paths, int flows);
double NoCollisionProbability(int paths, int flows);

}  // namespace gpufleet::fabric
