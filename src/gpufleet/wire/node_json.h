// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/status.h"
#include "gpufleet/wire/json_fields.h"

// The JSON form of a node, as the store keeps it and the REST API shows it (docs/api.md).
namespace gpufleet::wire {

std::optional<NodeState> ParseNodeState(std::string_view text);
std::optional<GpuHealth> ParseGpuHealth(std::string_view text);

// `levels` are the cluster's topology levels: node.topology[i] is written under levels[i].
Json NodeToJson(const Node& node, const std::vector<std::string>& levels);
// The node's "images" (its agent's heartbeat, bounded there): [{"references", "digest",
// "size_bytes"}]. The reader skips what is not of that shape.
Json CachedImagesToJson(const std::vector<CachedImage>& images);
std::vector<CachedImage> CachedImagesFromJson(const Json& images);

// kInvalidArgument naming the node and field for an unknown state or health.
Result<Node> NodeFromJson(const Json& j, const std::vector<std::string>& levels);

}  // namespace gpufleet::wire
