// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/simulated_node.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>

namespace gpufleet::agent {

std::string MergeMetricTexts(const std::vector<std::string>& texts) {
  struct Family {
    std::vector<std::string> header;
    std::string series;
  };
  std::vector<std::string> order;
  std::map<std::string, Family> families;
  const auto family_of = [&](const std::string& name) -> Family& {
    auto [it, inserted] = families.try_emplace(name);
    if (inserted) {
      order.push_back(name);
    }
    return it->second;
  };
  for (const std::string& text : texts) {
    std::string current;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) {
        end = text.size();
      }
      const std::string line = text.substr(start, end - start);
      start = end + 1;
      if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
        const size_t name_end = line.find(' ', 7);
        current = line.substr(7, name_end == std::string::npos ? std::string::npos : name_end - 7);
        Family& family = family_of(current);
        if (family.header.size() < 2 &&
            std::find(family.header.begin(), family.header.end(), line) == family.header.end()) {
          family.header.push_back(line);
        }
      } else if (!line.empty() && line[0] != '#') {
        if (current.empty()) {
          current = line.substr(0, line.find_first_of("{ "));
        }
        family_of(current).series += line + "\n";
      }
    }
  }
  std::string out;
  for (const std::string& name : order) {
    const Family& family = families[name];
    for (const std::string& line : family.header) {
      out += line + "\n";
    }
    out += family.series;
  }
  return out;
}

Result<std::unique_ptr<SimulatedNode>> SimulatedNode::Create(Options options, const Clock& clock,
                                                             const GpuCatalog& catalog,
                                                             http::ApiClient& client) {
  std::unique_ptr<SimulatedNode> node(new SimulatedNode(clock));
  GPUFLEET_ASSIGN_OR_RETURN(node->probe_,
                            SimulatedProbe::Create(clock, catalog,
                                                   {.model = options.gpu_model,
                                                    .gpu_count = options.gpu_count,
                                                    .seed = options.seed,
                                                    .mig_profiles = options.mig_profiles}));
  if (options.faulty_gpu) {
    if (options.faulty_gpu->index < 0 || options.faulty_gpu->index >= options.gpu_count) {
      return InvalidArgumentError(fmt::format("faulty_gpu.index: {} is outside [0, {})",
                                              options.faulty_gpu->index, options.gpu_count));
    }
    if (options.faulty_gpu->xid < 1 || options.faulty_gpu->xid > 999) {
      return InvalidArgumentError(
          fmt::format("faulty_gpu.xid: {} is outside [1, 999]", options.faulty_gpu->xid));
    }
    GPUFLEET_RETURN_IF_ERROR(node->probe_->SetLatentFault(options.faulty_gpu->index, true));
    node->faulty_gpu_ = options.faulty_gpu;
  }
  // A node that keeps task logs gets its simulated tasks' lines there, shipped as real ones are.
  node->runner_ = std::make_unique<runner::SimulatedRunner>(
      clock, runner::SimulatedRunnerOptions{.write_logs = !options.agent.log_dir.empty()});
  GPUFLEET_ASSIGN_OR_RETURN(node->sampler_,
                            TelemetrySampler::Create({.probe = *node->probe_,
                                                      .clock = clock,
                                                      .interval = options.sample_interval,
                                                      .hostname = options.agent.node_name}));
  node->diagnostics_ = std::make_unique<DiagnosticRunner>(DiagnosticOptions{}, *node->sampler_,
                                                          node->probe_.get(), clock);
  options.agent.diagnostics = node->diagnostics_.get();
  options.agent.diagnostics_inline = true;
  node->agent_ = std::make_unique<NodeAgent>(std::move(options.agent), *node->sampler_,
                                             *node->probe_, *node->runner_, client, catalog, clock);
  return node;
}

Status SimulatedNode::UpdateLoads() {
  GPUFLEET_RETURN_IF_ERROR(ApplyTaskLoads(*agent_, *runner_, *probe_));
  return PlayFault();
}

Status SimulatedNode::PlayFault() {
  if (!faulty_gpu_) {
    return Status::Ok();
  }
  std::optional<std::string> task_on_it;  // the running task that holds the faulty GPU
  for (const runner::TaskStatus& task : runner_->Poll()) {
    if (task.state != runner::TaskState::kRunning) {
      continue;
    }
    for (const std::string& uuid : task.gpu_uuids) {
      const auto index = agent_->gpu_index_by_uuid().find(uuid);
      if (index != agent_->gpu_index_by_uuid().end() && index->second == faulty_gpu_->index) {
        task_on_it = task.task_id;
      }
    }
  }
  if (!fault_reported_at_) {
    if (task_on_it) {
      GPUFLEET_RETURN_IF_ERROR(probe_->InjectXid(faulty_gpu_->index, faulty_gpu_->xid));
      fault_reported_at_ = clock_.Now();
      failed_task_ = *task_on_it;
    }
    return Status::Ok();
  }
  // The failed task must be gone first: the server learns of the XID before it stops the run.
  if (clock_.Now() - *fault_reported_at_ < faulty_gpu_->recover_after ||
      task_on_it == failed_task_) {
    return Status::Ok();
  }
  GPUFLEET_RETURN_IF_ERROR(probe_->ResetGpu(faulty_gpu_->index));
  GPUFLEET_RETURN_IF_ERROR(sampler_->ClearXidHistory(faulty_gpu_->index));
  fault_reported_at_.reset();
  failed_task_.clear();
  return Status::Ok();
}

Status ApplyTaskLoads(const NodeAgent& agent, runner::TaskRunner& runner, SimulatedProbe& probe) {
  const int gpu_count = static_cast<int>(agent.gpu_index_by_uuid().size());
  std::map<std::string, int64_t> milli_by_task;
  for (const wire::DesiredTask& task : agent.desired_tasks()) {
    milli_by_task[task.id] = task.gpu_milli;
  }
  std::vector<int64_t> utilization(static_cast<size_t>(gpu_count), 0);
  std::set<std::string> running_uuids;
  for (const runner::TaskStatus& task : runner.Poll()) {
    if (task.state != runner::TaskState::kRunning || task.gpu_uuids.empty()) {
      continue;
    }
    running_uuids.insert(task.gpu_uuids.begin(), task.gpu_uuids.end());
    const int64_t level = 55 + static_cast<int64_t>(std::hash<std::string>{}(task.task_id) % 41);
    const auto milli = milli_by_task.find(task.task_id);
    const int64_t share_milli =
        milli == milli_by_task.end()
            ? 1000
            : std::max<int64_t>(1, milli->second / static_cast<int64_t>(task.gpu_uuids.size()));
    for (const std::string& uuid : task.gpu_uuids) {
      const auto index = agent.gpu_index_by_uuid().find(uuid);
      if (index != agent.gpu_index_by_uuid().end() && index->second < gpu_count) {
        utilization[static_cast<size_t>(index->second)] +=
            level * std::min<int64_t>(share_milli, 1000) / 1000;
      }
    }
  }
  for (const auto& [gpu, devices] : agent.mig_devices()) {
    for (const MigDeviceInfo& device : devices) {
      const Status marked = probe.SetMigDeviceInUse(gpu, device.gpu_instance_id,
                                                    running_uuids.count(device.uuid) > 0);
      // A device the agent knows of but the probe no longer has is the agent's to find out.
      if (!marked.ok() && marked.code() != StatusCode::kNotFound) {
        return marked;
      }
    }
  }
  for (int gpu = 0; gpu < gpu_count; ++gpu) {
    const int64_t busy = std::min<int64_t>(utilization[static_cast<size_t>(gpu)], 100);
    GPUFLEET_RETURN_IF_ERROR(
        probe.SetLoad(gpu, {.utilization_percent = busy,
                            .memory_used_mib = 0,
                            .pattern = busy > 0 ? LoadPattern::kTraining : LoadPattern::kSteady}));
  }
  return Status::Ok();
}

}  // namespace gpufleet::agent
