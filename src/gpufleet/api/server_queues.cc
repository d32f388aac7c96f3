// SPDX-License-Identifier: Apache-2.0
// The queue side of the scheduling cycle (docs/utilization.md): the queue tree with quota and
// fair share, admission of placements, and preemption for priority and for reclaiming guarantees.
#include <algorithm>

#include <fmt/format.h>

#include "gpufleet/api/job_spec.h"
#include "gpufleet/api/scheduling_view.h"
#include "gpufleet/api/server.h"
#include "gpufleet/api/tenancy.h"
#include "gpufleet/policy/preemption.h"

namespace gpufleet::api {
namespace {

// Milli-GPU by model that `placements` take.
policy::GpuMilliByModel AllocationOf(const std::vector<scheduler::TaskPlacement>& placements,
                                     const scheduler::ClusterSnapshot& snapshot) {
  policy::GpuMilliByModel allocation;
  for (const scheduler::TaskPlacement& placement : placements) {
    const scheduler::NodeInfo& node = snapshot.nodes()[placement.node];
    for (const scheduler::GpuAssignment& gpu : placement.gpus) {
      allocation[snapshot.Model(node.gpus[gpu.gpu].model_id).name] += gpu.milli;
    }
  }
  return allocation;
}

// True when `queue` is `ancestor` or lies below it.
bool IsWithin(std::string_view queue, std::string_view ancestor) {
  return queue == ancestor ||
         (queue.size() > ancestor.size() && queue.substr(0, ancestor.size()) == ancestor &&
          queue[ancestor.size()] == '/');
}

}  // namespace

int64_t ApiServer::CycleSeconds() const {
  return std::chrono::duration_cast<std::chrono::seconds>(options_.clock.Now() - started_at_)
      .count();
}

void ApiServer::UpdateQueueTree() {
  if (view_->TakeQueuesChanged() || !queue_tree_) {
    const Result<std::vector<store::StoredObject>> stored = options_.store.List(kQueuesKind);
    std::vector<Queue> queues;
    if (stored.ok()) {
      for (const store::StoredObject& object : *stored) {
        queues.push_back(QueueFromJson(ParseDocument(object.data)));
      }
    }
    Result<policy::QueueTree> tree = BuildQueueTree(
        queues,
        {.usage_half_life_seconds = std::max<int64_t>(1, options_.usage_half_life.count())});
    if (!stored.ok() || !tree.ok()) {
      // Keep the tree we have (or order by priority alone) until the queues are readable again.
      fmt::print(stderr, "gpufleet server: queue tree: {}\n",
                 (stored.ok() ? tree.status() : stored.status()).ToString());
      view_->ReadAllAgain();
    } else {
      queue_tree_.emplace(std::move(*tree));
      charged_.clear();
    }
  }
  if (!queue_tree_) {
    return;
  }
  policy::QueueTree& tree = *queue_tree_;
  (void)tree.Advance(std::max(CycleSeconds(), tree.last_advance_seconds()));
  const scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  policy::GpuMilliByModel capacity;
  for (const scheduler::NodeInfo& node : snapshot.nodes()) {
    for (const scheduler::GpuSlot& gpu : node.gpus) {
      capacity[snapshot.Model(gpu.model_id).name] += kMilliPerUnit;
    }
  }
  tree.SetCapacity(std::move(capacity));
  // Follow the view: charge what holds resources, release what no longer does.
  for (auto it = charged_.begin(); it != charged_.end();) {
    const auto job = view_->jobs().find(it->first);
    if (job == view_->jobs().end() || !job->second.applied) {
      (void)tree.Release(JobId(it->first));
      it = charged_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [name, job] : view_->jobs()) {
    if (!job.applied) {
      continue;
    }
    auto it = charged_.find(name);
    if (it != charged_.end() && it->second.version == job.version) {
      continue;  // placements change only with the job's version
    }
    policy::GpuMilliByModel allocation = AllocationOf(job.placements, snapshot);
    if (it != charged_.end() && it->second.allocation == allocation) {
      it->second.version = job.version;
      continue;
    }
    if (it != charged_.end()) {
      (void)tree.Release(JobId(name));
    }
    const QueueId queue(job.queue);
    const QueueId charged_queue =
        tree.StatusOf(queue).ok() ? queue : QueueId(std::string(kDefaultQueue));
    if (tree.Charge(JobId(name), charged_queue, allocation).ok()) {
      const int64_t since = it != charged_.end() ? it->second.since_seconds : CycleSeconds();
      charged_[name] = {std::move(allocation), since, job.version};
    }
  }
}

void ApiServer::PublishQueueStatus() {
  if (!queue_tree_) {
    return;
  }
  std::map<std::string, policy::QueueStatus> status;
  for (const QueueId& queue : queue_tree_->Queues()) {
    if (Result<policy::QueueStatus> one = queue_tree_->StatusOf(queue); one.ok()) {
      status[queue.value()] = std::move(*one);
    }
  }
  std::lock_guard<std::mutex> lock(queue_status_mu_);
  queue_status_ = std::move(status);
}

std::map<std::string, policy::QueueStatus> ApiServer::QueueStatuses() {
  std::lock_guard<std::mutex> lock(queue_status_mu_);
  return queue_status_;
}

void ApiServer::OrderPendingJobs(std::vector<PendingEntry>& pending) const {
  std::sort(pending.begin(), pending.end(), [](const PendingEntry& a, const PendingEntry& b) {
    return std::tie(b.job->priority, a.job->submit_seq, *a.name) <
           std::tie(a.job->priority, b.job->submit_seq, *b.name);
  });
  if (!queue_tree_) {
    return;
  }
  std::map<std::string, PendingEntry> by_name;
  std::vector<policy::PendingJob> jobs;
  for (const PendingEntry& entry : pending) {
    const QueueId queue(entry.job->queue);
    jobs.push_back({JobId(*entry.name),
                    queue_tree_->StatusOf(queue).ok() ? queue : QueueId(std::string(kDefaultQueue)),
                    entry.job->priority, entry.job->submit_seq});
    by_name[*entry.name] = entry;
  }
  if (!queue_tree_->Order(jobs).ok()) {
    return;
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    pending[i] = by_name.at(jobs[i].id.value());
  }
}

std::optional<std::string> ApiServer::AdmitPlacement(
    const std::string& name, const ViewJob& job,
    const std::vector<scheduler::TaskPlacement>& placed) {
  if (!queue_tree_) {
    return std::nullopt;
  }
  policy::GpuMilliByModel allocation = AllocationOf(placed, view_->snapshot());
  const QueueId queue(job.queue);
  const Result<policy::Admission> admission = queue_tree_->CheckAdmission(queue, allocation);
  if (!admission.ok()) {
    return std::nullopt;  // a queue the tree does not know: the submission checks guard that
  }
  if (!admission->admitted()) {
    return admission->reason;
  }
  // Charged now, so the next admission in this cycle sees it.
  if (queue_tree_->Charge(JobId(name), queue, allocation).ok()) {
    // The version the job has once the cycle's write lands.
    charged_[name] = {std::move(allocation), CycleSeconds(), job.version + 1};
  }
  return std::nullopt;
}

Result<std::optional<std::string>> ApiServer::TryPreemption(const std::string& name,
                                                            const Job& preemptor,
                                                            const std::string& queue,
                                                            Random& random) {
  // Queues over their guarantee that `queue` may reclaim from (none when it holds its whole
  // guarantee already).
  std::vector<std::string> reclaimable;
  if (queue_tree_) {
    if (const Result<std::vector<policy::QueueExcess>> over =
            queue_tree_->ReclaimCandidates(QueueId(queue));
        over.ok()) {
      for (const policy::QueueExcess& excess : *over) {
        reclaimable.push_back(excess.queue.value());
      }
    }
  }
  std::vector<policy::RunningJob> running;
  for (auto& [other, job] : view_->jobs()) {
    if (!job.applied || other == name) {
      continue;
    }
    if (!job.spec) {
      job.spec = ParseJobSpec(ParseDocument(job.data)["spec"].dump(), options_.catalog);
    }
    const auto charged = charged_.find(other);
    running.push_back(
        {.id = JobId(other),
         .queue = QueueId(job.queue),
         .priority = job.priority,
         .preemptible = job.spec->ok() && (*job.spec)->preemptible,
         .start_seconds = charged != charged_.end()
                              ? std::min(charged->second.since_seconds, CycleSeconds())
                              : CycleSeconds(),
         .placements = job.placements});
  }
  const policy::PreemptionRule rule = [&](const Job&, const policy::RunningJob& victim) {
    if (victim.queue.value() == queue) {
      return victim.priority < preemptor.priority;
    }
    return std::any_of(reclaimable.begin(), reclaimable.end(), [&](const std::string& over) {
      return IsWithin(victim.queue.value(), over);
    });
  };
  // Nothing to ask the search when no running job may be preempted by this one.
  if (std::none_of(running.begin(), running.end(), [&](const policy::RunningJob& victim) {
        return victim.preemptible && rule(preemptor, victim);
      })) {
    return std::optional<std::string>();
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      policy::PreemptionSearch search,
      policy::PreemptionSearch::Create(
          *scheduler_, rule,
          {.min_runtime_seconds = std::chrono::duration_cast<std::chrono::seconds>(
                                      options_.min_runtime_before_preemption)
                                      .count()}));
  GPUFLEET_ASSIGN_OR_RETURN(
      const policy::PreemptionDecision decision,
      search.Find(view_->snapshot(), preemptor, running, CycleSeconds(), random));
  if (!decision.plan || decision.plan->victims.empty()) {
    return std::optional<std::string>();
  }
  // Stop the victims now; the preemptor is placed by a later cycle, once their GPUs are free.
  store::WriteBatch batch;
  std::vector<std::string> victims;
  for (const JobId& victim_id : decision.plan->victims) {
    const std::string& victim = victim_id.value();
    const ViewJob& job = view_->jobs().at(victim);
    const std::string why =
        job.queue == queue
            ? fmt::format("preempted by job {} (priority {} over {})", name, preemptor.priority,
                          job.priority)
            : fmt::format("preempted by job {}: queue {} reclaims its guarantee from queue {}",
                          name, queue, job.queue);
    const Json before = ParseDocument(job.data);
    Json doc = before;
    doc["state"] = "Preempted";
    doc["placements"] = Json::array();
    doc["reason"] = why;
    doc["preempted_by"] = name;
    reliability_->NoteJobChange(before, doc, batch);
    batch.Update(std::string(kJobsKind), victim, doc.dump(), job.version);
    batch.AppendEvent(std::string(kJobsKind), victim, why);
    victims.push_back(victim);
  }
  const std::string message =
      fmt::format("preempting {} ({} GPUs in {}) to make room", fmt::join(victims, ", "),
                  static_cast<double>(decision.plan->preempted_gpu_milli) / kMilliPerUnit,
                  decision.plan->domain);
  batch.AppendEvent(std::string(kJobsKind), name, message);
  if (const Status status = options_.store.Commit(batch); !status.ok()) {
    for (const std::string& victim : victims) {
      view_->ReadJobAgain(victim);
    }
    if (status.code() == StatusCode::kAborted || status.code() == StatusCode::kNotFound) {
      return std::optional<std::string>();
    }
    return status;
  }
  return std::optional<std::string>(
      fmt::format("waiting for preempted jobs {} to stop", fmt::join(victims, ", ")));
}

Result<bool> ApiServer::RequeuePreemptedJobs() {
  bool wrote = false;
  for (const auto& [name, job] : view_->jobs()) {
    if (job.state != "Preempted") {
      continue;
    }
    Json doc = ParseDocument(job.data);
    doc["state"] = "Pending";
    const std::string why =
        fmt::format("requeued after preemption by job {}", StrOr(doc, "preempted_by", "?"));
    doc["reason"] = why;
    store::WriteBatch batch;
    batch.Update(std::string(kJobsKind), name, doc.dump(), job.version);
    batch.AppendEvent(std::string(kJobsKind), name, why);
    const Status status = options_.store.Commit(batch);
    if (!status.ok()) {
      view_->ReadJobAgain(name);
      if (status.code() != StatusCode::kAborted && status.code() != StatusCode::kNotFound) {
        return status;
      }
    }
    wrote = wrote || status.ok();
  }
  return wrote;
}

}  // namespace gpufleet::api
