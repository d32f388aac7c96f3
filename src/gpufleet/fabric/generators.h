// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

#include "gpufleet/core/status.h"
#include "gpufleet/fabric/fabric.h"

// Reference fabric designs as specs (write them out with WriteFabricYaml, check them with
// Analyze). Every generator gives each leaf the same number of uplinks to each switch of the tier
// above, and picks the fewest upper switches that have the ports for them; kInvalidArgument
// naming the option when the design does not fit the switch radix.
namespace gpufleet::fabric {

// NVIDIA DGX H100 SuperPOD (reference architecture RA-11333-001): scalable units of 32 DGX H100
// slots, one slot of the first SU taken by the UFM appliance; eight rail leaves per SU (NIC i of
// every node to leaf i of its SU), full-mesh spines, NDR 400G, 64-port Quantum-2 switches, 1:1.
// 4 SUs: 127 nodes, 1,016 GPUs, 32 leaves, 16 spines, 1,024 leaf-spine cables. Up to 8 SUs with
// two tiers of 64-port switches.
struct SuperpodOptions {
  int scalable_units = 4;
  int radix = 64;
  bool ufm = true;  // the UFM appliance takes one node slot of SU 1 (four NIC ports)
  std::string gpu_model = "H100-80GB";
};
Result<FabricSpec> GenerateSuperpod(const SuperpodOptions& options);

// A folded Clos of leaves and spines (2 tiers) or pods of them under a core (3 tiers), every NIC
// of a node to its leaf. `leaf_oversubscription` is the leaves' down:up bandwidth (3 for 3:1),
// `spine_oversubscription` the spines' (3 tiers).
struct ClosOptions {
  int tiers = 2;
  int pods = 1;  // 3 tiers only
  int leaves_per_pod = 4;
  int nodes_per_leaf = 4;
  int gpus_per_node = 8;
  int nics_per_node = 8;
  int64_t nic_speed_mbps = 400000;
  int64_t uplink_speed_mbps = 400000;
  double leaf_oversubscription = 1.0;
  double spine_oversubscription = 1.0;
  int radix = 64;
  std::string gpu_model = "H100-80GB";
  std::string name;  // default: "clos-..." from the options
};
Result<FabricSpec> GenerateClos(const ClosOptions& options);

// GB200 NVL72 racks: 18 compute trays of 4 GPUs (two Grace, four Blackwell) joined by one
// NVLink domain of 72 GPUs at 900 GB/s per GPU and direction; four ConnectX-7 400G per tray, one
// per GPU, rail-optimized: per rack one leaf per rail, full-mesh spines.
struct Nvl72Options {
  int racks = 8;
  int radix = 64;
  double leaf_oversubscription = 1.0;
};
Result<FabricSpec> GenerateNvl72(const Nvl72Options& options);

}  // namespace gpufleet::fabric
