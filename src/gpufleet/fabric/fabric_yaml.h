// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <string_view>

#include "gpufleet/core/status.h"
#include "gpufleet/fabric/fabric.h"

// The YAML form of a fabric description (docs/fabric.md):
//
//   name: pod-a
//   tiers: [leaf, spine]                   # lowest first
//   nodes:
//     - names: gpu[001-032]                # a Slurm hostlist
//       gpus: 8
//       gpu_model: H100-80GB
//       nics: 8
//       nic_speed: 400G
//   switches:
//     - {names: "leaf[1-4]", tier: leaf, ports: 64, port_speed: 400G}
//     - {names: "spine[1-2]", tier: spine, ports: 64, port_speed: 400G}
//   links:
//     - {from: "gpu[001-008]", to: leaf1}  # every NIC of each node to leaf1
//     - {from: "leaf[1-4]", to: "spine[1-2]", count: 8}
namespace gpufleet::fabric {

// Parses without checking references (Fabric::Build does that). kInvalidArgument as
// "FILE:LINE: FIELD.PATH: message" for malformed YAML, a missing or unknown field, or a value of
// the wrong type or range. `file_name` only labels messages; nothing is read from disk.
Result<FabricSpec> ParseFabricYaml(std::string_view text, std::string_view file_name);

// The spec as YAML that ParseFabricYaml reads back to the same spec (line numbers aside).
std::string WriteFabricYaml(const FabricSpec& spec);

}  // namespace gpufleet::fabric
