// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gpufleet/core/status.h"
#include "gpufleet/fabric/fabric.h"

// Slurm topology.conf, both plugins:
//   topology/tree   SwitchName=s0 Nodes=tux[0-3] LinkSpeed=900
//                   SwitchName=s4 Switches=s[0-3]
//   topology/block  BlockName=block1 Nodes=node[1-32]
//                   BlockSizes=32,64
namespace gpufleet::fabric {

// What topology.conf does not say about the hardware.
struct SlurmImportOptions {
  int gpus_per_node = 8;
  std::string gpu_model = "H100-80GB";
  // One cable for each node a switch lists and for each child switch, all of one speed: the file
  // says nothing of cable counts (Slurm's LinkSpeed is unitless and unused).
  int nics_per_node = 1;
  int64_t link_speed_mbps = 400000;
  // Blocks become NVLink domains (the block plugin's unit is a GB200 NVL72 rack or similar).
  int64_t block_nvlink_mbps = 7200000;
};

// A tree becomes tiers by height (switches with only nodes are "leaf", their parents "spine",
// then "core", then "level-4" ...), one link per node (all its NICs to its leaf) and per parent
// reference; a block file becomes nodes and NVLink domains. kInvalidArgument as "FILE:LINE: ..."
// for a line that is not Key=Value pairs, an unknown key, a duplicate or unknown switch, a node
// under two leaf switches, a loop in the tree, or a mix of tree and block lines.
Result<FabricSpec> ImportSlurmTopology(std::string_view text, std::string_view file_name,
                                       const SlurmImportOptions& options = {});

enum class SlurmTopologyKind { kTree, kBlock };

// topology.conf for `fabric`, nodes without GPUs left out. Tree: one SwitchName line per switch,
// lowest tier first, except that leaves of one domain (the rail leaves of a scalable unit) fold
// into one switch named after the domain, since Slurm's tree gives each node one leaf. Block: one
// BlockName per NVLink domain that spans nodes (else per leaf domain), then BlockSizes (the
// imported ones, or the base size and its doublings up to the whole set of blocks).
Result<std::string> ExportSlurmTopology(const Fabric& fabric, SlurmTopologyKind kind);

}  // namespace gpufleet::fabric
