// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <compare>
#include <functional>
#include <ostream>
#include <string>
#include <utility>

namespace gpufleet {

// A name that cannot be mixed up with a name of another kind: a NodeId is not a JobId.
// Thread-compatible value type.
template <typename Tag>
class StrongId {
 public:
  StrongId() = default;
  explicit StrongId(std::string value) : value_(std::move(value)) {}

  const std::string& value() const { return value_; }
  bool empty() const { return value_.empty(); }

  friend auto operator<=>(const StrongId&, const StrongId&) = default;
  friend std::ostream& operator<<(std::ostream& os, const StrongId& id) { return os << id.value_; }

 private:
  std::string value_;
};

struct NodeIdTag {};
struct GpuUuidTag {};
struct JobIdTag {};
struct QueueIdTag {};

using NodeId = StrongId<NodeIdTag>;
using GpuUuid = StrongId<GpuUuidTag>;
using JobId = StrongId<JobIdTag>;
using QueueId = StrongId<QueueIdTag>;

}  // namespace gpufleet

template <typename Tag>
struct std::hash<gpufleet::StrongId<Tag>> {
  size_t operator()(const gpufleet::StrongId<Tag>& id) const noexcept {
    return std::hash<std::string>()(id.value());
  }
};
