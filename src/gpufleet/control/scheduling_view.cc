// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/scheduling_view.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/control/placement_gpus.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/json_scan.h"
#include "gpufleet/policy/never_fits.h"
#include "gpufleet/wire/node_json.h"

namespace gpufleet::control {
namespace {

// Whether a stored job document says it has finished, read without parsing the document; false
// when it cannot tell (the caller parses it).
bool StoredAsFinished(const std::string& data) {
  const std::optional<std::string> text = TopLevelString(data, "state");
  const std::optional<JobState> state = text ? ParseJobState(*text) : std::nullopt;
  return state && IsFinished(*state);
}

// The stored job `data` as a record, without its spec (parsed apart, on first need: ViewJob::spec);
// the error names the field the record cannot read.
Result<wire::JobRecord> StoredRecord(const std::string& name, const std::string& data) {
  Result<wire::JobRecord> record =
      wire::JobRecordFromJson(wire::ParseDocumentWithout(data, "spec"), nullptr);
  if (!record.ok()) {
    return InvalidArgumentError(fmt::format("jobs/{}: {}", name, record.status().message()));
  }
  return record;
}

// The placements stored in a job the view holds (read when it was taken in).
std::vector<wire::PlacementRecord> StoredPlacements(const std::string& name,
                                                    const std::string& data) {
  Result<wire::JobRecord> record = StoredRecord(name, data);
  return record.ok() ? std::move(record)->placements : std::vector<wire::PlacementRecord>();
}

}  // namespace

std::optional<std::vector<scheduler::TaskPlacement>> SnapshotPlacements(
    const std::vector<wire::PlacementRecord>& placements,
    const std::map<std::string, int>& node_index, const scheduler::ClusterSnapshot& snapshot) {
  std::vector<scheduler::TaskPlacement> out;
  for (const wire::PlacementRecord& p : placements) {
    if (PlacementGone(p)) {
      continue;
    }
    const auto it = node_index.find(p.node);
    if (it == node_index.end()) {
      return std::nullopt;
    }
    scheduler::TaskPlacement placement;
    placement.group = p.group;
    placement.replica = p.replica;
    placement.node = it->second;
    placement.host.cpu_milli = p.cpu_milli;
    placement.host.memory_mib = p.memory_mib;
    const std::vector<Gpu>& node_gpus = snapshot.nodes()[it->second].node->gpus;
    const std::vector<PlacedGpu> placed = PlacedGpus(p);
    for (size_t i = 0; i < placed.size(); ++i) {
      const auto gpu = std::find_if(node_gpus.begin(), node_gpus.end(), [&](const Gpu& candidate) {
        return placed[i].Is(candidate.uuid.value(), candidate.index);
      });
      if (gpu == node_gpus.end()) {
        continue;
      }
      const wire::PlacedAssignment& a = p.assignments[i];
      scheduler::GpuAssignment assignment;
      assignment.gpu = static_cast<int>(gpu - node_gpus.begin());
      assignment.milli = a.milli;
      assignment.memory_mib = a.memory_mib;
      assignment.mig_profile = a.mig_profile;
      assignment.mig_start = a.mig_start;
      assignment.mig_created = a.mig_created;
      assignment.mps = a.mps;
      placement.gpus.push_back(std::move(assignment));
    }
    out.push_back(std::move(placement));
  }
  return out;
}

const Result<Job>& ViewJobSpec(ViewJob& job, const GpuCatalog& catalog) {
  if (!job.spec) {
    job.spec = wire::StoredJobSpec(wire::ParseDocument(job.data), catalog);
  }
  return *job.spec;
}

SchedulingView::SchedulingView(store::StateStore& store, const GpuCatalog& catalog)
    : store_(store), catalog_(catalog) {
  store_.AddObserver(this);
}

SchedulingView::~SchedulingView() {
  store_.RemoveObserver(this);
}

void SchedulingView::Committed(const store::WriteBatch& batch) {
  NoteWrites(batch, /*outcome_known=*/true);
}

void SchedulingView::CommitFailed(const store::WriteBatch& batch) {
  NoteWrites(batch, /*outcome_known=*/false);
}

void SchedulingView::NoteWrites(const store::WriteBatch& batch, bool outcome_known) {
  std::lock_guard<std::mutex> lock(changes_mu_);
  for (const store::WriteOp& op : batch.ops()) {
    if (op.type == store::WriteOpType::kAppendEvent ||
        op.type == store::WriteOpType::kDeleteEvents) {
      continue;
    }
    if (op.kind == kJobsKind) {
      // Commits may be reported out of order: keep the highest version, and unknown for good.
      const int64_t written = outcome_known && op.type == store::WriteOpType::kUpdate
                                  ? op.expected_version + 1
                                  : kVersionUnknown;
      const auto [it, added] = changed_jobs_.try_emplace(op.name, written);
      if (!added && it->second != kVersionUnknown) {
        it->second = written == kVersionUnknown ? written : std::max(it->second, written);
      }
    } else if (op.kind == kNodesKind) {
      changed_nodes_.insert(op.name);
    } else if (op.kind == kClusterKind) {
      reload_all_ = true;
    } else if (op.kind == kQueuesKind) {
      queues_changed_ = true;
    }
  }
}

bool SchedulingView::TakeQueuesChanged() {
  std::lock_guard<std::mutex> lock(changes_mu_);
  return std::exchange(queues_changed_, false);
}

void SchedulingView::ReadJobAgain(const std::string& name) {
  std::lock_guard<std::mutex> lock(changes_mu_);
  changed_jobs_[name] = kVersionUnknown;
}

void SchedulingView::ReadAllAgain() {
  std::lock_guard<std::mutex> lock(changes_mu_);
  reload_all_ = true;
}

Status SchedulingView::Refresh() {
  std::set<std::string> nodes;
  std::map<std::string, int64_t> jobs;
  bool reload = false;
  {
    std::lock_guard<std::mutex> lock(changes_mu_);
    reload = reload_all_;
    reload_all_ = false;
    nodes.swap(changed_nodes_);
    jobs.swap(changed_jobs_);
  }
  if (reload) {
    // Changes noted from here on are read again by the next refresh; reading an object twice is
    // harmless.
    if (Status status = LoadAll(); !status.ok()) {
      std::lock_guard<std::mutex> lock(changes_mu_);
      reload_all_ = true;
      return status;
    }
    return Status::Ok();
  }
  Status status = Status::Ok();
  for (const std::string& name : nodes) {
    status = RefreshNode(name);
    if (!status.ok()) {
      break;
    }
  }
  if (status.ok() && !nodes.empty()) {
    status = UpdateSnapshot(nodes);
  }
  if (status.ok()) {
    std::vector<std::string> to_read;
    for (const auto& [name, written] : jobs) {
      if (const auto held = jobs_.find(name);
          written != kVersionUnknown && held != jobs_.end() && held->second.version == written) {
        continue;  // the cycle's own write, already in the view
      }
      to_read.push_back(name);
    }
    status = RefreshJobs(to_read);
  }
  if (!status.ok()) {
    // Read everything again next time rather than keep a view with a hole in it.
    std::lock_guard<std::mutex> lock(changes_mu_);
    reload_all_ = true;
  }
  return status;
}

Status SchedulingView::LoadAll() {
  {
    std::lock_guard<std::mutex> lock(changes_mu_);
    changed_nodes_.clear();
    changed_jobs_.clear();
  }
  Topology topology;
  Result<store::StoredObject> recorded = store_.Get(kClusterKind, kTopologyName);
  if (recorded.ok()) {
    std::vector<std::string> levels;
    const Json doc = wire::ParseDocument(recorded->data);
    for (const Json& level : wire::ArrayOr(doc, "levels")) {
      if (level.is_string()) {
        levels.push_back(level.get<std::string>());
      }
    }
    topology = Topology(std::move(levels));
  } else if (recorded.status().code() != StatusCode::kNotFound) {
    return recorded.status();
  }
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> nodes, store_.List(kNodesKind));
  std::map<std::string, ViewNode> loaded;
  excluded_.clear();
  for (const store::StoredObject& object : nodes) {
    if (std::optional<ViewNode> node = Accept(object, topology)) {
      loaded[object.name] = std::move(*node);
    }
  }
  // Finished jobs are most of the store: the state index leaves them out.
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> jobs,
                            store_.ListWhere(kJobsKind, UnfinishedJobs()));
  topology_ = std::move(topology);
  nodes_ = std::move(loaded);
  mig_enabled_nodes_.clear();
  not_ready_nodes_.clear();
  node_changes_.All();
  for (const auto& [name, node] : nodes_) {
    NoteNodeChanged(name, &node);
  }
  jobs_.clear();
  active_jobs_by_node_.clear();
  active_job_changes_.All();
  for (JobEntries& entries : jobs_by_state_) {
    entries.clear();
  }
  pending_by_queue_.clear();
  snapshot_.reset();
  GPUFLEET_RETURN_IF_ERROR(RebuildSnapshot());
  for (const store::StoredObject& object : jobs) {
    PutJob(object);
  }
  return Status::Ok();
}

Status SchedulingView::RefreshNode(const std::string& name) {
  Result<store::StoredObject> object = store_.Get(kNodesKind, name);
  if (!object.ok()) {
    if (object.status().code() == StatusCode::kNotFound) {
      nodes_.erase(name);
      NoteNodeChanged(name, nullptr);
      return Status::Ok();
    }
    return object.status();
  }
  excluded_.erase(name);
  if (std::optional<ViewNode> node = Accept(*object, topology_)) {
    ViewNode& held = nodes_[name] = std::move(*node);
    NoteNodeChanged(name, &held);
  } else {
    nodes_.erase(name);
    NoteNodeChanged(name, nullptr);
  }
  return Status::Ok();
}

void SchedulingView::NoteNodeChanged(const std::string& name, const ViewNode* node) {
  node_changes_.Note(name);
  if (node != nullptr && std::any_of(node->node.gpus.begin(), node->node.gpus.end(),
                                     [](const Gpu& gpu) { return gpu.mig_enabled; })) {
    mig_enabled_nodes_.insert(name);
  } else {
    mig_enabled_nodes_.erase(name);
  }
  if (node != nullptr && node->node.state == NodeState::kNotReady) {
    not_ready_nodes_.insert(name);
  } else {
    not_ready_nodes_.erase(name);
  }
}

std::optional<ViewNode> SchedulingView::Accept(const store::StoredObject& object,
                                               const Topology& topology) {
  const Json doc = wire::ParseDocument(object.data);
  Result<Node> node = wire::NodeFromJson(doc, topology.levels());
  Status status = node.status();
  if (node.ok()) {
    // A GPU held for a diagnostic takes no work, as an unhealthy one (its task, if any, ends
    // first: the agent runs the diagnostic once the GPU is free).
    const Json& gpus = wire::ArrayOr(doc, "gpus");
    for (size_t i = 0; i < gpus.size() && i < node->gpus.size(); ++i) {
      if (gpus[i].contains(kDiagnosticHoldField)) {
        node->gpus[i].health = GpuHealth::kUnhealthy;
      }
    }
    status = scheduler::ValidateNode(*node, topology, catalog_);
  }
  if (!status.ok()) {
    // One bad node document must not stop the cycle for every other node.
    const std::string reason = fmt::format("left out of scheduling: {}", status.message());
    if (excluded_[object.name] != reason) {
      newly_excluded_[object.name] = reason;
    }
    excluded_[object.name] = reason;
    return std::nullopt;
  }
  return ViewNode{object.version, std::move(node).value(), wire::BoolOr(doc, "agent", false)};
}

Status SchedulingView::RefreshJobs(const std::vector<std::string>& names) {
  // A few hundred names per store call: one round trip each on PostgreSQL, not one per job.
  constexpr size_t kNamesPerRead = 500;
  for (size_t begin = 0; begin < names.size(); begin += kNamesPerRead) {
    const std::vector<std::string> part(
        names.begin() + static_cast<std::ptrdiff_t>(begin),
        names.begin() + static_cast<std::ptrdiff_t>(std::min(names.size(), begin + kNamesPerRead)));
    GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> objects,
                              store_.GetMany(kJobsKind, part));
    // Both in name order: each job is taken in, or dropped, as a read of it alone would.
    auto object = objects.begin();
    for (const std::string& name : part) {
      if (object != objects.end() && object->name == name) {
        PutJob(*object++);
      } else if (auto it = jobs_.find(name); it != jobs_.end()) {
        UnindexJob(name);
        ReleaseJob(it->second);
        jobs_.erase(it);
      }
    }
  }
  return Status::Ok();
}

Status SchedulingView::RebuildSnapshot() {
  Cluster cluster;
  cluster.topology = topology_;
  for (const auto& [name, node] : nodes_) {
    cluster.nodes.push_back(node.node);
  }
  GPUFLEET_ASSIGN_OR_RETURN(scheduler::ClusterSnapshot snapshot,
                            scheduler::ClusterSnapshot::Build(std::move(cluster), catalog_));
  snapshot_.emplace(std::move(snapshot));
  node_index_.clear();
  for (const scheduler::NodeInfo& info : snapshot_->nodes()) {
    node_index_[info.node->id.value()] = info.index;
  }
  ++capacity_epoch_;
  ++shape_epoch_;
  for (auto& [name, job] : jobs_) {
    job.applied = false;
    job.placements.clear();
    if (HoldsResources(job.state)) {
      ApplyJob(name, job, StoredPlacements(name, job.data));
    }
  }
  return Status::Ok();
}

Status SchedulingView::UpdateSnapshot(const std::set<std::string>& changed) {
  if (!snapshot_) {
    return RebuildSnapshot();
  }
  std::map<int, const Node*> replaced;  // by snapshot index
  for (const std::string& name : changed) {
    const auto it = nodes_.find(name);
    const int index = NodeIndex(name);
    if ((it == nodes_.end()) != (index < 0)) {
      return RebuildSnapshot();  // added, removed or left out: the indices move
    }
    if (it != nodes_.end()) {
      replaced[index] = &it->second.node;
    }
  }
  if (replaced.empty()) {
    return Status::Ok();
  }
  for (const auto& [index, node] : replaced) {
    if (!policy::SameShapeForNeverFits(*snapshot_->nodes()[index].node, *node)) {
      ++shape_epoch_;
    }
    if (Status status = snapshot_->ReplaceNode(index, *node); !status.ok()) {
      // A domain or model new to the snapshot (the nodes replaced so far are rebuilt too).
      return RebuildSnapshot();
    }
  }
  ++capacity_epoch_;
  for (auto& [name, job] : jobs_) {
    if (!job.applied || std::none_of(job.nodes.begin(), job.nodes.end(),
                                     [&](const std::string& n) { return changed.count(n) > 0; })) {
      continue;
    }
    // The job's placements on the replaced nodes went with them: read them again from its
    // document (its GPUs are found by UUID on the new node) and apply them; the others stay.
    std::optional<std::vector<scheduler::TaskPlacement>> stored =
        SnapshotPlacements(StoredPlacements(name, job.data), node_index_, *snapshot_);
    std::vector<scheduler::TaskPlacement> kept = std::move(job.placements);
    job.placements.clear();
    for (scheduler::TaskPlacement& placement : stored.value_or(kept)) {
      if (replaced.count(placement.node) == 0) {
        // Applied before (one that did not fit then is not now either).
        if (const auto it = std::find(kept.begin(), kept.end(), placement); it != kept.end()) {
          kept.erase(it);
          job.placements.push_back(std::move(placement));
        }
        continue;
      }
      if (Status status = snapshot_->Apply(placement); !status.ok()) {
        fmt::print(stderr, "gpufleet server: jobs/{}: {}\n", name, status.ToString());
        continue;
      }
      job.placements.push_back(std::move(placement));
    }
  }
  return Status::Ok();
}

void SchedulingView::PutJob(const store::StoredObject& object) {
  UnindexJob(object.name);
  PutJobUnindexed(object);
  IndexJob(object.name);
}

void SchedulingView::UnindexJob(const std::string& name) {
  const auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return;
  }
  jobs_by_state_[static_cast<size_t>(it->second.state)].erase(&*it);
  if (it->second.state == JobState::kPending) {
    if (const auto count = pending_by_queue_.find(it->second.queue);
        count != pending_by_queue_.end() && --count->second == 0) {
      pending_by_queue_.erase(count);
    }
  }
  if (!HoldsResources(it->second.state)) {
    return;
  }
  for (const std::string& node : it->second.nodes) {
    if (const auto entry = active_jobs_by_node_.find(node); entry != active_jobs_by_node_.end()) {
      entry->second.erase(name);
      if (entry->second.empty()) {
        active_jobs_by_node_.erase(entry);
      }
    }
    active_job_changes_.Note(node);
  }
}

void SchedulingView::IndexJob(const std::string& name) {
  const auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return;
  }
  jobs_by_state_[static_cast<size_t>(it->second.state)].insert(&*it);
  if (it->second.state == JobState::kPending) {
    ++pending_by_queue_[it->second.queue];
  }
  if (!HoldsResources(it->second.state)) {
    return;
  }
  for (const std::string& node : it->second.nodes) {
    active_jobs_by_node_[node].insert(name);
    active_job_changes_.Note(node);
  }
}

void SchedulingView::PutJobUnindexed(const store::StoredObject& object) {
  auto it = jobs_.find(object.name);
  if (it != jobs_.end() && it->second.version == object.version && it->second.data == object.data) {
    return;  // the cycle's own commit, already in the view
  }
  if (it != jobs_.end() && object.version <= it->second.version) {
    // A version never goes back but for a job deleted and submitted again (it starts at 1 once
    // more): another job under the same name, whose spec and history the view must not reuse.
    ReleaseJob(it->second);
    jobs_.erase(it);
    it = jobs_.end();
  }
  if (StoredAsFinished(object.data)) {
    // A job ending is a third of the writes the view reads: it leaves without being parsed.
    if (it != jobs_.end()) {
      ReleaseJob(it->second);
      jobs_.erase(it);
    }
    return;
  }
  Result<wire::JobRecord> read = StoredRecord(object.name, object.data);
  if (!read.ok()) {
    // Never expected (the server writes these documents): the view keeps what it last read of
    // the job, so GPUs it held stay taken rather than being handed to another.
    fmt::print(stderr, "gpufleet server: {}\n", read.status().message());
    return;
  }
  const wire::JobRecord& record = *read;
  const JobState state = record.state;
  // A Pending job under a key other than its TEAM/NAME (one MigrateToTeamScopedNames could not
  // move, its key taken) holds nothing and is not placed: an administrator resolves it. One that
  // holds resources stays, so that its GPUs stay taken until its tasks are gone.
  if (IsFinished(state) ||
      (state == JobState::kPending && TeamScopedKey(record.team, record.name) != object.name)) {
    if (it != jobs_.end()) {
      ReleaseJob(it->second);
      jobs_.erase(it);
    }
    return;
  }
  if (it == jobs_.end()) {
    it = jobs_.emplace(object.name, ViewJob{}).first;
  }
  ViewJob& job = it->second;
  const bool was_pending = job.state == JobState::kPending;
  job.version = object.version;
  job.data = object.data;
  job.state = state;
  job.stopping_then.reset();
  if (state == JobState::kStopping && record.stopping) {
    job.stopping_then = record.stopping->then;
  }
  job.reason = record.reason;
  job.queue = record.queue.empty() ? std::string(kDefaultQueue) : record.queue;
  job.priority = record.priority;
  job.submit_seq = record.submit_seq;
  job.preempted_by = record.preempted_by.value_or("");
  job.expedited = record.expedited.has_value();
  job.last_checkpoint_ns = record.last_checkpoint_ns;
  job.notice = record.notice;
  job.world_size = record.world_size.value_or(0);
  job.releasing = 0;
  job.nodes.clear();
  for (const wire::PlacementRecord& placement : record.placements) {
    job.releasing += placement.release ? 1 : 0;
    job.nodes.insert(placement.node);
  }
  if (state != JobState::kPending || !was_pending) {
    job.unschedulable_epoch.reset();
    job.never_fits_epoch.reset();
  }
  if (!HoldsResources(state)) {
    ReleaseJob(job);
    return;
  }
  const std::optional<std::vector<scheduler::TaskPlacement>> placements =
      SnapshotPlacements(record.placements, node_index_, *snapshot_);
  if (job.applied && placements && *placements == job.placements) {
    return;
  }
  ReleaseJob(job);
  ApplyJob(object.name, job, record.placements);
}

void SchedulingView::ReleaseJob(ViewJob& job) {
  if (!job.applied) {
    return;
  }
  // Revert, not Release: the snapshot is rebuilt from the node documents, which do not record
  // MIG instances a job created, so the view forgets them as a rebuild would.
  for (auto it = job.placements.rbegin(); it != job.placements.rend(); ++it) {
    snapshot_->Revert(*it);
  }
  job.placements.clear();
  job.applied = false;
  ++capacity_epoch_;
}

void SchedulingView::ApplyJob(const std::string& name, ViewJob& job,
                              const std::vector<wire::PlacementRecord>& stored) {
  const std::optional<std::vector<scheduler::TaskPlacement>> placements =
      SnapshotPlacements(stored, node_index_, *snapshot_);
  if (!placements) {
    fmt::print(stderr, "gpufleet server: jobs/{}: a node of its placements is gone\n", name);
    return;
  }
  std::vector<scheduler::TaskPlacement> applied;
  for (const scheduler::TaskPlacement& placement : *placements) {
    // A placement that no longer fits (never expected: commits are compare-and-set) is reported
    // and left out rather than oversubscribing a GPU.
    if (Status status = snapshot_->Apply(placement); !status.ok()) {
      fmt::print(stderr, "gpufleet server: jobs/{}: {}\n", name, status.ToString());
      continue;
    }
    applied.push_back(placement);
  }
  job.placements = std::move(applied);
  job.applied = true;
}

int SchedulingView::NodeIndex(const std::string& name) const {
  const auto it = node_index_.find(name);
  return it == node_index_.end() ? -1 : it->second;
}

void SchedulingView::MarkScheduled(const std::string& name, int64_t version, std::string data,
                                   std::vector<scheduler::TaskPlacement> placements,
                                   std::set<std::string> nodes) {
  UnindexJob(name);
  ViewJob& job = jobs_[name];
  job.version = version;
  job.data = std::move(data);
  job.state = JobState::kScheduled;
  job.reason.clear();
  job.placements = std::move(placements);
  job.applied = true;
  job.nodes = std::move(nodes);
  job.unschedulable_epoch.reset();
  IndexJob(name);
}

void SchedulingView::MarkReasonWritten(const std::string& name, int64_t version, std::string data) {
  const auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return;
  }
  it->second.version = version;
  it->second.data = std::move(data);
}

}  // namespace gpufleet::control
