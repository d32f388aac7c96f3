// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"

namespace gpufleet {

// MIG geometry shared by A100, H100, H200 and GB200: 8 memory slices, 7 compute (SM) slices.
inline constexpr int kMigMemorySlices = 8;
inline constexpr int kMigComputeSlices = 7;

// One GPU-instance profile of a model, from NVIDIA's MIG user guide (`nvidia-smi mig
// -lgip/-lgipp`).
struct MigProfile {
  std::string name;               // "3g.40gb", without the "MIG " prefix
  int profile_id = 0;             // NVML GPU-instance profile id (19, 20, 15, 14, 9, 5, 0)
  int memory_slices = 0;          // contiguous memory slices the instance occupies
  int compute_slices = 0;         // SM slices out of kMigComputeSlices
  int max_instances = 0;          // most instances of this profile on one GPU
  int64_t memory_mib = 0;         // nominal memory of one instance
  std::vector<int> starts;        // valid first memory slice of a placement
  bool media_extensions = false;  // "+me": at most one per GPU
};

// What the scheduler knows of a GPU model. Thread-compatible value type.
struct GpuModelInfo {
  std::string name;  // canonical, e.g. "H100-80GB"
  int64_t memory_mib = 0;
  std::vector<MigProfile> mig_profiles;  // empty: the model has no MIG
  bool from_trace = false;               // first seen in a trace, not a known product

  bool SupportsMig() const { return !mig_profiles.empty(); }
  // nullptr when the model has no such profile.
  const MigProfile* FindMigProfile(std::string_view profile_name) const;
  // "1g.10gb, 1g.20gb, ..." for error messages.
  std::string MigProfileNames() const;
};

// Catalog of GPU models by name and alias. Built once, then read: thread-compatible (concurrent
// reads are safe; RegisterTraceModel needs exclusive access).
class GpuCatalog {
 public:
  // The known products: A100-40GB, A100-80GB, H100-80GB, H200-141GB, GB200, L40S, A10, T4,
  // V100-16GB, V100-32GB, P100, with aliases such as "V100" and NVML's names.
  static GpuCatalog Default();

  // kNotFound naming the model and the known ones when `name` is neither a name nor an alias.
  Result<const GpuModelInfo*> Find(std::string_view name) const;
  bool Contains(std::string_view name) const;

  // Adds a model first seen in a trace (e.g. openb's "G2"); a no-op if it is known already.
  // kInvalidArgument for an empty name or a negative memory size.
  Status RegisterTraceModel(std::string_view name, int64_t memory_mib);

  const std::map<std::string, GpuModelInfo, std::less<>>& models() const { return models_; }
  // Canonical name for a name or alias; empty if unknown.
  std::string Canonical(std::string_view name) const;

 private:
  void Add(GpuModelInfo info, std::vector<std::string> aliases);

  std::map<std::string, GpuModelInfo, std::less<>> models_;
  std::map<std::string, std::string, std::less<>> aliases_;  // alias -> canonical name
};

}  // namespace gpufleet
