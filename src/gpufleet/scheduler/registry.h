// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/fabric/fabric.h"
#include "gpufleet/scheduler/fragmentation.h"
#include "gpufleet/scheduler/framework.h"

namespace gpufleet::scheduler {

// What plugin factories may read.
struct PluginArgs {
  TargetWorkload target_workload;  // the fgd policy scores against it
  int min_thermal_headroom_c = 5;
  // The network the collective-cost plugin estimates on; it needs one.
  std::shared_ptr<const fabric::Fabric> fabric;
};

using PluginFactory = std::function<Result<std::unique_ptr<Plugin>>(const PluginArgs&)>;

// Plugin factories by name. Thread-compatible.
class PluginRegistry {
 public:
  // Every plugin of this library: the filters, topology plugins and the placement policies.
  static PluginRegistry Default();

  // kAlreadyExists when the name is taken.
  Status Register(std::string name, PluginFactory factory);
  // kNotFound naming the plugin and the known ones.
  Result<std::unique_ptr<Plugin>> Create(std::string_view name, const PluginArgs& args) const;
  std::vector<std::string> Names() const;

 private:
  std::map<std::string, PluginFactory, std::less<>> factories_;
};

// The placement policies, in the order the FGD paper lists them.
const std::vector<std::string>& PlacementPolicyNames();

}  // namespace gpufleet::scheduler
