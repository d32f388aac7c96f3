// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/workload.h"

#include <csignal>
#include <utility>

#include <fmt/format.h>

namespace gpufleet {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;  // clang 14 does not deduce aggregates yet

Status ValidateGpuRequest(const GpuRequest& request, const std::string& path, const Job& job,
                          const GpuCatalog& catalog) {
  if (const auto* whole = std::get_if<WholeGpus>(&request)) {
    if (whole->count < 1) {
      return InvalidArgumentError(
          fmt::format("{}.count: {} (must be at least 1)", path, whole->count));
    }
  } else if (const auto* share = std::get_if<FractionalGpu>(&request)) {
    if (share->gpu_milli < 1 || share->gpu_milli >= kMilliPerUnit) {
      return InvalidArgumentError(fmt::format(
          "{}.gpu_milli: {} (a fractional share is 1..999; ask for whole GPUs otherwise)", path,
          share->gpu_milli));
    }
    if (share->gpu_memory_mib < 0) {
      return InvalidArgumentError(
          fmt::format("{}.gpu_memory_mib: negative value {}", path, share->gpu_memory_mib));
    }
  } else if (const auto* mig = std::get_if<MigGpus>(&request)) {
    if (mig->count < 1) {
      return InvalidArgumentError(
          fmt::format("{}.count: {} (must be at least 1)", path, mig->count));
    }
    // The profile must exist on every allowed model, or on some MIG model when any is allowed.
    if (!job.allowed_gpu_models.empty()) {
      for (const std::string& model_name : job.allowed_gpu_models) {
        auto model = catalog.Find(model_name);
        if (!model.ok()) {
          continue;  // reported for allowed_gpu_models
        }
        if ((*model)->FindMigProfile(mig->profile) == nullptr) {
          return InvalidArgumentError(
              fmt::format("{}.mig_profile: unknown profile \"{}\" for {} (valid: {})", path,
                          mig->profile, (*model)->name,
                          (*model)->SupportsMig() ? (*model)->MigProfileNames() : "none, no MIG"));
        }
      }
    } else {
      bool found = false;
      for (const auto& [name, model] : catalog.models()) {
        found = found || model.FindMigProfile(mig->profile) != nullptr;
      }
      if (!found) {
        return InvalidArgumentError(fmt::format(
            "{}.mig_profile: unknown profile \"{}\" on every known GPU model", path, mig->profile));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view GpuSharingName(GpuSharing sharing) {
  switch (sharing) {
    case GpuSharing::kTimeSlicing:
      return "time-slicing";
    case GpuSharing::kMps:
      return "mps";
    case GpuSharing::kNodeDefault:
      break;
  }
  return "";
}

Result<GpuSharing> ParseGpuSharing(std::string_view text) {
  for (const GpuSharing sharing : {GpuSharing::kTimeSlicing, GpuSharing::kMps}) {
    if (text == GpuSharingName(sharing)) {
      return sharing;
    }
  }
  return InvalidArgumentError(
      fmt::format("\"{}\" is not a GPU sharing mode (time-slicing or mps)", text));
}

const char* JobKindName(JobKind kind) {
  switch (kind) {
    case JobKind::kBatch:
      return "batch";
    case JobKind::kInteractive:
      return "interactive";
    case JobKind::kInference:
      return "inference";
  }
  return "unknown";
}

const char* NodeFailurePolicyName(NodeFailurePolicy policy) {
  switch (policy) {
    case NodeFailurePolicy::kRequeue:
      return "requeue";
    case NodeFailurePolicy::kFail:
      return "fail";
  }
  return "unknown";
}

namespace {

// The signals a task may take as its notice: each one a task can catch and that leaves it
// running when it does not.
constexpr std::pair<std::string_view, int> kNoticeSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},    {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1},
    {"SIGUSR2", SIGUSR2}, {"SIGALRM", SIGALRM},  {"SIGTERM", SIGTERM}, {"SIGCONT", SIGCONT},
    {"SIGURG", SIGURG},   {"SIGWINCH", SIGWINCH}};

}  // namespace

std::optional<int> NoticeSignalNumber(std::string_view name) {
  for (const auto& [known, number] : kNoticeSignals) {
    if (name == known || name == known.substr(3)) {
      return number;
    }
  }
  return std::nullopt;
}

std::string NoticeSignalNames() {
  std::string names;
  for (const auto& [known, number] : kNoticeSignals) {
    names += names.empty() ? "" : ", ";
    names += known;
  }
  return names;
}

int64_t RequestedGpuMilli(const GpuRequest& request) {
  return std::visit(
      Overloaded{
          [](const NoGpu&) -> int64_t { return 0; },
          [](const WholeGpus& whole) -> int64_t { return whole.count * kMilliPerUnit; },
          [](const FractionalGpu& share) -> int64_t { return share.gpu_milli; },
          [](const MigGpus& mig) -> int64_t {
            // A MIG instance of "Ng.*" holds N of the 7 compute slices.
            const int compute = mig.profile.empty() ? 0 : mig.profile[0] - '0';
            return mig.count * compute * kMilliPerUnit / kMigComputeSlices;
          },
      },
      request);
}

std::string GpuRequestToString(const GpuRequest& request) {
  return std::visit(
      Overloaded{
          [](const NoGpu&) { return std::string("no GPU"); },
          [](const WholeGpus& whole) { return fmt::format("{} whole GPU(s)", whole.count); },
          [](const FractionalGpu& share) {
            std::string text = fmt::format("{} milli-GPU", share.gpu_milli);
            if (share.gpu_memory_mib > 0) {
              text += fmt::format(" with {} MiB", share.gpu_memory_mib);
            }
            if (share.sharing != GpuSharing::kNodeDefault) {
              text += fmt::format(" ({})", GpuSharingName(share.sharing));
            }
            return text;
          },
          [](const MigGpus& mig) { return fmt::format("{} x MIG {}", mig.count, mig.profile); },
      },
      request);
}

int Job::TaskCount() const {
  int count = 0;
  for (const TaskGroup& group : groups) {
    count += group.replicas;
  }
  return count;
}

Job Job::AtSize(int replicas) const {
  Job sized = *this;
  sized.groups[0].replicas = replicas;
  return sized;
}

int64_t Job::RequestedGpuMilliTotal() const {
  int64_t total = 0;
  for (const TaskGroup& group : groups) {
    total += group.replicas * RequestedGpuMilli(group.request.gpus);
  }
  return total;
}

Status Job::Validate(const GpuCatalog& catalog) const {
  if (id.empty()) {
    return InvalidArgumentError("id: empty");
  }
  if (groups.empty()) {
    return InvalidArgumentError("groups: a job needs at least one task group");
  }
  for (size_t i = 0; i < allowed_gpu_models.size(); ++i) {
    auto model = catalog.Find(allowed_gpu_models[i]);
    if (!model.ok()) {
      return InvalidArgumentError(
          fmt::format("allowed_gpu_models[{}]: {}", i, model.status().message()));
    }
  }
  if (min_gpu_memory_mib < 0) {
    return InvalidArgumentError(
        fmt::format("min_gpu_memory_mib: negative value {}", min_gpu_memory_mib));
  }
  if (!spread.fault_domain.empty() && spread.max_skew < 1) {
    return InvalidArgumentError(
        fmt::format("spread.max_skew: {} (must be at least 1)", spread.max_skew));
  }
  if (runtime_estimate.count() < 0) {
    return InvalidArgumentError("runtime_estimate: negative duration");
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const TaskGroup& group = groups[i];
    const std::string path = fmt::format("groups[{}]", i);
    if (group.replicas < 1) {
      return InvalidArgumentError(
          fmt::format("{}.replicas: {} (must be at least 1)", path, group.replicas));
    }
    if (group.min_replicas < 0 || group.min_replicas > group.replicas) {
      return InvalidArgumentError(fmt::format("{}.min_replicas: {} (must be 0 or 1..replicas {})",
                                              path, group.min_replicas, group.replicas));
    }
    if (group.min_replicas > 0 && groups.size() > 1) {
      return InvalidArgumentError(
          fmt::format("{}.min_replicas: {}: an elastic group must be the job's only task group",
                      path, group.min_replicas));
    }
    if (group.request.host.cpu_milli < 0) {
      return InvalidArgumentError(fmt::format("{}.request.cpu_milli: negative value {}", path,
                                              group.request.host.cpu_milli));
    }
    if (group.request.host.memory_mib < 0) {
      return InvalidArgumentError(fmt::format("{}.request.memory_mib: negative value {}", path,
                                              group.request.host.memory_mib));
    }
    GPUFLEET_RETURN_IF_ERROR(
        ValidateGpuRequest(group.request.gpus, path + ".request.gpus", *this, catalog));
    if (!group.image.empty()) {
      if (const Status image = ValidateImageReference(group.image); !image.ok()) {
        return InvalidArgumentError(fmt::format("{}.image: {}", path, image.message()));
      }
    }
  }
  size_t provenance_bytes = 0;
  for (const auto& [key, value] : provenance) {
    if (key.empty()) {
      return InvalidArgumentError("provenance: an empty key");
    }
    provenance_bytes += key.size() + value.size();
  }
  if (provenance.size() > kMaxProvenanceEntries || provenance_bytes > kMaxProvenanceBytes) {
    return InvalidArgumentError(fmt::format(
        "provenance: {} entries of {} bytes in all (at most {} entries and {} bytes)",
        provenance.size(), provenance_bytes, kMaxProvenanceEntries, kMaxProvenanceBytes));
  }
  return Status::Ok();
}

}  // namespace gpufleet
