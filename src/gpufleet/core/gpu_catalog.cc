// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/gpu_catalog.h"

#include <array>

#include <fmt/format.h>

namespace gpufleet {
namespace {

constexpr int64_t kGiB = 1024;

// Memory sizes in GB of the seven profiles of one MIG-capable model, in the order
// 1g, 1g+me, 1g.2x, 2g, 3g, 4g, 7g (NVIDIA MIG user guide, "Supported MIG Profiles").
struct MigSizes {
  int one_g;
  int one_g_double;
  int two_g;
  int three_g;
  int seven_g;
};

std::vector<MigProfile> MigProfilesFor(const MigSizes& gb) {
  auto name = [](int compute, int memory_gb) {
    return fmt::format("{}g.{}gb", compute, memory_gb);
  };
  return {
      {name(1, gb.one_g), 19, 1, 1, 7, gb.one_g * kGiB, {0, 1, 2, 3, 4, 5, 6}, false},
      {name(1, gb.one_g) + "+me", 20, 1, 1, 1, gb.one_g * kGiB, {0, 1, 2, 3, 4, 5, 6}, true},
      {name(1, gb.one_g_double), 15, 2, 1, 4, gb.one_g_double * kGiB, {0, 2, 4, 6}, false},
      {name(2, gb.two_g), 14, 2, 2, 3, gb.two_g * kGiB, {0, 2, 4}, false},
      {name(3, gb.three_g), 9, 4, 3, 2, gb.three_g * kGiB, {0, 4}, false},
      {name(4, gb.three_g), 5, 4, 4, 1, gb.three_g * kGiB, {0}, false},
      {name(7, gb.seven_g), 0, 8, 7, 1, gb.seven_g * kGiB, {0}, false},
  };
}

}  // namespace

const MigProfile* GpuModelInfo::FindMigProfile(std::string_view profile_name) const {
  for (const MigProfile& profile : mig_profiles) {
    if (profile.name == profile_name) {
      return &profile;
    }
  }
  return nullptr;
}

std::string GpuModelInfo::MigProfileNames() const {
  std::string names;
  for (const MigProfile& profile : mig_profiles) {
    if (!names.empty()) {
      names += ", ";
    }
    names += profile.name;
  }
  return names;
}

GpuCatalog GpuCatalog::Default() {
  GpuCatalog catalog;
  catalog.Add({"A100-40GB", 40 * kGiB, MigProfilesFor({5, 10, 10, 20, 40}), false},
              {"A100", "A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"});
  catalog.Add({"A100-80GB", 80 * kGiB, MigProfilesFor({10, 20, 20, 40, 80}), false},
              {"A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"});
  catalog.Add({"H100-80GB", 80 * kGiB, MigProfilesFor({10, 20, 20, 40, 80}), false},
              {"H100", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"});
  catalog.Add({"H200-141GB", 141 * kGiB, MigProfilesFor({18, 35, 35, 71, 141}), false},
              {"H200", "NVIDIA H200"});
  catalog.Add({"GB200", 186 * kGiB, MigProfilesFor({23, 47, 47, 93, 186}), false},
              {"NVIDIA GB200"});
  catalog.Add({"L40S", 48 * kGiB, {}, false}, {"NVIDIA L40S"});
  catalog.Add({"A10", 24 * kGiB, {}, false}, {"NVIDIA A10"});
  catalog.Add({"T4", 16 * kGiB, {}, false}, {"Tesla T4"});
  catalog.Add({"V100-16GB", 16 * kGiB, {}, false},
              {"V100", "V100M16", "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"});
  catalog.Add({"V100-32GB", 32 * kGiB, {}, false}, {"V100M32", "Tesla V100-SXM2-32GB"});
  catalog.Add({"P100", 16 * kGiB, {}, false}, {"Tesla P100-PCIE-16GB", "Tesla P100-SXM2-16GB"});
  return catalog;
}

void GpuCatalog::Add(GpuModelInfo info, std::vector<std::string> aliases) {
  const std::string name = info.name;
  for (std::string& alias : aliases) {
    aliases_.emplace(std::move(alias), name);
  }
  models_.emplace(name, std::move(info));
}

std::string GpuCatalog::Canonical(std::string_view name) const {
  if (models_.find(name) != models_.end()) {
    return std::string(name);
  }
  const auto alias = aliases_.find(name);
  return alias == aliases_.end() ? std::string() : alias->second;
}

bool GpuCatalog::Contains(std::string_view name) const {
  return !Canonical(name).empty();
}

Result<const GpuModelInfo*> GpuCatalog::Find(std::string_view name) const {
  const std::string canonical = Canonical(name);
  if (canonical.empty()) {
    std::string known;
    for (const auto& [model_name, info] : models_) {
      known += known.empty() ? model_name : ", " + model_name;
    }
    return NotFoundError(fmt::format("unknown GPU model \"{}\" (known: {})", name, known));
  }
  return &models_.find(canonical)->second;
}

Status GpuCatalog::RegisterTraceModel(std::string_view name, int64_t memory_mib) {
  if (name.empty()) {
    return InvalidArgumentError("gpu model: empty name");
  }
  if (memory_mib < 0) {
    return InvalidArgumentError(
        fmt::format("gpu model \"{}\": negative memory_mib {}", name, memory_mib));
  }
  if (Contains(name)) {
    return Status::Ok();
  }
  Add({std::string(name), memory_mib, {}, true}, {});
  return Status::Ok();
}

}  // namespace gpufleet
