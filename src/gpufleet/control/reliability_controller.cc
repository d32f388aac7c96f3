// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/reliability_controller.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/lifecycle_controller.h"
#include "gpufleet/control/placement_gpus.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/cluster.h"
#include "gpufleet/core/json_scan.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/reliability/inventory.h"
#include "gpufleet/reliability/outcome.h"
#include "gpufleet/reliability/xid_catalog.h"
#include "gpufleet/store/read_modify_write.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/job_record.h"

namespace gpufleet::control {
namespace {

using reliability::AuditAction;
using reliability::AuditEntry;
using reliability::Device;
using reliability::DeviceEvidence;
using reliability::DeviceKind;
using reliability::DrainMode;
using reliability::QuarantineSource;

// Compare-and-set retries of one write before the step gives up until the next one.
constexpr int kWriteAttempts = 5;
// More XIDs of one code in one run say nothing more.
constexpr int kMaxXidsPerCode = 10;

bool IsRunGoing(std::string_view state) {
  const std::optional<JobState> typed = ParseJobState(state);
  return typed && RunIsWanted(*typed);
}

std::string QuarantinedName() {
  return GpuHealthName(GpuHealth::kQuarantined);
}

// A GPU's id in outcome records and the inventory: its UUID, or NODE/gpuINDEX for a GPU
// registered without one.
std::string GpuKey(const Json& gpu, std::string_view node, int64_t index) {
  const std::string uuid = wire::StrOr(gpu, "uuid");
  return uuid.empty() ? fmt::format("{}/gpu{}", node, index) : uuid;
}

std::string QuarantineDocName(const Device& device) {
  return fmt::format("{}:{}", reliability::DeviceKindName(device.kind), device.id);
}

std::optional<Device> DeviceOfDoc(const Json& doc) {
  const std::string kind = wire::StrOr(doc, "device");
  const std::string id = wire::StrOr(doc, "id");
  if (id.empty() || (kind != "gpu" && kind != "node")) {
    return std::nullopt;
  }
  return Device{kind == "gpu" ? DeviceKind::kGpu : DeviceKind::kNode, id};
}

// The document of an operator's quarantine of one GPU in force, over its earlier one (`record`,
// an empty object for none): a released GPU's evidence start stays.
Json OperatorQuarantineRecord(Json record, std::string_view key, std::string_view node,
                              int64_t index, std::string_view actor, std::string_view reason,
                              int64_t now) {
  record.update({{"device", "gpu"},
                 {"id", key},
                 {"node", node},
                 {"gpu", index},
                 {"state", "quarantined"},
                 {"source", reliability::QuarantineSourceName(QuarantineSource::kOperator)},
                 {"actor", actor},
                 {"reason", reason},
                 {"mode", reliability::DrainModeName(DrainMode::kAfterJob)},
                 {"since_ns", now}});
  return record;
}

// A quarantine document once its device is back in service: it starts clean.
void MarkReleased(Json& record, int64_t now) {
  record["state"] = "released";
  record["released_ns"] = now;
  record["evidence_since_ns"] = now;
}

std::optional<QuarantineSource> ParseSource(std::string_view name) {
  for (const QuarantineSource source :
       {QuarantineSource::kAttribution, QuarantineSource::kHealthRule,
        QuarantineSource::kOperator}) {
    if (name == reliability::QuarantineSourceName(source)) {
      return source;
    }
  }
  return std::nullopt;
}

// The loop's circuit breaker: its document in kind "cluster".
constexpr std::string_view kBreakerName = "reliability-breaker";
// A loop step's state in the GPU's document in kind "quarantines".
constexpr char kLoopField[] = "loop";

// One audited step of a device: the update of its node's document at `node_version` and its own
// document `name` in kind "quarantines" (created when it has no `version` yet), each with `event`.
store::WriteBatch DeviceStepBatch(const std::string& node, const Json& node_doc,
                                  int64_t node_version, const std::string& name, const Json& record,
                                  std::optional<int64_t> version, const std::string& event) {
  store::WriteBatch batch;
  batch.Update(std::string(kNodesKind), node, node_doc.dump(), node_version);
  batch.AppendEvent(std::string(kNodesKind), node, event);
  if (version) {
    batch.Update(std::string(kQuarantinesKind), name, record.dump(), *version);
  } else {
    batch.Create(std::string(kQuarantinesKind), name, record.dump());
  }
  batch.AppendEvent(std::string(kQuarantinesKind), name, event);
  return batch;
}

// JSON has no infinity: a rate ratio with nothing expected is null.
Json Number(double value) {
  return std::isfinite(value) ? Json(value) : Json(nullptr);
}

}  // namespace

const char* LoopDrainName(LoopDrain drain) {
  switch (drain) {
    case LoopDrain::kNow:
      return "now";
    case LoopDrain::kAfterJob:
      return "after-job";
    case LoopDrain::kAfterTimeout:
      return "after-timeout";
  }
  return "after-job";
}

std::optional<LoopDrain> ParseLoopDrain(std::string_view name) {
  for (const LoopDrain drain : {LoopDrain::kNow, LoopDrain::kAfterJob, LoopDrain::kAfterTimeout}) {
    if (name == LoopDrainName(drain)) {
      return drain;
    }
  }
  return std::nullopt;
}

Status HealthLoopOptions::Validate() const {
  if (diagnostic_kind != "builtin" && diagnostic_kind != "command") {
    return InvalidArgumentError(
        fmt::format("loop.diagnostic_kind: \"{}\" (must be builtin or command)", diagnostic_kind));
  }
  if (suspect_min_failures < 1 || !(suspect_max_p > 0 && suspect_max_p <= 1)) {
    return InvalidArgumentError(
        fmt::format("loop.suspect_min_failures {}, suspect_max_p {} (must be >= 1 and in (0, 1])",
                    suspect_min_failures, suspect_max_p));
  }
  if (max_remediations < 0) {
    return InvalidArgumentError(
        fmt::format("loop.max_remediations: {} (must be >= 0)", max_remediations));
  }
  if (!(breaker_share > 0 && breaker_share <= 1)) {
    return InvalidArgumentError(
        fmt::format("loop.breaker_share: {} (must be in (0, 1])", breaker_share));
  }
  if (drain_timeout.count() < 0 || breaker_window.count() < 0 || remediation_window.count() < 0) {
    return InvalidArgumentError(fmt::format(
        "loop.drain_timeout {}s, breaker_window {}s, remediation_window {}s (must be >= 0)",
        drain_timeout.count(), breaker_window.count(), remediation_window.count()));
  }
  return Status::Ok();
}

Status ReliabilityOptions::Validate() const {
  if (Status status = loop.Validate(); !status.ok()) {
    return InvalidArgumentError(fmt::format("reliability.{}", status.message()));
  }
  if (interval.count() < 0) {
    return InvalidArgumentError(
        fmt::format("reliability.interval: {} ms (must be >= 0)", interval.count()));
  }
  if (quiet_interval.count() < 0) {
    return InvalidArgumentError(
        fmt::format("reliability.quiet_interval: {} ms (must be >= 0)", quiet_interval.count()));
  }
  if (Status status = attribution.Validate(); !status.ok()) {
    return InvalidArgumentError(fmt::format("reliability.attribution.{}", status.message()));
  }
  if (Status status = budget.Validate(); !status.ok()) {
    return InvalidArgumentError(fmt::format("reliability.budget.{}", status.message()));
  }
  return Status::Ok();
}

// The fleet as the node documents describe it, with dense indices for the reliability library.
struct ReliabilityController::Fleet {
  struct Gpu {
    std::string node;
    int64_t index = 0;  // position on its node
    std::string key;    // GpuKey
    std::string health;
    std::string drain;  // what the agent's health rules ask: "none", "after-job", "now"
    Json reasons = Json::array();
    // The loop's hold for a diagnostic ("diagnostic" of the node document's GPU), or null.
    Json diagnostic;
    bool diagnosable = false;  // its node's agent runs diagnostics
  };
  reliability::FleetInventory inventory;
  std::vector<Gpu> gpus;  // by inventory GPU index

  const Gpu* FindGpu(std::string_view key) const {
    const int index = inventory.GpuIndex(key);
    return index < 0 ? nullptr : &gpus[static_cast<size_t>(index)];
  }
  bool IsQuarantined(const Device& device) const {
    const int index = inventory.IndexOf(device);
    if (index < 0) {
      return false;
    }
    if (device.kind == DeviceKind::kGpu) {
      return gpus[static_cast<size_t>(index)].health == QuarantinedName();
    }
    const std::vector<int>& node_gpus = inventory.gpus_of_node(index);
    return !node_gpus.empty() && std::all_of(node_gpus.begin(), node_gpus.end(), [&](int gpu) {
      return gpus[static_cast<size_t>(gpu)].health == QuarantinedName();
    });
  }
};

// One analysis: the fleet, a monitor fed with the stored outcomes and holding the quarantines
// in force, and the clock it reads (set to the release times while evidence is reset, then now).
struct ReliabilityController::ParsedNodes {
  struct Node {
    int64_t revision = 0;
    std::string leaf;
    std::vector<Fleet::Gpu> gpus;
  };
  std::string leaf_level;
  std::map<std::string, Node> by_name;
};

struct ReliabilityController::Analysis {
  Fleet fleet;
  FakeClock clock;
  std::optional<reliability::ReliabilityMonitor> monitor;
  size_t seeded_audit = 0;  // audit entries that restate quarantines already in force
  int outcomes = 0;
  int skipped = 0;
  std::map<std::string, Json> quarantine_docs;  // by name
};

// The loop's circuit breaker at one step.
struct ReliabilityController::Breaker {
  bool open = false;
  int out = 0;  // GPUs gone out within the window
  int gpus = 0;
};

ReliabilityController::ReliabilityController(store::StateStore& store, const Clock& clock,
                                             const WallClock* wall_clock,
                                             ReliabilityOptions options, JobWriter write_job)
    : store_(store),
      clock_(clock),
      wall_clock_(wall_clock),
      options_(std::move(options)),
      write_job_(std::move(write_job)),
      parsed_nodes_(std::make_unique<ParsedNodes>()) {
  store_.AddObserver(this);
}

ReliabilityController::~ReliabilityController() {
  store_.RemoveObserver(this);
}

void ReliabilityController::Committed(const store::WriteBatch& batch) {
  const bool inputs =
      std::any_of(batch.ops().begin(), batch.ops().end(), [](const store::WriteOp& op) {
        const bool object = op.type == store::WriteOpType::kCreate ||
                            op.type == store::WriteOpType::kUpdate ||
                            op.type == store::WriteOpType::kDelete;
        return object && (op.kind == kNodesKind || op.kind == kOutcomesKind ||
                          op.kind == kQuarantinesKind || op.kind == kClusterKind);
      });
  if (inputs) {
    std::lock_guard<std::mutex> lock(mu_);
    inputs_changed_ = true;
  }
}

void ReliabilityController::ReadAllAgain() {
  std::lock_guard<std::mutex> lock(mu_);
  inputs_changed_ = true;
}

int64_t ReliabilityController::NowNanos() const {
  return wall_clock_ != nullptr ? wall_clock_->UnixNanos() : clock_.Now().nanos;
}

// ---- outcome records ----------------------------------------------------------------------

Json ReliabilityController::XidBaseline(const Json& job) {
  Json baseline = Json::object();
  for (const Json& placement : wire::ArrayOr(job, "placements")) {
    const std::string node = wire::StrOr(placement, "node");
    const Result<store::StoredObject> object = store_.Get(kNodesKind, node);
    if (!object.ok()) {
      continue;
    }
    const Json doc = wire::ParseDocument(object->data);
    for (const PlacedGpu& placed : PlacedGpus(placement)) {
      const Json* gpu = FindPlacedGpu(wire::ArrayOr(doc, "gpus"), placed);
      if (gpu == nullptr) {
        continue;
      }
      const GpuHealthReading reading = ReadHealthReasons(wire::ArrayOr(*gpu, "reasons"));
      for (const auto& [xid, count] : reading.xids) {
        baseline[GpuKey(*gpu, node, wire::IntOr(*gpu, "index", -1))][std::to_string(xid)] = count;
      }
    }
  }
  return baseline;
}

Result<StoredOutcome> ReliabilityController::BuildOutcome(const Json& before, const Json& after) {
  StoredOutcome outcome;
  reliability::OutcomeRecord& r = outcome.record;
  r.job = JobId(TeamScopedKeyOf(before));  // the job's key, TEAM/NAME
  r.attempt = static_cast<int>(wire::IntOr(before, "attempt", 0));
  r.end = MonoTime{NowNanos()};
  const Json& run = before.contains("run") ? before["run"] : Json::object();
  r.start = wire::IntOr(run, "attempt", -1) == r.attempt
                ? MonoTime{wire::IntOr(run, "started_ns", r.end.nanos)}
                : r.end;
  r.start = std::min(r.start, r.end);
  const Json& baseline = run.contains("xids_before") ? run["xids_before"] : Json::object();
  bool hardware_evidence = false;
  std::set<std::string> gpu_nodes;
  std::vector<std::string> placement_nodes;
  for (const Json& placement : wire::ArrayOr(before, "placements")) {
    const std::string node = wire::StrOr(placement, "node");
    if (node.empty()) {
      continue;
    }
    placement_nodes.push_back(node);
    if (placement.contains("image_pull_ms")) {
      outcome.image_pulls.push_back(StoredOutcome::ImagePull{
          wire::StrOr(placement, "task"), node, PlacementImage(before, placement),
          wire::StrOr(placement, "image_digest"), wire::IntOr(placement, "image_pull_ms", 0)});
    }
    const std::vector<PlacedGpu> placed = PlacedGpus(placement);
    if (placed.empty()) {
      continue;
    }
    GPUFLEET_ASSIGN_OR_RETURN(const store::StoredObject object, store_.Get(kNodesKind, node));
    const Json doc = wire::ParseDocument(object.data);
    for (const PlacedGpu& one : placed) {
      const Json* gpu = FindPlacedGpu(wire::ArrayOr(doc, "gpus"), one);
      if (gpu == nullptr && one.uuid.empty()) {
        return NotFoundError(fmt::format("node \"{}\" has no GPU {}", node, one.index));
      }
      // A GPU gone from its node (the run ended for it) is still the run's, by its UUID; it has
      // no health to read.
      const std::string key =
          gpu == nullptr ? one.uuid : GpuKey(*gpu, node, wire::IntOr(*gpu, "index", -1));
      if (std::find(r.gpus.begin(), r.gpus.end(), GpuUuid(key)) != r.gpus.end()) {
        continue;  // a GPU shared by two tasks of the job
      }
      r.gpus.push_back(GpuUuid(key));
      gpu_nodes.insert(node);
      if (gpu == nullptr) {
        continue;
      }
      const GpuHealthReading reading = ReadHealthReasons(wire::ArrayOr(*gpu, "reasons"));
      const Json& seen_before = baseline.contains(key) ? baseline[key] : Json::object();
      for (const auto& [xid, count] : reading.xids) {
        const int new_count =
            std::min(kMaxXidsPerCode,
                     count - static_cast<int>(wire::IntOr(seen_before, std::to_string(xid), 0)));
        for (int i = 0; i < new_count; ++i) {
          r.xids.push_back(reliability::XidEvent{GpuUuid(key), xid});
        }
        hardware_evidence = hardware_evidence || (new_count > 0 && reliability::XidBlamesGpu(xid));
      }
      for (const GpuHealthReading::Check& check : reading.checks) {
        r.health_events.push_back(
            reliability::HealthEvent{NodeId(node), GpuUuid(key), check.name, check.severity});
        hardware_evidence =
            hardware_evidence || check.severity == reliability::HealthSeverity::kFail;
      }
    }
  }
  // A record's nodes are its GPUs' nodes (ValidateOutcome); a CPU-only run names its nodes.
  if (gpu_nodes.empty()) {
    gpu_nodes.insert(placement_nodes.begin(), placement_nodes.end());
  }
  for (const std::string& node : gpu_nodes) {
    r.nodes.push_back(NodeId(node));
  }
  if (r.nodes.empty()) {
    return FailedPreconditionError(
        fmt::format("job \"{}\" run {} held no node", r.job.value(), r.attempt));
  }
  r.exit_reason = InferExitReason(after, hardware_evidence);
  outcome.cause = wire::StrOr(after, "reason");
  if (outcome.cause.empty()) {
    outcome.cause = wire::StrOr(after, "state");
  }
  return outcome;
}

void ReliabilityController::NoteJobChange(const Json& before, Json& after,
                                          store::WriteBatch& batch) {
  if (!IsRunGoing(wire::StrOr(before, "state"))) {
    return;
  }
  const std::string job = TeamScopedKeyOf(before);
  const int64_t attempt = wire::IntOr(before, "attempt", 0);
  const bool ended =
      !IsRunGoing(wire::StrOr(after, "state")) || wire::IntOr(after, "attempt", 0) != attempt;
  if (job.empty()) {
    return;
  }
  if (!ended) {
    const Json& run = after.contains("run") ? after["run"] : Json::object();
    if (wire::IntOr(run, "attempt", -1) != attempt) {
      after["run"] = {{"attempt", attempt}, {"started_ns", NowNanos()}};
    }
    if (!after["run"].contains("xids_before")) {
      // The XIDs its GPUs reported before the run's first report are not the run's (the agent
      // keeps them until the GPU is reset).
      after["run"]["xids_before"] = XidBaseline(before);
    }
    return;
  }
  after.erase("run");
  const std::string name = OutcomeName(job, attempt);
  // A run ends once; a record already there (an earlier server wrote it) stays as it is.
  if (store_.Get(kOutcomesKind, name).ok()) {
    return;
  }
  Result<StoredOutcome> outcome = BuildOutcome(before, after);
  if (!outcome.ok()) {
    fmt::print(stderr, "gpufleet server: outcomes/{}: not recorded: {}\n", name,
               outcome.status().ToString());
    return;
  }
  batch.Create(std::string(kOutcomesKind), name, OutcomeToJson(*outcome).dump());
}

void ReliabilityController::NoteRunStarted(Json& job) const {
  job["run"] = {{"attempt", wire::IntOr(job, "attempt", 0)}, {"started_ns", NowNanos()}};
}

// ---- the fleet and the analysis ---------------------------------------------------------------

Result<ReliabilityController::Fleet> ReliabilityController::LoadFleet() {
  std::string leaf_level;
  const Result<store::StoredObject> topology = store_.Get(kClusterKind, kTopologyName);
  if (topology.ok()) {
    const Json recorded = wire::ParseDocument(topology->data);
    const Json& levels = wire::ArrayOr(recorded, "levels");
    if (!levels.empty() && levels.back().is_string()) {
      leaf_level = levels.back().get<std::string>();
    }
  } else if (topology.status().code() != StatusCode::kNotFound) {
    return topology.status();
  }
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> nodes, store_.List(kNodesKind));
  std::lock_guard<std::mutex> lock(fleet_mu_);
  ParsedNodes& parsed = *parsed_nodes_;
  if (parsed.leaf_level != leaf_level) {
    parsed = ParsedNodes{.leaf_level = leaf_level};
  }
  auto parse = [&leaf_level](const store::StoredObject& object) {
    const Json doc = wire::ParseDocument(object.data);
    ParsedNodes::Node node{.revision = object.revision};
    if (!leaf_level.empty()) {
      node.leaf = wire::StrOr(doc.contains("topology") ? doc["topology"] : Json(), leaf_level);
    }
    const bool diagnosable =
        wire::StringMapOr(doc, "labels")[std::string(wire::kDiagnosticsLabel)] == "true";
    for (const Json& gpu : wire::ArrayOr(doc, "gpus")) {
      const int64_t index = wire::IntOr(gpu, "index", -1);
      node.gpus.push_back({object.name, index, GpuKey(gpu, object.name, index),
                           wire::StrOr(gpu, "health"), wire::StrOr(gpu, "drain", "none"),
                           gpu.contains("reasons") ? gpu["reasons"] : Json::array(),
                           gpu.contains(kDiagnosticHoldField) ? gpu[kDiagnosticHoldField] : Json(),
                           diagnosable});
    }
    return node;
  };
  std::map<std::string, ParsedNodes::Node> by_name;
  Fleet fleet;
  for (const store::StoredObject& object : nodes) {
    ParsedNodes::Node node;
    // The store revision tells every write apart, even a deleted and re-created node.
    if (auto it = parsed.by_name.find(object.name);
        it != parsed.by_name.end() && it->second.revision == object.revision) {
      node = std::move(it->second);
    } else {
      node = parse(object);
    }
    std::vector<GpuUuid> keys;
    for (const Fleet::Gpu& gpu : node.gpus) {
      keys.push_back(GpuUuid(gpu.key));
    }
    if (Status status = fleet.inventory.AddNode(NodeId(object.name), node.leaf, keys);
        !status.ok()) {
      fmt::print(stderr, "gpufleet server: reliability: node \"{}\" left out: {}\n", object.name,
                 status.ToString());
    } else {
      fleet.gpus.insert(fleet.gpus.end(), node.gpus.begin(), node.gpus.end());
    }
    by_name.emplace(object.name, std::move(node));
  }
  parsed.by_name = std::move(by_name);
  return fleet;
}

Result<std::vector<reliability::OutcomeRecord>> ReliabilityController::LoadOutcomes() {
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> objects,
                            store_.List(kOutcomesKind));
  std::vector<reliability::OutcomeRecord> records;
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, CachedOutcome> cache;
  for (const store::StoredObject& object : objects) {
    auto it = outcomes_.find(object.name);
    CachedOutcome entry;
    if (it != outcomes_.end() && it->second.version == object.revision) {
      entry = std::move(it->second);
    } else {
      // The store revision tells every write apart, even a deleted and re-created record.
      entry.version = object.revision;
      Result<StoredOutcome> parsed = OutcomeFromJson(wire::ParseDocument(object.data));
      if (parsed.ok()) {
        entry.record = std::move(parsed).value().record;
      }
    }
    if (entry.record) {
      records.push_back(*entry.record);
    }
    cache.emplace(object.name, std::move(entry));
  }
  outcomes_ = std::move(cache);
  std::stable_sort(records.begin(), records.end(),
                   [](const reliability::OutcomeRecord& a, const reliability::OutcomeRecord& b) {
                     return a.end < b.end;
                   });
  return records;
}

Result<std::unique_ptr<ReliabilityController::Analysis>> ReliabilityController::Analyse() {
  auto analysis = std::make_unique<Analysis>();
  GPUFLEET_ASSIGN_OR_RETURN(analysis->fleet, LoadFleet());
  const MonoTime now{NowNanos()};
  analysis->clock.Set(now);
  GPUFLEET_ASSIGN_OR_RETURN(reliability::ReliabilityMonitor monitor,
                            reliability::ReliabilityMonitor::Create(
                                analysis->fleet.inventory, analysis->clock, options_.attribution,
                                options_.budget, options_.rules));
  analysis->monitor.emplace(std::move(monitor));
  reliability::ReliabilityMonitor& m = *analysis->monitor;
  const Fleet& fleet = analysis->fleet;

  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> docs,
                            store_.List(kQuarantinesKind));
  for (const store::StoredObject& object : docs) {
    Json doc = wire::ParseDocument(object.data);
    doc["version"] = object.version;
    analysis->quarantine_docs.emplace(object.name, std::move(doc));
  }
  auto doc_in_force = [&](const Device& device) -> const Json* {
    const auto it = analysis->quarantine_docs.find(QuarantineDocName(device));
    return it != analysis->quarantine_docs.end() &&
                   wire::StrOr(it->second, "state") == "quarantined"
               ? &it->second
               : nullptr;
  };
  // The quarantines in force, so that the budget counts them; a denial here changes nothing.
  auto seed = [&](const Device& device) {
    const Json* doc = doc_in_force(device);
    reliability::QuarantineRequest request{device, DrainMode::kAfterJob,
                                           QuarantineSource::kOperator, "operator",
                                           "quarantined on the node"};
    if (doc != nullptr) {
      request.mode = wire::StrOr(*doc, "mode") == "now" ? DrainMode::kNow : DrainMode::kAfterJob;
      request.source =
          ParseSource(wire::StrOr(*doc, "source")).value_or(QuarantineSource::kOperator);
      request.actor = wire::StrOr(*doc, "actor", "operator");
      request.reason = wire::StrOr(*doc, "reason", "quarantined");
    }
    (void)m.Quarantine(request);
  };
  for (int node = 0; node < fleet.inventory.node_count(); ++node) {
    const Device node_device = Device::OfNode(fleet.inventory.node_id(node));
    if (doc_in_force(node_device) != nullptr && fleet.IsQuarantined(node_device)) {
      seed(node_device);
      continue;
    }
    for (const int gpu : fleet.inventory.gpus_of_node(node)) {
      if (fleet.gpus[static_cast<size_t>(gpu)].health == QuarantinedName()) {
        seed(Device::OfGpu(fleet.inventory.gpu_uuid(gpu)));
      }
    }
  }
  analysis->seeded_audit = m.quarantine().audit_log().size();

  // A released device's evidence starts again at its release.
  for (const auto& [name, doc] : analysis->quarantine_docs) {
    const int64_t since = wire::IntOr(doc, "evidence_since_ns", 0);
    const std::optional<Device> device = DeviceOfDoc(doc);
    if (since <= 0 || !device || !fleet.inventory.Contains(*device)) {
      continue;
    }
    analysis->clock.Set(MonoTime{since});
    (void)m.engine().ResetDevice(*device);
  }
  analysis->clock.Set(now);

  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<reliability::OutcomeRecord> records, LoadOutcomes());
  for (const reliability::OutcomeRecord& record : records) {
    if (m.engine().AddOutcome(record).ok()) {
      ++analysis->outcomes;
    } else {
      ++analysis->skipped;
    }
  }
  return analysis;
}

// ---- the step -----------------------------------------------------------------------------

std::optional<Result<ReliabilityStepResult>> ReliabilityController::RunIfDue(
    const std::set<std::string>& lost_nodes) {
  const MonoTime now = clock_.Now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_step_ && now - *last_step_ < options_.interval) {
      return std::nullopt;
    }
    last_step_ = now;
    const bool quiet =
        !inputs_changed_ && !last_busy_ && last_run_ && now - *last_run_ < options_.quiet_interval;
    if (quiet) {
      return std::nullopt;
    }
    // Cleared before the step: what it writes itself is an input of the next one.
    inputs_changed_ = false;
    last_run_ = now;
  }
  Result<ReliabilityStepResult> result = RunStep(lost_nodes);
  // What moves with time alone keeps the step running when due: the budget's window for a
  // denied quarantine, the breaker's window, a diagnostic's drain timeout or a lost node's hold.
  bool busy =
      !result.ok() || !result->denied.empty() || result->breaker_open || !lost_nodes.empty();
  if (!busy) {
    const Result<Fleet> fleet = LoadFleet();
    busy = !fleet.ok() ||
           std::any_of(fleet->gpus.begin(), fleet->gpus.end(),
                       [](const Fleet::Gpu& gpu) { return gpu.diagnostic.is_object(); });
  }
  std::lock_guard<std::mutex> lock(mu_);
  last_busy_ = busy;
  return result;
}

Status ReliabilityController::NoticeQuarantineChanges(const Fleet& fleet,
                                                      ReliabilityStepResult& result) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> docs,
                            store_.List(kQuarantinesKind));
  const int64_t now = NowNanos();
  std::set<std::string> in_force;
  for (const store::StoredObject& object : docs) {
    Json doc = wire::ParseDocument(object.data);
    const std::optional<Device> device = DeviceOfDoc(doc);
    if (wire::StrOr(doc, "state") != "quarantined" || !device ||
        !fleet.inventory.Contains(*device)) {
      continue;
    }
    if (fleet.IsQuarantined(*device)) {
      in_force.insert(object.name);
      continue;
    }
    // Released on the node (gpufleet release): it is back in service and starts clean.
    MarkReleased(doc, now);
    store::WriteBatch batch;
    batch.Update(std::string(kQuarantinesKind), object.name, doc.dump(), object.version);
    batch.AppendEvent(std::string(kQuarantinesKind), object.name,
                      "released: in service again; the evidence before now is forgotten");
    const Status status = store_.Commit(batch);
    if (status.ok()) {
      result.released.push_back(device->ToString());
    } else if (status.code() != StatusCode::kAborted) {
      return status;
    }
  }
  // Quarantines set on the node by an operator get a document too, so that their release is
  // noticed like any other.
  for (size_t i = 0; i < fleet.gpus.size(); ++i) {
    const Fleet::Gpu& gpu = fleet.gpus[i];
    const Device device = Device::OfGpu(GpuUuid(gpu.key));
    const Device node = Device::OfNode(NodeId(gpu.node));
    if (gpu.health != QuarantinedName() || in_force.count(QuarantineDocName(device)) > 0 ||
        in_force.count(QuarantineDocName(node)) > 0) {
      continue;
    }
    const std::string name = QuarantineDocName(device);
    const Result<store::StoredObject> existing = store_.Get(kQuarantinesKind, name);
    if (!existing.ok() && existing.status().code() != StatusCode::kNotFound) {
      return existing.status();
    }
    const Json doc = OperatorQuarantineRecord(
        existing.ok() ? wire::ParseDocument(existing->data) : Json::object(), gpu.key, gpu.node,
        gpu.index, "operator", "quarantined on the node", now);
    store::WriteBatch batch;
    if (existing.ok()) {
      batch.Update(std::string(kQuarantinesKind), name, doc.dump(), existing->version);
    } else {
      batch.Create(std::string(kQuarantinesKind), name, doc.dump());
    }
    batch.AppendEvent(std::string(kQuarantinesKind), name,
                      fmt::format("quarantined on node {} by an operator", gpu.node));
    const Status status = store_.Commit(batch);
    if (!status.ok() && status.code() != StatusCode::kAborted &&
        status.code() != StatusCode::kAlreadyExists) {
      return status;
    }
  }
  return Status::Ok();
}

Status ReliabilityController::AddOperatorQuarantine(Json& node_doc, std::string_view node,
                                                    std::optional<int64_t> gpu, bool release,
                                                    std::string_view actor, std::string_view reason,
                                                    store::WriteBatch& batch) {
  const int64_t now = NowNanos();
  store::WriteBatch added;
  bool found = false;
  if (node_doc.contains("gpus") && node_doc["gpus"].is_array()) {
    for (Json& g : node_doc["gpus"]) {
      const int64_t index = wire::IntOr(g, "index", -1);
      if (gpu && index != *gpu) {
        continue;
      }
      found = true;
      const std::string name = QuarantineDocName(Device::OfGpu(GpuUuid(GpuKey(g, node, index))));
      Result<store::StoredObject> stored = store_.Get(kQuarantinesKind, name);
      if (!stored.ok() && stored.status().code() != StatusCode::kNotFound) {
        return stored.status();
      }
      const std::optional<store::StoredObject> existing =
          stored.ok() ? std::optional(*std::move(stored)) : std::nullopt;
      if (release) {
        g["health"] = GpuHealthName(GpuHealth::kHealthy);
        g.erase("quarantine_reason");
        Json record = existing ? wire::ParseDocument(existing->data) : Json();
        // Only a quarantine in force is released: a GPU in service keeps its evidence.
        if (wire::StrOr(record, "state") != "quarantined") {
          continue;
        }
        MarkReleased(record, now);
        added.Update(std::string(kQuarantinesKind), name, record.dump(), existing->version);
        added.AppendEvent(
            std::string(kQuarantinesKind), name,
            fmt::format("released by {}: in service again; the evidence before now is forgotten",
                        actor));
        continue;
      }
      g["health"] = QuarantinedName();
      g["quarantine_reason"] = reason;
      const Json record =
          OperatorQuarantineRecord(existing ? wire::ParseDocument(existing->data) : Json::object(),
                                   GpuKey(g, node, index), node, index, actor, reason, now);
      if (existing) {
        added.Update(std::string(kQuarantinesKind), name, record.dump(), existing->version);
      } else {
        added.Create(std::string(kQuarantinesKind), name, record.dump());
      }
      added.AppendEvent(std::string(kQuarantinesKind), name,
                        fmt::format("quarantined on node {} by {}: {}", node, actor, reason));
    }
  }
  if (gpu && !found) {
    return InvalidArgumentError(fmt::format("gpu: no GPU {} on node \"{}\"", *gpu, node));
  }
  batch.Append(added);
  return Status::Ok();
}

Status ReliabilityController::ApplyQuarantine(const Analysis& analysis, const AuditEntry& entry) {
  const Device& device = entry.device;
  const Fleet& fleet = analysis.fleet;
  const Fleet::Gpu* gpu = device.kind == DeviceKind::kGpu ? fleet.FindGpu(device.id) : nullptr;
  const std::string node = gpu != nullptr ? gpu->node : device.id;
  const std::string what =
      gpu != nullptr ? fmt::format("gpu {} ({})", gpu->index, gpu->key) : "every gpu";
  const int leaf = fleet.inventory.leaf_of_node(fleet.inventory.NodeIndex(node));
  const std::string event = fmt::format(
      "{} quarantined by {} ({}), drain {}: {}; GPUs out: {} of {} in the fleet, {} of {} in leaf "
      "\"{}\"",
      what, reliability::QuarantineSourceName(entry.source), entry.actor,
      reliability::DrainModeName(entry.mode), entry.reason, entry.gpus_out,
      fleet.inventory.gpu_count(), entry.leaf_gpus_out, fleet.inventory.gpus_in_leaf(leaf),
      entry.leaf);
  const std::string name = QuarantineDocName(device);
  const int64_t now = NowNanos();
  for (int attempt = 0;; ++attempt) {
    GPUFLEET_ASSIGN_OR_RETURN(const store::StoredObject object, store_.Get(kNodesKind, node));
    Json doc = wire::ParseDocument(object.data);
    if (doc.contains("gpus") && doc["gpus"].is_array()) {
      for (Json& g : doc["gpus"]) {
        if (gpu == nullptr || wire::IntOr(g, "index", -1) == gpu->index) {
          g["health"] = QuarantinedName();
          g["quarantine_reason"] = entry.reason;
        }
      }
    }
    const Result<store::StoredObject> existing = store_.Get(kQuarantinesKind, name);
    if (!existing.ok() && existing.status().code() != StatusCode::kNotFound) {
      return existing.status();
    }
    Json record = existing.ok() ? wire::ParseDocument(existing->data) : Json::object();
    record.update({{"device", reliability::DeviceKindName(device.kind)},
                   {"id", device.id},
                   {"node", node},
                   {"leaf", entry.leaf},
                   {"state", "quarantined"},
                   {"source", reliability::QuarantineSourceName(entry.source)},
                   {"actor", entry.actor},
                   {"reason", entry.reason},
                   {"mode", reliability::DrainModeName(entry.mode)},
                   {"since_ns", now}});
    if (gpu != nullptr) {
      record["gpu"] = gpu->index;
    }
    const Status status = store_.Commit(
        DeviceStepBatch(node, doc, object.version, name, record,
                        existing.ok() ? std::optional(existing->version) : std::nullopt, event));
    if (status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      denials_logged_.erase(device);
      return status;
    }
    if ((status.code() != StatusCode::kAborted && status.code() != StatusCode::kAlreadyExists) ||
        attempt + 1 == kWriteAttempts) {
      return status;
    }
  }
}

Status ReliabilityController::LogDenial(const Analysis& analysis, const AuditEntry& entry) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!denials_logged_.insert(entry.device).second) {
      return Status::Ok();
    }
  }
  const Fleet::Gpu* gpu =
      entry.device.kind == DeviceKind::kGpu ? analysis.fleet.FindGpu(entry.device.id) : nullptr;
  const std::string node = gpu != nullptr ? gpu->node : entry.device.id;
  const std::string what =
      gpu != nullptr ? fmt::format("gpu {} ({})", gpu->index, gpu->key) : "the node";
  store::WriteBatch batch;
  batch.AppendEvent(
      std::string(kNodesKind), node,
      fmt::format("{} not quarantined by {} ({}): {}", what,
                  reliability::QuarantineSourceName(entry.source), entry.actor, entry.reason));
  return store_.Commit(batch);
}

Result<int> ReliabilityController::PreemptRunsOn(const Analysis& analysis, const Device& device,
                                                 const std::string& reason,
                                                 std::optional<int64_t> notice_deadline_ns) {
  const Fleet::Gpu* gpu =
      device.kind == DeviceKind::kGpu ? analysis.fleet.FindGpu(device.id) : nullptr;
  const std::string node = gpu != nullptr ? gpu->node : device.id;
  const std::string what = gpu != nullptr ? fmt::format("gpu {} of {}", gpu->index, node) : node;
  auto uses_device = [&](const Json& job) {
    for (const Json& placement : wire::ArrayOr(job, "placements")) {
      if (wire::StrOr(placement, "node") != node) {
        continue;
      }
      const std::vector<PlacedGpu> placed = PlacedGpus(placement);
      if (gpu == nullptr || std::any_of(placed.begin(), placed.end(), [&](const PlacedGpu& one) {
            return one.Is(gpu->key, gpu->index);
          })) {
        return true;
      }
    }
    return false;
  };
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> jobs,
                            store_.ListWhere(kJobsKind, UnfinishedJobs()));
  int preempted = 0;
  for (const store::StoredObject& listed : jobs) {
    const std::optional<std::string> state = TopLevelString(listed.data, "state");
    if (state && !IsRunGoing(*state)) {
      continue;
    }
    for (int attempt = 0; attempt < kWriteAttempts; ++attempt) {
      Result<store::StoredObject> object = store_.Get(kJobsKind, listed.name);
      if (!object.ok()) {
        break;
      }
      const Json before = wire::ParseDocument(object->data);
      if (!IsRunGoing(wire::StrOr(before, "state")) || !uses_device(before)) {
        break;
      }
      Json after = before;
      Result<std::string> event = std::string();
      if (notice_deadline_ns) {
        // A checkpoint notice instead of a stop: EndNoticedRuns ends the run once a task reports
        // a checkpoint or at the deadline. Only a Running job has tasks that can save anything.
        if (wire::StrOr(before, "state") != JobStateName(JobState::kRunning) ||
            before.contains("notice")) {
          break;
        }
        const Json spec = before.contains("spec") ? before["spec"] : Json::object();
        std::string signal =
            wire::StrOr(spec.contains("preemption") ? spec["preemption"] : Json::object(),
                        "noticeSignal", std::string(kDefaultNoticeSignal));
        if (!signal.starts_with("SIG")) {
          signal = "SIG" + signal;
        }
        const wire::NoticeRecord notice{.signal = signal,
                                        .since_ns = NowNanos(),
                                        .deadline_ns = *notice_deadline_ns,
                                        .reason = reason};
        after["notice"] = wire::NoticeRecordToJson(notice);
        event = NoticeEvent(notice);
      } else {
        event = EndRun(after, JobState::kPending, reason,
                       wall_clock_ != nullptr ? FormatRfc3339(wall_clock_->UnixNanos()) : "");
        if (event.ok()) {
          MarkExpedited(after, fmt::format("{} went out of service", what));
        }
      }
      if (!event.ok()) {
        break;
      }
      store::WriteBatch batch;
      write_job_(before, after, object->version, *event, batch);
      const Status status = store_.Commit(batch);
      if (status.ok()) {
        ++preempted;
        break;
      }
      if (status.code() != StatusCode::kAborted) {
        return status;
      }
    }
  }
  return preempted;
}

Result<ReliabilityStepResult> ReliabilityController::RunStep(
    const std::set<std::string>& lost_nodes) {
  ReliabilityStepResult result;
  {
    GPUFLEET_ASSIGN_OR_RETURN(const Fleet fleet, LoadFleet());
    GPUFLEET_RETURN_IF_ERROR(NoticeQuarantineChanges(fleet, result));
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<Analysis> analysis, Analyse());
  reliability::ReliabilityMonitor& monitor = *analysis->monitor;
  result.outcomes = analysis->outcomes;
  result.skipped_outcomes = analysis->skipped;
  const bool loop = options_.loop.enabled && options_.rules.enabled;
  bool breaker_open = false;
  Breaker breaker;
  if (loop) {
    GPUFLEET_ASSIGN_OR_RETURN(breaker, UpdateBreaker(*analysis));
    breaker_open = breaker.open;
    result.breaker_open = breaker_open;
    // The diagnostics' results first: their quarantines count in the budget the attribution's
    // decisions below see.
    GPUFLEET_RETURN_IF_ERROR(ActOnDiagnostics(*analysis, lost_nodes, breaker_open, result));
    analysis->seeded_audit = monitor.quarantine().audit_log().size();
  }

  if (options_.quarantine_on_health_rule && options_.rules.enabled) {
    for (const Fleet::Gpu& gpu : analysis->fleet.gpus) {
      if (gpu.health == QuarantinedName() || (gpu.drain != "now" && gpu.drain != "after-job")) {
        continue;
      }
      // The XID the catalog drains for, the most urgent first.
      std::optional<int> xid;
      for (const auto& [code, count] : ReadHealthReasons(gpu.reasons).xids) {
        const reliability::XidAction action = reliability::ClassifyXid(code);
        if (action == reliability::XidAction::kDrainNow) {
          xid = code;
          break;
        }
        if (action == reliability::XidAction::kDrainAfterJob && !xid) {
          xid = code;
        }
      }
      if (xid) {
        (void)monitor.QuarantineForXid(GpuUuid(gpu.key), *xid, "health-rule");
      }
    }
  }
  const reliability::Evaluation evaluation = monitor.Evaluate();
  result.suspects = static_cast<int>(evaluation.report.suspects.size());

  const std::vector<AuditEntry>& audit = monitor.quarantine().audit_log();
  for (size_t i = analysis->seeded_audit; i < audit.size(); ++i) {
    const AuditEntry& entry = audit[i];
    if (entry.action == AuditAction::kDenied) {
      GPUFLEET_RETURN_IF_ERROR(LogDenial(*analysis, entry));
      result.denied.push_back(entry.device.ToString());
      continue;
    }
    if (entry.action != AuditAction::kQuarantined) {
      continue;
    }
    if (loop && entry.device.kind == DeviceKind::kGpu) {
      const int gpu = analysis->fleet.inventory.GpuIndex(entry.device.id);
      // A suspect the loop can diagnose is diagnosed (RequestDiagnostics), not quarantined on
      // statistics alone; with the breaker open nothing is taken out automatically.
      if (breaker_open || (gpu >= 0 && InLoop(*analysis, static_cast<size_t>(gpu)))) {
        continue;
      }
    }
    GPUFLEET_RETURN_IF_ERROR(ApplyQuarantine(*analysis, entry));
    result.quarantined.push_back(entry.device.ToString());
    if (entry.mode == DrainMode::kNow) {
      const Fleet::Gpu* gpu = entry.device.kind == DeviceKind::kGpu
                                  ? analysis->fleet.FindGpu(entry.device.id)
                                  : nullptr;
      const std::string what =
          gpu != nullptr ? fmt::format("gpu {} of {}", gpu->index, gpu->node) : entry.device.id;
      GPUFLEET_ASSIGN_OR_RETURN(
          const int preempted,
          PreemptRunsOn(*analysis, entry.device,
                        fmt::format("preempted: {} was quarantined and drains now", what)));
      result.preempted_runs += preempted;
    }
  }
  if (loop && !breaker_open) {
    // No more GPUs go out in this step than the breaker allows.
    const int room = static_cast<int>(options_.loop.breaker_share * breaker.gpus) - breaker.out;
    GPUFLEET_RETURN_IF_ERROR(RequestDiagnostics(*analysis, evaluation, room, result));
  }
  return result;
}

// ---- the loop -----------------------------------------------------------------------------

bool ReliabilityController::InLoop(const Analysis& analysis, size_t gpu) const {
  return options_.loop.enabled && options_.rules.enabled && analysis.fleet.gpus[gpu].diagnosable;
}

Result<ReliabilityController::Breaker> ReliabilityController::UpdateBreaker(
    const Analysis& analysis) {
  const HealthLoopOptions& loop = options_.loop;
  const int64_t now = NowNanos();
  const int64_t since =
      now - std::chrono::duration_cast<std::chrono::nanoseconds>(loop.breaker_window).count();
  Breaker breaker;
  const Fleet& fleet = analysis.fleet;
  breaker.gpus = fleet.inventory.gpu_count();
  for (const Fleet::Gpu& gpu : fleet.gpus) {
    bool out = wire::IntOr(gpu.diagnostic, "requested_ns", 0) >= since;
    if (!out && gpu.health == QuarantinedName()) {
      const auto doc =
          analysis.quarantine_docs.find(QuarantineDocName(Device::OfGpu(GpuUuid(gpu.key))));
      const auto node_doc =
          analysis.quarantine_docs.find(QuarantineDocName(Device::OfNode(NodeId(gpu.node))));
      for (const auto& it : {doc, node_doc}) {
        out = out || (it != analysis.quarantine_docs.end() &&
                      wire::StrOr(it->second, "state") == "quarantined" &&
                      wire::IntOr(it->second, "since_ns", 0) >= since);
      }
    }
    breaker.out += out ? 1 : 0;
  }
  breaker.open = breaker.gpus > 0 && static_cast<double>(breaker.out) >
                                         loop.breaker_share * static_cast<double>(breaker.gpus);
  breaker_open_.store(breaker.open);
  // Its state is a document with an event at each change: the audit of when the loop held off.
  const std::string name(kBreakerName);
  const Result<store::StoredObject> stored = store_.Get(kClusterKind, name);
  if (!stored.ok() && stored.status().code() != StatusCode::kNotFound) {
    return stored.status();
  }
  const Json before = stored.ok() ? wire::ParseDocument(stored->data) : Json::object();
  if (wire::BoolOr(before, "open", false) == breaker.open) {
    return breaker;
  }
  const Json doc = {{"open", breaker.open},        {"since_ns", now},
                    {"out", breaker.out},          {"gpus", breaker.gpus},
                    {"share", loop.breaker_share}, {"window_s", loop.breaker_window.count()}};
  store::WriteBatch batch;
  if (stored.ok()) {
    batch.Update(std::string(kClusterKind), name, doc.dump(), stored->version);
  } else {
    batch.Create(std::string(kClusterKind), name, doc.dump());
  }
  batch.AppendEvent(
      std::string(kClusterKind), name,
      breaker.open
          ? fmt::format("circuit breaker open: {} of {} GPUs went out within {}s (more than {:g} "
                        "%); no automatic drain or quarantine until the share falls",
                        breaker.out, breaker.gpus, loop.breaker_window.count(),
                        loop.breaker_share * 100)
          : fmt::format("circuit breaker closed: {} of {} GPUs went out within {}s", breaker.out,
                        breaker.gpus, loop.breaker_window.count()));
  const Status status = store_.Commit(batch);
  if (!status.ok() && status.code() != StatusCode::kAborted &&
      status.code() != StatusCode::kAlreadyExists) {
    return status;
  }
  return breaker;
}

Status ReliabilityController::WriteLoopStep(const std::string& node, int64_t index,
                                            const std::string& device_doc,
                                            const std::function<bool(Json& gpu)>& change,
                                            const std::function<void(Json& record)>& record,
                                            const std::string& event) {
  return store::CommitWithRetries(
      store_, kWriteAttempts, fmt::format("node \"{}\" kept changing", node),
      [&]() -> store::AttemptResult {
        GPUFLEET_ASSIGN_OR_RETURN(const store::StoredObject object, store_.Get(kNodesKind, node));
        Json doc = wire::ParseDocument(object.data);
        Json* gpu = nullptr;
        if (doc.contains("gpus") && doc["gpus"].is_array()) {
          for (Json& g : doc["gpus"]) {
            gpu = wire::IntOr(g, "index", -1) == index ? &g : gpu;
          }
        }
        if (gpu == nullptr || !change(*gpu)) {
          return store::NoWrite();
        }
        const Result<store::StoredObject> existing = store_.Get(kQuarantinesKind, device_doc);
        if (!existing.ok() && existing.status().code() != StatusCode::kNotFound) {
          return existing.status();
        }
        Json device = existing.ok() ? wire::ParseDocument(existing->data)
                                    : Json{{"device", "gpu"},
                                           {"id", wire::StrOr(*gpu, "uuid")},
                                           {"node", node},
                                           {"gpu", index},
                                           {"state", "in-service"}};
        record(device);
        return store::Write(DeviceStepBatch(
            node, doc, object.version, device_doc, device,
            existing.ok() ? std::optional(existing->version) : std::nullopt, event));
      });
}

Status ReliabilityController::ActOnDiagnostics(Analysis& analysis,
                                               const std::set<std::string>& lost_nodes,
                                               bool breaker_open, ReliabilityStepResult& result) {
  reliability::ReliabilityMonitor& monitor = *analysis.monitor;
  for (size_t i = 0; i < analysis.fleet.gpus.size(); ++i) {
    const Fleet::Gpu gpu = analysis.fleet.gpus[i];
    if (!gpu.diagnostic.is_object()) {
      continue;
    }
    const std::string id = wire::StrOr(gpu.diagnostic, "id");
    const Device device = Device::OfGpu(GpuUuid(gpu.key));
    const std::string doc_name = QuarantineDocName(device);
    const std::string what = fmt::format("gpu {} ({})", gpu.index, gpu.key);
    const auto holds = [&](const Json& g) {
      return g.contains(kDiagnosticHoldField) && wire::StrOr(g[kDiagnosticHoldField], "id") == id;
    };
    const auto drop_hold = [&](Json& g) {
      if (!holds(g)) {
        return false;
      }
      g.erase(kDiagnosticHoldField);
      return true;
    };
    const auto set_phase = [&](std::string phase) {
      return [this, phase = std::move(phase)](Json& record) {
        record[kLoopField]["phase"] = phase;
        record[kLoopField]["updated_ns"] = NowNanos();
      };
    };
    if (!gpu.diagnostic.contains("result")) {
      if (lost_nodes.count(gpu.node) == 0) {
        continue;  // still running or waiting for the GPU's task to end
      }
      // The node's lease says its tasks, and so the diagnostic, are gone: it tells nothing.
      GPUFLEET_RETURN_IF_ERROR(WriteLoopStep(
          gpu.node, gpu.index, doc_name, drop_hold, set_phase("in-service"),
          fmt::format("{}: diagnostic {} dropped: node {} lost", what, id, gpu.node)));
      continue;
    }
    const Json& outcome = gpu.diagnostic["result"];
    const std::string phase = wire::StrOr(outcome, "phase");
    const std::string evidence =
        fmt::format("diagnostic {} {}: {}", id, phase, wire::StrOr(outcome, "summary", "-"));
    if (phase != wire::DiagnosticPhaseName(wire::DiagnosticPhase::kFailed)) {
      // Passed, or Unavailable (it could not tell): the GPU is not shown bad; back to work.
      GPUFLEET_RETURN_IF_ERROR(WriteLoopStep(
          gpu.node, gpu.index, doc_name, drop_hold,
          [&](Json& record) {
            set_phase("readmitted")(record);
            record[kLoopField]["last_clean_ns"] = NowNanos();
          },
          fmt::format("{} readmitted: {}", what, evidence)));
      result.readmitted.push_back(device.ToString());
      continue;
    }
    if (breaker_open) {
      continue;  // held, not quarantined, until the breaker closes
    }
    const Status quarantined = monitor.Quarantine(reliability::QuarantineRequest{
        device, DrainMode::kAfterJob, QuarantineSource::kHealthRule, "diagnostic", evidence});
    if (!quarantined.ok()) {
      // The budget is full (or it is already out): like the simulator, it goes back to work.
      GPUFLEET_RETURN_IF_ERROR(WriteLoopStep(
          gpu.node, gpu.index, doc_name, drop_hold, set_phase("readmitted"),
          fmt::format("{} not quarantined ({}): {}", what, quarantined.message(), evidence)));
      result.denied.push_back(device.ToString());
      continue;
    }
    GPUFLEET_RETURN_IF_ERROR(ApplyQuarantine(analysis, monitor.quarantine().audit_log().back()));
    result.quarantined.push_back(device.ToString());
    analysis.fleet.gpus[i].health = QuarantinedName();
    GPUFLEET_RETURN_IF_ERROR(Remediate(analysis, i, evidence, result));
  }
  return Status::Ok();
}

Status ReliabilityController::Remediate(const Analysis& analysis, size_t index,
                                        const std::string& reason, ReliabilityStepResult& result) {
  const HealthLoopOptions& loop = options_.loop;
  const Fleet::Gpu& gpu = analysis.fleet.gpus[index];
  const Device device = Device::OfGpu(GpuUuid(gpu.key));
  const std::string doc_name = QuarantineDocName(device);
  const std::string what = fmt::format("gpu {} ({})", gpu.index, gpu.key);
  const int64_t now = NowNanos();
  const int64_t window_start =
      now - std::chrono::duration_cast<std::chrono::nanoseconds>(loop.remediation_window).count();
  const Result<store::StoredObject> stored = store_.Get(kQuarantinesKind, doc_name);
  const Json record = stored.ok() ? wire::ParseDocument(stored->data) : Json::object();
  const Json loop_state = record.contains(kLoopField) ? record[kLoopField] : Json::object();
  std::vector<int64_t> recent;
  for (const Json& at : wire::ArrayOr(loop_state, "remediations")) {
    if (at.is_number_integer() && at.get<int64_t>() >= window_start) {
      recent.push_back(at.get<int64_t>());
    }
  }
  std::string event;
  std::string phase;
  if (static_cast<int>(recent.size()) >= loop.max_remediations) {
    phase = "needs-person";
    event = fmt::format(
        "{} needs a person: {} remediations within {}h did not hold; no further automatic "
        "action: {}",
        what, recent.size(), loop.remediation_window.count() / 3600, reason);
    result.needs_person.push_back(device.ToString());
  } else {
    // First a GPU reset, then a reboot of the node, then a ticket for a replacement.
    const std::string_view action =
        kRemediationActions[std::min(recent.size(), std::size(kRemediationActions) - 1)];
    recent.push_back(now);
    phase = "quarantined";
    const std::string done = loop.remediate
                                 ? loop.remediate(RemediationRequest{std::string(action), gpu.node,
                                                                     gpu.index, gpu.key, reason})
                                 : "no hook configured";
    event = fmt::format("{} remediation {} ({} of {} within {}h): {}", what, action, recent.size(),
                        loop.max_remediations, loop.remediation_window.count() / 3600, done);
  }
  return WriteLoopStep(
      gpu.node, gpu.index, doc_name,
      [](Json& g) {
        g.erase(kDiagnosticHoldField);
        return true;
      },
      [&](Json& doc) {
        doc[kLoopField]["phase"] = phase;
        doc[kLoopField]["updated_ns"] = now;
        doc[kLoopField]["remediations"] = recent;
        if (phase == "needs-person") {
          doc["reason"] = fmt::format("needs a person: {}", reason);
        }
      },
      event);
}

Status ReliabilityController::RequestDiagnostics(Analysis& analysis,
                                                 const reliability::Evaluation& evaluation,
                                                 int room, ReliabilityStepResult& result) {
  const HealthLoopOptions& loop = options_.loop;
  const auto consider = [&](const DeviceEvidence& evidence) -> Status {
    if (evidence.device.kind != DeviceKind::kGpu || evidence.failures < 1) {
      return Status::Ok();
    }
    // Flagged, named by a failure's XID (a stop-time check), or past the looser threshold.
    const bool suspect =
        evidence.flagged || evidence.attributed_failures > 0 ||
        (evidence.failures >= loop.suspect_min_failures && evidence.p_value <= loop.suspect_max_p);
    const int gpu = analysis.fleet.inventory.GpuIndex(evidence.device.id);
    if (!suspect || gpu < 0 || !InLoop(analysis, static_cast<size_t>(gpu)) || room <= 0) {
      return Status::Ok();
    }
    const Fleet::Gpu& entry = analysis.fleet.gpus[static_cast<size_t>(gpu)];
    if (entry.health == QuarantinedName() || entry.diagnostic.is_object()) {
      return Status::Ok();
    }
    // Once per new failure: a GPU a diagnostic found clean waits for more evidence.
    const auto doc = analysis.quarantine_docs.find(QuarantineDocName(evidence.device));
    const Json loop_state =
        doc != analysis.quarantine_docs.end() && doc->second.contains(kLoopField)
            ? doc->second[kLoopField]
            : Json::object();
    // A release since (the evidence starts again then) forgets what was diagnosed.
    const bool released_since =
        doc != analysis.quarantine_docs.end() && wire::IntOr(doc->second, "evidence_since_ns", 0) >=
                                                     wire::IntOr(loop_state, "updated_ns", 0);
    if (!released_since && evidence.failures <= wire::IntOr(loop_state, "diagnosed_failures", 0)) {
      return Status::Ok();
    }
    const std::string why =
        fmt::format("{} failures in {} runs (p = {:.2g}{}{})", evidence.failures, evidence.runs,
                    evidence.p_value, evidence.attributed_failures > 0 ? ", named by an XID" : "",
                    evidence.flagged ? ", flagged by the attribution" : "");
    --room;
    return RequestDiagnostic(analysis, static_cast<size_t>(gpu), why, evidence.failures, result);
  };
  for (const DeviceEvidence& evidence : evaluation.report.suspects) {
    GPUFLEET_RETURN_IF_ERROR(consider(evidence));
  }
  for (const DeviceEvidence& evidence : evaluation.report.runners_up) {
    GPUFLEET_RETURN_IF_ERROR(consider(evidence));
  }
  return Status::Ok();
}

Status ReliabilityController::RequestDiagnostic(Analysis& analysis, size_t index,
                                                const std::string& reason, int failures,
                                                ReliabilityStepResult& result) {
  const HealthLoopOptions& loop = options_.loop;
  Fleet::Gpu& gpu = analysis.fleet.gpus[index];
  const Device device = Device::OfGpu(GpuUuid(gpu.key));
  const int64_t now = NowNanos();
  const std::string id = fmt::format("{}-gpu{}-{}", gpu.node, gpu.index, now);
  const Json hold = {{"id", id},
                     {"kind", loop.diagnostic_kind},
                     {"reason", reason},
                     {"requested_ns", now},
                     {"drain", LoopDrainName(loop.drain)}};
  GPUFLEET_RETURN_IF_ERROR(WriteLoopStep(
      gpu.node, gpu.index, QuarantineDocName(device),
      [&](Json& g) {
        if (g.contains(kDiagnosticHoldField) || wire::StrOr(g, "health") == QuarantinedName()) {
          return false;
        }
        g[kDiagnosticHoldField] = hold;
        return true;
      },
      [&](Json& record) {
        record[kLoopField]["phase"] = "diagnosing";
        record[kLoopField]["diagnostic"] = id;
        record[kLoopField]["diagnosed_failures"] = failures;
        record[kLoopField]["updated_ns"] = now;
      },
      fmt::format("gpu {} ({}) suspect: {}; diagnostic {} ({}) asked, drain {}", gpu.index, gpu.key,
                  reason, id, loop.diagnostic_kind, LoopDrainName(loop.drain))));
  gpu.diagnostic = hold;
  result.diagnosed.push_back(device.ToString());
  const std::string drain_reason =
      fmt::format("gpu {} of {} drained for diagnostic {}", gpu.index, gpu.node, id);
  switch (loop.drain) {
    case LoopDrain::kNow: {
      GPUFLEET_ASSIGN_OR_RETURN(const int preempted,
                                PreemptRunsOn(analysis, device, "preempted: " + drain_reason));
      result.preempted_runs += preempted;
      break;
    }
    case LoopDrain::kAfterTimeout: {
      const int64_t deadline =
          now + std::chrono::duration_cast<std::chrono::nanoseconds>(loop.drain_timeout).count();
      GPUFLEET_ASSIGN_OR_RETURN(const int noticed,
                                PreemptRunsOn(analysis, device, drain_reason, deadline));
      result.noticed_runs += noticed;
      break;
    }
    case LoopDrain::kAfterJob:
      break;  // the hold keeps new work off; the agent starts the diagnostic when the task ends
  }
  return Status::Ok();
}

// ---- routes -------------------------------------------------------------------------------

Result<Json> ReliabilityController::ReportOutcome(std::string_view actor, std::string_view body) {
  GPUFLEET_ASSIGN_OR_RETURN(const OutcomeReport report, ParseOutcomeReport(body));
  if (Status status = store::ValidateKey("job", report.job); !status.ok()) {
    return status;
  }
  const Result<store::StoredObject> job = store_.Get(kJobsKind, report.job);
  if (!job.ok()) {
    if (job.status().code() == StatusCode::kNotFound) {
      return NotFoundError(fmt::format("outcome for unknown job \"{}\"", report.job));
    }
    return job.status();
  }
  const Json job_doc = wire::ParseDocument(job->data);
  const int64_t runs = wire::IntOr(job_doc, "attempt", 0);
  if (report.attempt > runs) {
    return InvalidArgumentError(fmt::format("attempt: {} (job \"{}\" has had {} run{})",
                                            report.attempt, report.job, runs,
                                            runs == 1 ? "" : "s"));
  }
  if (report.attempt == runs && IsRunGoing(wire::StrOr(job_doc, "state"))) {
    return FailedPreconditionError(
        fmt::format("job \"{}\" run {} is still going: report its outcome once it has ended",
                    report.job, report.attempt));
  }
  const std::string name = OutcomeName(report.job, report.attempt);
  GPUFLEET_ASSIGN_OR_RETURN(const Fleet fleet, LoadFleet());
  for (int attempt = 0;; ++attempt) {
    const Result<store::StoredObject> stored = store_.Get(kOutcomesKind, name);
    if (!stored.ok()) {
      if (stored.status().code() == StatusCode::kNotFound) {
        return NotFoundError(fmt::format("no outcome of run {} of job \"{}\" is stored",
                                         report.attempt, report.job));
      }
      return stored.status();
    }
    GPUFLEET_ASSIGN_OR_RETURN(StoredOutcome outcome,
                              OutcomeFromJson(wire::ParseDocument(stored->data)));
    // The report's evidence alone first, so that an error names the report's own entries.
    reliability::OutcomeRecord check = outcome.record;
    check.exit_reason = report.exit_reason;
    check.xids = report.xids;
    check.health_events = report.health_events;
    GPUFLEET_RETURN_IF_ERROR(reliability::ValidateOutcome(check, fleet.inventory));

    const reliability::ExitReason was = outcome.record.exit_reason;
    outcome.record.exit_reason = report.exit_reason;
    outcome.record.xids.insert(outcome.record.xids.end(), report.xids.begin(), report.xids.end());
    outcome.record.health_events.insert(outcome.record.health_events.end(),
                                        report.health_events.begin(), report.health_events.end());
    outcome.reported_by = std::string(actor);
    Json doc = OutcomeToJson(outcome);
    store::WriteBatch batch;
    batch.Update(std::string(kOutcomesKind), name, doc.dump(), stored->version);
    std::string event = fmt::format("outcome of run {} reported by {}: {} (was {})", report.attempt,
                                    actor, reliability::ExitReasonName(report.exit_reason),
                                    reliability::ExitReasonName(was));
    if (!report.note.empty()) {
      event += ": " + report.note;
    }
    batch.AppendEvent(std::string(kJobsKind), report.job, event);
    const Status status = store_.Commit(batch);
    if (status.ok()) {
      doc["name"] = name;
      doc["version"] = stored->version + 1;
      return doc;
    }
    if (status.code() != StatusCode::kAborted || attempt + 1 == kWriteAttempts) {
      return status;
    }
  }
}

Result<Json> ReliabilityController::ListOutcomes(std::string_view job) {
  const std::string prefix = job.empty() ? "" : fmt::format("{}/", job);
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> objects,
                            store_.List(kOutcomesKind, prefix));
  Json items = Json::array();
  for (const store::StoredObject& object : objects) {
    Json doc = wire::ParseDocument(object.data);
    doc["name"] = object.name;
    doc["version"] = object.version;
    items.push_back(std::move(doc));
  }
  return Json{{"items", std::move(items)}};
}

Result<Json> ReliabilityController::FailureReport() {
  GPUFLEET_ASSIGN_OR_RETURN(const std::unique_ptr<Analysis> analysis, Analyse());
  const reliability::AttributionEngine& engine = analysis->monitor->engine();
  const Fleet& fleet = analysis->fleet;
  const reliability::AttributionReport report = engine.Analyze();
  std::vector<Device> flagged;
  for (const DeviceEvidence& suspect : report.suspects) {
    flagged.push_back(suspect.device);
  }
  const reliability::FailureConcentration concentration =
      engine.Concentration(flagged, report.rates);

  int rank = 0;
  auto evidence_json = [&](const DeviceEvidence& e) {
    Json xids = Json::object();
    for (const auto& [xid, count] : e.xids) {
      xids[std::to_string(xid)] = count;
    }
    Json entry = {{"rank", ++rank},
                  {"device", reliability::DeviceKindName(e.device.kind)},
                  {"id", e.device.id},
                  {"leaf", e.leaf},
                  {"runs", e.runs},
                  {"failures", e.failures},
                  {"named_failures", e.attributed_failures},
                  {"gpu_hours", e.gpu_hours},
                  {"expected", e.expected},
                  {"rate_ratio", Number(e.RateRatio())},
                  {"p_value", e.p_value},
                  {"q_value", e.q_value},
                  {"flagged", e.flagged},
                  {"xids", std::move(xids)},
                  {"health_checks", e.health_checks},
                  {"quarantined", fleet.IsQuarantined(e.device)}};
    if (const Fleet::Gpu* gpu =
            e.device.kind == DeviceKind::kGpu ? fleet.FindGpu(e.device.id) : nullptr) {
      entry["node"] = gpu->node;
      entry["gpu"] = gpu->index;
    } else {
      entry["node"] = e.device.id;
    }
    return entry;
  };
  Json suspects = Json::array();
  for (const DeviceEvidence& e : report.suspects) {
    suspects.push_back(evidence_json(e));
  }
  Json runners_up = Json::array();
  for (const DeviceEvidence& e : report.runners_up) {
    runners_up.push_back(evidence_json(e));
  }
  Json quarantines = Json::array();
  for (const auto& [name, doc] : analysis->quarantine_docs) {
    const std::optional<Device> device = DeviceOfDoc(doc);
    if (wire::StrOr(doc, "state") != "quarantined" || !device || !fleet.IsQuarantined(*device)) {
      continue;
    }
    Json entry = doc;
    entry.erase("version");
    entry.erase("state");
    entry.erase("evidence_since_ns");
    entry.erase("released_ns");
    quarantines.push_back(std::move(entry));
  }
  // The loop: each GPU it has looked at, with its phase and its latest audit events.
  constexpr size_t kLoopEvents = 8;
  Json loop = Json::array();
  for (const auto& [name, doc] : analysis->quarantine_docs) {
    if (!doc.contains(kLoopField)) {
      continue;
    }
    Json entry = {{"device", wire::StrOr(doc, "device")},
                  {"id", wire::StrOr(doc, "id")},
                  {"node", wire::StrOr(doc, "node")},
                  {"gpu", wire::IntOr(doc, "gpu", -1)},
                  {"phase", wire::StrOr(doc[kLoopField], "phase")},
                  {"updated_ns", wire::IntOr(doc[kLoopField], "updated_ns", 0)},
                  {"remediations", wire::ArrayOr(doc[kLoopField], "remediations").size()}};
    Json events = Json::array();
    const Result<std::vector<store::StoredEvent>> stored = store_.Events(kQuarantinesKind, name);
    if (stored.ok()) {
      for (size_t i = stored->size() > kLoopEvents ? stored->size() - kLoopEvents : 0;
           i < stored->size(); ++i) {
        events.push_back((*stored)[i].text);
      }
    }
    entry["events"] = std::move(events);
    loop.push_back(std::move(entry));
  }
  Json breaker = {{"open", false},
                  {"share", options_.loop.breaker_share},
                  {"window_s", options_.loop.breaker_window.count()}};
  if (const Result<store::StoredObject> stored =
          store_.Get(kClusterKind, std::string(kBreakerName));
      stored.ok()) {
    breaker.update(wire::ParseDocument(stored->data));
  }
  const reliability::FleetRates& rates = report.rates;
  return Json{
      {"loop", std::move(loop)},
      {"breaker", std::move(breaker)},
      {"window_hours",
       std::chrono::duration<double, std::ratio<3600>>(options_.attribution.window).count()},
      {"fleet", {{"gpus", fleet.inventory.gpu_count()}, {"nodes", fleet.inventory.node_count()}}},
      {"runs", report.runs},
      {"failed_runs", report.failed_runs},
      {"unattributed_failed_runs", report.unattributed_failed_runs},
      {"application_failed_runs", report.application_failed_runs},
      {"skipped_outcomes", analysis->skipped},
      {"rates",
       {{"gpu_hours", rates.gpu_hours},
        {"gpu_per_gpu_hour", rates.gpu_rate},
        {"node_per_gpu_hour", rates.node_rate},
        {"unattributed_per_gpu_hour", rates.unattributed_rate}}},
      {"concentration",
       {{"devices", concentration.devices},
        {"gpus", concentration.gpus},
        {"fleet_share", concentration.fleet_share},
        {"failed_runs", concentration.failed_runs},
        {"failed_runs_involving", concentration.failed_runs_involving},
        {"failed_share", concentration.failed_share},
        {"expected_involving", concentration.expected_involving},
        {"avoidable", concentration.avoidable}}},
      {"summary", reliability::ConcentrationSummary(concentration)},
      {"suspects", std::move(suspects)},
      {"runners_up", std::move(runners_up)},
      {"quarantines", std::move(quarantines)}};
}

}  // namespace gpufleet::control
