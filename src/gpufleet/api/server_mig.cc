// SPDX-License-Identifier: Apache-2.0
// MIG layouts in the server (docs/agent.md, "MIG layouts"): the layout each MIG GPU should have,
// what agents are told to apply, and new layouts planned for pending MIG jobs that fit no
// current one.
#include "gpufleet/api/server_mig.h"

#include <algorithm>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/api/scheduling_view.h"
#include "gpufleet/api/server.h"
#include "gpufleet/policy/mig_planner.h"
#include "gpufleet/scheduler/devices.h"

namespace gpufleet::api {
namespace {

std::vector<std::pair<std::string, int>> Keys(const std::vector<MigInstance>& instances) {
  std::vector<std::pair<std::string, int>> keys;
  for (const MigInstance& instance : instances) {
    keys.emplace_back(instance.profile, instance.start);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

// The new layout of `plan.gpu` written into its node document, with an event on the node and on
// each job it serves. False when the node changed under the plan (a GPU gone, an instance to
// destroy no longer there): the next capacity epoch plans again.
Result<bool> WriteMigGpuPlan(store::StateStore& store, const GpuCatalog& catalog,
                             const policy::MigGpuPlan& plan, const std::set<std::string>& jobs) {
  GPUFLEET_ASSIGN_OR_RETURN(const GpuModelInfo* model, catalog.Find(plan.model));
  const std::string node = plan.node.value();
  for (int attempt = 0; attempt < kCasAttempts; ++attempt) {
    GPUFLEET_ASSIGN_OR_RETURN(const store::StoredObject stored, store.Get(kNodesKind, node));
    Json doc = ParseDocument(stored.data);
    if (!doc.contains("gpus") || !doc["gpus"].is_array()) {
      return false;
    }
    Json* gpu = nullptr;
    for (Json& candidate : doc["gpus"]) {
      if (IntOr(candidate, "index", -1) == plan.gpu && BoolOr(candidate, "mig_enabled", false)) {
        gpu = &candidate;
      }
    }
    if (gpu == nullptr) {
      return false;
    }
    // The stored layout, not the planner's: the instances placements created stay theirs.
    Result<std::vector<MigInstance>> layout =
        policy::ApplyMigGpuPlan(*model, MigInstancesFromJson(ArrayOr(*gpu, "mig_instances")), plan);
    if (!layout.ok()) {
      return false;
    }
    (*gpu)["mig_instances"] = MigInstancesToJsonList(*layout);
    const std::string change =
        fmt::format("destroy {}; create {}", DescribeMigInstances(plan.destroy),
                    DescribeMigInstances(plan.create));
    store::WriteBatch batch;
    batch.Update(std::string(kNodesKind), node, doc.dump(), stored.version);
    batch.AppendEvent(std::string(kNodesKind), node,
                      fmt::format("gpu {}: new MIG layout for job {}: {}", plan.gpu,
                                  fmt::join(jobs, ", "), change));
    for (const std::string& job : jobs) {
      batch.AppendEvent(
          std::string(kJobsKind), job,
          fmt::format("MIG layout of {} gpu {} changed for it: {}", node, plan.gpu, change));
    }
    const Status status = store.Commit(batch);
    if (status.ok()) {
      return true;
    }
    if (status.code() != StatusCode::kAborted) {
      return status;
    }
  }
  return false;
}

}  // namespace

std::vector<MigInstance> MigInstancesFromJson(const Json& list) {
  std::vector<MigInstance> out;
  if (!list.is_array()) {
    return out;
  }
  for (const Json& instance : list) {
    out.push_back({StrOr(instance, "profile"), static_cast<int>(IntOr(instance, "start", 0))});
  }
  return out;
}

Json MigInstancesToJsonList(const std::vector<MigInstance>& instances) {
  Json out = Json::array();
  for (const MigInstance& instance : instances) {
    out.push_back({{"profile", instance.profile}, {"start", instance.start}});
  }
  return out;
}

bool SameMigInstances(const std::vector<MigInstance>& a, const std::vector<MigInstance>& b) {
  return Keys(a) == Keys(b);
}

void AddCreatedMigInstances(const Json& job, const std::string& node,
                            std::map<int, std::vector<MigInstance>>& created) {
  if (!HoldsResources(StrOr(job, "state"))) {
    return;
  }
  for (const Json& placement : ArrayOr(job, "placements")) {
    const std::string phase = StrOr(placement, "phase");
    if (StrOr(placement, "node") != node || phase == "Succeeded" || phase == "Failed") {
      continue;
    }
    const Json& gpus = ArrayOr(placement, "gpus");
    const Json& assignments = ArrayOr(placement, "assignments");
    for (size_t i = 0; i < assignments.size() && i < gpus.size(); ++i) {
      const Json& assignment = assignments[i];
      if (BoolOr(assignment, "mig_created", false) && gpus[i].is_number_integer()) {
        created[gpus[i].get<int>()].push_back(
            {StrOr(assignment, "mig_profile"),
             static_cast<int>(IntOr(assignment, "mig_start", 0))});
      }
    }
  }
}

std::vector<WantedMigLayout> MigLayoutsToApply(
    const Json& node_doc, const std::map<int, std::vector<MigInstance>>& created) {
  std::vector<WantedMigLayout> out;
  for (const Json& gpu : ArrayOr(node_doc, "gpus")) {
    if (!BoolOr(gpu, "mig_enabled", false)) {
      continue;
    }
    WantedMigLayout layout;
    layout.gpu_index = static_cast<int>(IntOr(gpu, "index", -1));
    layout.instances = MigInstancesFromJson(ArrayOr(gpu, "mig_instances"));
    if (const auto it = created.find(layout.gpu_index); it != created.end()) {
      layout.instances.insert(layout.instances.end(), it->second.begin(), it->second.end());
    }
    if (SameMigInstances(layout.instances, MigInstancesFromJson(ArrayOr(gpu, "mig_devices")))) {
      continue;
    }
    std::sort(layout.instances.begin(), layout.instances.end(),
              [](const MigInstance& a, const MigInstance& b) {
                return std::tie(a.start, a.profile) < std::tie(b.start, b.profile);
              });
    out.push_back(std::move(layout));
  }
  return out;
}

const Json* FindMigDevice(const Json& gpu_doc, const std::string& profile, int start) {
  for (const Json& device : ArrayOr(gpu_doc, "mig_devices")) {
    if (StrOr(device, "profile") == profile && IntOr(device, "start", -1) == start) {
      return &device;
    }
  }
  return nullptr;
}

Status ApiServer::PlanMigLayoutsForPendingJobs() {
  const uint64_t epoch = view_->capacity_epoch();
  // Pending jobs with MIG tasks that did not fit the layouts as they are now.
  std::vector<policy::MigRequest> requests;
  std::map<std::string, std::string> job_of_request;
  std::set<std::string> jobs;
  for (const auto& [name, job] : view_->jobs()) {
    if (job.state != "Pending" || job.unschedulable_epoch != epoch || !job.spec ||
        !job.spec->ok() || job.reason.find(scheduler::kNoMigSlotReason) == std::string::npos) {
      continue;
    }
    for (policy::MigRequest& request : policy::MigRequestsOf(**job.spec)) {
      job_of_request[request.id] = name;
      requests.push_back(std::move(request));
      jobs.insert(name);
    }
  }
  // The planner sees the same GPUs and requests until the epoch moves or a job is new to it.
  if (requests.empty() || (epoch == mig_planned_epoch_ &&
                           std::includes(mig_planned_jobs_.begin(), mig_planned_jobs_.end(),
                                         jobs.begin(), jobs.end()))) {
    return Status::Ok();
  }
  mig_planned_epoch_ = epoch;
  mig_planned_jobs_ = jobs;
  // Only GPUs whose agent can apply a layout, on Ready nodes, in service.
  std::vector<policy::MigGpu> gpus;
  for (policy::MigGpu& gpu : policy::MigGpusOf(view_->snapshot())) {
    const auto node = view_->nodes().find(gpu.node.value());
    if (node == view_->nodes().end() || !node->second.agent ||
        node->second.node.state != NodeState::kReady) {
      continue;
    }
    const auto label = node->second.node.labels.find(std::string(kMigLayoutsLabel));
    const bool in_service = std::any_of(
        node->second.node.gpus.begin(), node->second.node.gpus.end(), [&](const Gpu& g) {
          return g.index == gpu.gpu &&
                 (g.health == GpuHealth::kHealthy || g.health == GpuHealth::kDegraded);
        });
    if (label != node->second.node.labels.end() && label->second == "true" && in_service) {
      gpus.push_back(std::move(gpu));
    }
  }
  if (gpus.empty()) {
    return Status::Ok();
  }
  const Result<policy::MigPlan> plan = policy::PlanMigLayouts(options_.catalog, gpus, requests);
  if (!plan.ok()) {
    // A request the planner refuses (a model it does not know, say) must not stop the cycle;
    // the job keeps its reason.
    fmt::print(stderr, "gpufleet server: MIG planning: {}\n", plan.status().ToString());
    return Status::Ok();
  }
  bool wrote = false;
  for (const policy::MigGpuPlan& gpu_plan : plan->gpus) {
    std::set<std::string> served;
    for (const std::string& request : gpu_plan.serves) {
      served.insert(job_of_request[request]);
    }
    GPUFLEET_ASSIGN_OR_RETURN(const bool written,
                              WriteMigGpuPlan(options_.store, options_.catalog, gpu_plan, served));
    wrote = wrote || written;
  }
  if (wrote) {
    // The new instances are in the snapshot now, and the epoch has moved: the jobs are tried
    // again in this cycle.
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  return Status::Ok();
}

}  // namespace gpufleet::api
