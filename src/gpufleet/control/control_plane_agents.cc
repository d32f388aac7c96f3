// SPDX-License-Identifier: Apache-2.0
// The agent sessions of the control plane: registration, heartbeats and the task reports they
// carry (lifecycle transitions), the desired tasks they answer, GPU UUID ownership and provenance
// records (docs/agent.md).
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "gpufleet/control/control_plane.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/lifecycle_controller.h"
#include "gpufleet/control/mig_node_docs.h"
#include "gpufleet/control/placement_gpus.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/image_reference.h"
#include "gpufleet/core/json_scan.h"
#include "gpufleet/scheduler/plugins/filters.h"
#include "gpufleet/scheduler/snapshot.h"
#include "gpufleet/store/read_modify_write.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_fields.h"
#include "gpufleet/wire/node_json.h"

namespace gpufleet::control {
namespace {

// "JOB/TASK/ATTEMPT" -> its parts; nullopt when malformed. Split from the right: JOB, a job's
// key TEAM/NAME, may hold a '/', TASK does not.
struct TaskId {
  std::string job;
  std::string task;
  int64_t attempt = 0;
};
std::optional<TaskId> ParseTaskId(std::string_view id) {
  const size_t last = id.rfind('/');
  const size_t before = last == std::string_view::npos || last == 0 ? std::string_view::npos
                                                                    : id.rfind('/', last - 1);
  if (before == std::string_view::npos || before == 0) {
    return std::nullopt;
  }
  TaskId out{std::string(id.substr(0, before)),
             std::string(id.substr(before + 1, last - before - 1))};
  const std::string_view attempt = id.substr(last + 1);
  const auto [end, error] =
      std::from_chars(attempt.data(), attempt.data() + attempt.size(), out.attempt);
  if (error != std::errc() || end != attempt.data() + attempt.size()) {
    return std::nullopt;
  }
  return out;
}

// The image the agent runs for a task of `image` in the job of `spec`: with
// `identicalStack.imageDigest` (docs/provenance.md) the repository at that digest,
// "name@sha256:...", so that every node pulls exactly it whatever the tag points to now (podman
// takes no tag beside a digest); else `image`.
std::string ImageToRun(const Job& spec, const std::string& image) {
  const std::string& digest = spec.identical_image_digest;
  if (image.empty() || digest.empty() || !ImageReferenceDigest(image).empty()) {
    return image;
  }
  const size_t slash = image.rfind('/');
  const size_t colon = image.find(':', slash == std::string::npos ? 0 : slash);
  return fmt::format("{}@{}", image.substr(0, colon), digest);
}

// Records on the placement what the agent reports about the task's image: how long its pull
// took ("image_pull_ms", once per run, and when it ended) and the digest the container runs
// ("image_digest").
// Returns the event, e.g. "task main-0 pulled localhost/tiny:1 in 12.3 s on n1"; nullopt when
// nothing is new.
std::optional<std::string> RecordImageReport(const Json& job, Json& placement,
                                             const std::string& node,
                                             const wire::TaskReport& report, int64_t now_ns) {
  const bool new_pull = report.image_pull_ms && !placement.contains("image_pull_ms");
  const bool new_digest =
      !report.image_digest.empty() && wire::StrOr(placement, "image_digest") != report.image_digest;
  if (!new_pull && !new_digest) {
    return std::nullopt;
  }
  const std::string task = wire::StrOr(placement, "task");
  const std::string image = PlacementImage(job, placement);
  if (new_digest) {
    placement["image_digest"] = report.image_digest;
  }
  if (!new_pull) {
    return fmt::format("task {} runs {} ({}) on {}", task, image, report.image_digest, node);
  }
  placement["image_pull_ms"] = *report.image_pull_ms;
  StampImagePulled(placement, now_ns);
  // The digest goes in the event too: a finished job's placements are gone, its events stay.
  const std::string digest = wire::StrOr(placement, "image_digest");
  return fmt::format("task {} pulled {}{} in {:.1f} s on {}", task, image,
                     digest.empty() ? "" : fmt::format(" ({})", digest),
                     static_cast<double>(*report.image_pull_ms) / 1000.0, node);
}

// Applies one node's task reports to a Stopping job: a task the agent reports ended, or does not
// report at all, is gone (the agent reports every task it has until the server has taken its
// end, and it never starts a task of a run that is stopping). Returns the events.
// Why the task of a placement being stopped is gone, from its agent's `report` on `node` (nullptr:
// not reported); nullopt while it may still run.
std::optional<std::string> StoppedTaskGone(const std::string& node, const wire::TaskReport* report,
                                           bool absent_means_gone) {
  // A task whose image is being pulled is live too: its pull ends first, then it reports so.
  if ((report != nullptr && (report->phase == wire::TaskPhase::kRunning ||
                             report->phase == wire::TaskPhase::kPulling)) ||
      (report == nullptr && !absent_means_gone)) {
    return std::nullopt;
  }
  return report == nullptr || report->phase == wire::TaskPhase::kWaiting
             ? fmt::format("not running on {}", node)
             : fmt::format("ended on {}: {}", node,
                           report->message.empty() ? fmt::format("exit code {}", report->exit_code)
                                                   : report->message);
}

const wire::TaskReport* FindReport(const std::map<std::string, const wire::TaskReport*>& reports,
                                   const std::string& id) {
  const auto it = reports.find(id);
  return it == reports.end() ? nullptr : it->second;
}

std::vector<std::string> ApplyStoppingReports(
    Json& job, const std::string& node,
    const std::map<std::string, const wire::TaskReport*>& reports, bool absent_means_gone) {
  std::vector<std::string> events;
  const std::string name = TeamScopedKeyOf(job);
  const int64_t attempt = wire::IntOr(job, "attempt", 0);
  for (Json& placement : job["placements"]) {
    if (wire::StrOr(placement, "node") != node || PlacementGone(placement)) {
      continue;
    }
    const std::string task = wire::StrOr(placement, "task");
    const std::optional<std::string> why = StoppedTaskGone(
        node, FindReport(reports, wire::MakeTaskId(name, task, attempt)), absent_means_gone);
    if (!why) {
      continue;
    }
    MarkPlacementGone(placement, *why);
    events.push_back(fmt::format("task {} {}", task, *why));
  }
  if (std::optional<std::string> finished = FinishStoppingIfDone(job)) {
    events.push_back(std::move(*finished));
  }
  return events;
}

// When reports are applied: RFC 3339 text (empty without a wall clock) for the records a person
// reads, and nanoseconds (UsageNowNanos) for the stamps the controllers compare.
struct ReportTime {
  std::string text;
  int64_t nanos = 0;
};

// Keeps on the job the newest checkpoint its tasks on `node` report ("last_checkpoint_ns"), never
// later than the server's `now_ns`: an agent whose clock runs ahead must not make a job look
// saved in the future. A Stopping job's too: a task may save in its grace. Whether it changed;
// written without an event, since a job may save every few minutes.
bool RecordCheckpointReports(Json& job, const std::string& node,
                             const std::map<std::string, const wire::TaskReport*>& reports,
                             int64_t now_ns) {
  const std::string name = TeamScopedKeyOf(job);
  const int64_t attempt = wire::IntOr(job, "attempt", 0);
  std::optional<int64_t> newest;
  for (const Json& placement : job["placements"]) {
    if (wire::StrOr(placement, "node") != node) {
      continue;
    }
    const auto it = reports.find(wire::MakeTaskId(name, wire::StrOr(placement, "task"), attempt));
    if (it != reports.end() && it->second->last_checkpoint_unix_s) {
      newest = std::max(newest.value_or(0), *it->second->last_checkpoint_unix_s);
    }
  }
  if (!newest) {
    return false;
  }
  const int64_t checkpoint_ns = std::min(*newest * 1'000'000'000, now_ns);
  if (job.contains("last_checkpoint_ns") &&
      wire::IntOr(job, "last_checkpoint_ns", 0) >= checkpoint_ns) {
    return false;
  }
  job["last_checkpoint_ns"] = checkpoint_ns;
  return true;
}

// Applies one node's task reports and drain-now GPUs (by index) to an active job; `node_gpus` is
// the node document's "gpus". A run one of whose GPUs (by UUID) the node no longer has ends too.
// Returns the events to log; `progressed` is set when a pull's progress or the job's last
// checkpoint changed, which is written without an event (no events and no progress: nothing
// changed).
std::vector<std::string> ApplyReports(Json& job, const std::string& node, const Json& node_gpus,
                                      const std::map<std::string, const wire::TaskReport*>& reports,
                                      const std::set<int64_t>& drain_now_gpus,
                                      const ReportTime& now, bool absent_means_gone,
                                      bool& progressed) {
  std::vector<std::string> events;
  const std::optional<JobState> state = StoredJobState(job);
  if (!state || !HoldsResources(*state) || !job.contains("placements") ||
      !job["placements"].is_array()) {
    return events;
  }
  if (RecordCheckpointReports(job, node, reports, now.nanos)) {
    progressed = true;
  }
  if (*state == JobState::kStopping) {
    return ApplyStoppingReports(job, node, reports, absent_means_gone);
  }
  const std::string name = TeamScopedKeyOf(job);
  const int64_t attempt = wire::IntOr(job, "attempt", 0);
  for (Json& placement : job["placements"]) {
    if (wire::StrOr(placement, "node") != node) {
      continue;
    }
    for (const PlacedGpu& placed : PlacedGpus(placement)) {
      const Json* gpu = FindPlacedGpu(node_gpus, placed);
      std::string why;
      if (gpu == nullptr && !PlacementGone(placement)) {
        // Registration ends such runs; a placement committed against the node's inventory before
        // it registered again ends here, never on another GPU.
        why = fmt::format("{} of {} is no longer on the node (task {})", placed.Describe(), node,
                          wire::StrOr(placement, "task"));
      } else if (gpu != nullptr && drain_now_gpus.count(wire::IntOr(*gpu, "index", -1)) > 0) {
        why = fmt::format("{} of {} must be drained now (task {})",
                          PlacedGpu{placed.uuid, wire::IntOr(*gpu, "index", -1)}.Describe(), node,
                          wire::StrOr(placement, "task"));
      }
      if (why.empty()) {
        continue;
      }
      events.push_back(EndRunOnFailure(job, why, now.text));
      // The other tasks on this node may have ended too.
      for (std::string& event :
           ApplyReports(job, node, node_gpus, reports, {}, now, absent_means_gone, progressed)) {
        events.push_back(std::move(event));
      }
      return events;
    }
    const std::string task = wire::StrOr(placement, "task");
    const auto it = reports.find(wire::MakeTaskId(name, task, attempt));
    if (placement.contains("release")) {
      // A rank a shrink releases (docs/job-spec.md, "Elastic jobs"): its end, whatever its exit
      // code (it was stopped), or its absence, leaves the job running on without it.
      if (PlacementGone(placement)) {
        continue;
      }
      if (const std::optional<std::string> why = StoppedTaskGone(
              node, it == reports.end() ? nullptr : it->second, absent_means_gone)) {
        MarkPlacementGone(placement, *why);
        events.push_back(fmt::format("task {} {}", task, *why));
      }
      continue;
    }
    if (it == reports.end()) {
      continue;
    }
    if (PlacementGone(placement)) {
      // A task's end is final: a report that says otherwise was sent before it and delivered
      // late (a heartbeat retried or held up on the way), and would start the task again.
      continue;
    }
    const wire::TaskReport& report = *it->second;
    if (std::optional<std::string> event =
            RecordImageReport(job, placement, node, report, now.nanos)) {
      events.push_back(std::move(*event));
    }
    const std::string phase = wire::TaskPhaseName(report.phase);
    if (report.phase == wire::TaskPhase::kPulling) {
      // Progress is kept without an event: it changes with every layer.
      std::string progress = report.message.substr(0, wire::kMaxPullProgressBytes);
      if (wire::StrOr(placement, "image_pull_progress") != progress) {
        placement["image_pull_progress"] = std::move(progress);
        progressed = true;
      }
    } else {
      placement.erase("image_pull_progress");
    }
    if (wire::StrOr(placement, "phase") == phase) {
      continue;
    }
    placement["phase"] = phase;
    if (TaskStarted(placement)) {
      StampTaskStarted(placement, now.nanos);
    }
    if (report.phase == wire::TaskPhase::kPulling) {
      events.push_back(
          fmt::format("task {} pulling {} on {}", task, PlacementImage(job, placement), node));
      continue;
    }
    if (report.phase == wire::TaskPhase::kRunning) {
      events.push_back(fmt::format("task {} running on {}", task, node));
      continue;
    }
    if (report.phase == wire::TaskPhase::kWaiting) {
      events.push_back(fmt::format("task {} waiting on {}: {}", task, node, report.message));
      continue;
    }
    placement["exit_code"] = report.exit_code;
    if (report.phase == wire::TaskPhase::kFailed) {
      const std::string why = fmt::format(
          "task {} on {} failed: {}", task, node,
          report.message.empty() ? fmt::format("exit code {}", report.exit_code) : report.message);
      // The gang fails; its other tasks are stopped before their GPUs are free.
      Result<std::string> event = EndRun(job, JobState::kFailed, why, now.text);
      events.push_back(event.ok() ? *event : why);
      for (std::string& more :
           ApplyReports(job, node, node_gpus, reports, {}, now, absent_means_gone, progressed)) {
        events.push_back(std::move(more));
      }
      return events;
    }
    events.push_back(fmt::format("task {} succeeded on {}", task, node));
  }
  // A released rank known gone leaves the job, and only then its GPUs are free.
  Json& placements = job["placements"];
  for (auto placement = placements.begin(); placement != placements.end();) {
    if (placement->contains("release") && PlacementGone(*placement)) {
      events.push_back(fmt::format("task {} released: the job runs on with {} tasks",
                                   wire::StrOr(*placement, "task"), placements.size() - 1));
      placement = placements.erase(placement);
    } else {
      ++placement;
    }
  }
  if (events.empty()) {
    return events;
  }
  bool all_started = true;
  bool all_succeeded = true;
  for (const Json& placement : job["placements"]) {
    all_started = all_started && TaskStarted(placement);
    all_succeeded = all_succeeded && wire::StrOr(placement, "phase") == "Succeeded";
  }
  if (all_succeeded) {
    Result<std::string> event =
        EndRun(job, JobState::kSucceeded, "every task exited with code 0", now.text);
    events.push_back(event.ok() ? *event : event.status().message());
  } else if (all_started && StoredJobState(job) == JobState::kScheduled) {
    if (Result<std::string> event =
            TransitionJob(job, JobState::kRunning, "", "running: every task has started");
        event.ok()) {
      events.push_back(*event);
    }
  }
  return events;
}

// The pull times, in seconds, of the placements that have one in `after` but not in `before`.
std::vector<double> NewImagePulls(const Json& before, const Json& after) {
  std::set<std::string> seen;
  for (const Json& placement : wire::ArrayOr(before, "placements")) {
    if (placement.contains("image_pull_ms")) {
      seen.insert(wire::StrOr(placement, "task"));
    }
  }
  std::vector<double> out;
  for (const Json& placement : wire::ArrayOr(after, "placements")) {
    if (placement.contains("image_pull_ms") && seen.count(wire::StrOr(placement, "task")) == 0) {
      out.push_back(static_cast<double>(wire::IntOr(placement, "image_pull_ms", 0)) / 1000.0);
    }
  }
  return out;
}

// Renames the GPUs of the placements of `job` on `node` for the node's new inventory `after` (its
// stored document was `before`): each keeps its GPUs by UUID, at their index now
// (RenamePlacedGpus). Returns why the run cannot go on there: a GPU it holds is gone, or the
// node's CPU or memory no longer holds its tasks. nullopt: it goes on.
std::optional<std::string> RenameForReregistration(Json& job, const std::string& node,
                                                   const Json& before, const Json& after) {
  if (!job.contains("placements") || !job["placements"].is_array()) {
    return std::nullopt;
  }
  int64_t cpu = 0;
  int64_t memory = 0;
  std::optional<std::string> broken;
  for (Json& placement : job["placements"]) {
    if (wire::StrOr(placement, "node") != node || PlacementGone(placement)) {
      continue;
    }
    cpu += wire::IntOr(placement, "cpu_milli", 0);
    memory += wire::IntOr(placement, "memory_mib", 0);
    const std::optional<PlacedGpu> gone =
        RenamePlacedGpus(placement, wire::ArrayOr(before, "gpus"), wire::ArrayOr(after, "gpus"));
    if (gone && !broken) {
      broken = gone->uuid.empty()
                   ? fmt::format("{} registered again without its gpu {} (task {})", node,
                                 gone->index, wire::StrOr(placement, "task"))
                   : fmt::format(
                         "{} registered again without its GPU {} (gpu {} when placed, "
                         "task {})",
                         node, gone->uuid, gone->index, wire::StrOr(placement, "task"));
    }
  }
  if (broken) {
    return broken;
  }
  if (cpu > wire::IntOr(after, "cpu_milli", 0) || memory > wire::IntOr(after, "memory_mib", 0)) {
    return fmt::format(
        "{} registered again with {} milli-CPU and {} MiB, less than its tasks hold ({} and {})",
        node, wire::IntOr(after, "cpu_milli", 0), wire::IntOr(after, "memory_mib", 0), cpu, memory);
  }
  return std::nullopt;
}

// Merges a registering node's inventory into its stored document, keeping what operators set
// (cordon/drain state, quarantined GPUs).
Json MergeInventory(const Json* stored, const Node& node, const std::vector<std::string>& levels) {
  Json doc = wire::NodeToJson(node, levels);
  doc["agent"] = true;
  if (stored == nullptr) {
    return doc;
  }
  doc["state"] = wire::StrOr(*stored, "state", "Ready");
  if (stored->contains("state_before_not_ready")) {
    doc["state_before_not_ready"] = (*stored)["state_before_not_ready"];
  }
  // The images the node held stay until its next heartbeat lists them.
  // Its registration stays the first one: the usage report counts its capacity from then.
  for (const char* key : {"images", "images_dropped", "registered_ns"}) {
    if (stored->contains(key)) {
      doc[key] = (*stored)[key];
    }
  }
  // So do its link problems, and with them its label: a restarted agent does not clear them.
  if (stored->contains("link_problems")) {
    doc["link_problems"] = (*stored)["link_problems"];
    doc["labels"][std::string(kLinkDegradedLabel)] = "true";
  }
  for (Json& gpu : doc["gpus"]) {
    // The same physical GPU (by UUID) keeps its quarantine and MIG state, whatever its index now.
    const Json* old =
        FindPlacedGpu(wire::ArrayOr(*stored, "gpus"),
                      PlacedGpu{wire::StrOr(gpu, "uuid"), wire::IntOr(gpu, "index", -1)});
    if (old == nullptr) {
      continue;
    }
    if (wire::StrOr(*old, "health") == GpuHealthName(GpuHealth::kQuarantined)) {
      gpu["health"] = GpuHealthName(GpuHealth::kQuarantined);
      if (const auto reason = old->find("quarantine_reason"); reason != old->end()) {
        gpu["quarantine_reason"] = *reason;
      }
    }
    // So does the reliability loop's hold for a diagnostic: only its result or the node's lost
    // lease frees the GPU.
    if (const auto hold = old->find(kDiagnosticHoldField); hold != old->end()) {
      gpu[kDiagnosticHoldField] = *hold;
    }
    if (!wire::BoolOr(gpu, "mig_enabled", false) || !wire::BoolOr(*old, "mig_enabled", false)) {
      continue;
    }
    // The server owns the layout: a change the agent had not finished (the wanted instances
    // differ from the ones it last reported) stays wanted; otherwise the node's layout as it
    // is now becomes the wanted one (an operator may have changed it while the agent was down).
    const Json& wanted = wire::ArrayOr(*old, "mig_instances");
    const Json& reported = wire::ArrayOr(*old, "mig_devices");
    if (!SameMigInstances(MigInstancesFromJson(wanted), MigInstancesFromJson(reported))) {
      gpu["mig_instances"] = wanted;
    }
    gpu["mig_devices"] = reported;
    if (old->contains("mig_error")) {
      gpu["mig_error"] = (*old)["mig_error"];
    }
  }
  return doc;
}

// Applies a GPU report's MIG devices and error to its node document entry; returns the events.
std::vector<std::string> ApplyMigReport(Json& gpu, const wire::GpuReport& report) {
  std::vector<std::string> events;
  if (report.mig_devices && wire::BoolOr(gpu, "mig_enabled", false)) {
    Json devices = Json::array();
    std::vector<MigInstance> instances;
    for (const wire::MigDeviceReport& device : *report.mig_devices) {
      devices.push_back(
          {{"uuid", device.uuid}, {"profile", device.profile}, {"start", device.start}});
      instances.push_back({device.profile, device.start});
    }
    if (wire::ArrayOr(gpu, "mig_devices") != devices) {
      gpu["mig_devices"] = std::move(devices);
      events.push_back(fmt::format("gpu {}: MIG instances now {}", report.index,
                                   wire::DescribeMigInstances(instances)));
    }
  }
  if (wire::StrOr(gpu, "mig_error") != report.mig_error) {
    if (report.mig_error.empty()) {
      gpu.erase("mig_error");
    } else {
      gpu["mig_error"] = report.mig_error;
      events.push_back(
          fmt::format("gpu {}: MIG layout not applied: {}", report.index, report.mig_error));
    }
  }
  return events;
}

// Applies a heartbeat's image list to a node document ("images", and "images_dropped" saying
// what the parser did not keep); returns the events (empty: nothing changed).
std::vector<std::string> ApplyImageReport(Json& doc, const wire::HeartbeatRequest& request) {
  std::vector<std::string> events;
  if (!request.images) {
    return events;
  }
  const Json images = wire::CachedImagesToJson(*request.images);
  if (wire::ArrayOr(doc, "images") != images) {
    doc["images"] = images;
    int64_t bytes = 0;
    for (const CachedImage& image : *request.images) {
      bytes += image.size_bytes;
    }
    events.push_back(fmt::format("images: {} held ({:.1f} GiB)", request.images->size(),
                                 static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0)));
  }
  if (wire::StrOr(doc, "images_dropped") != request.images_dropped) {
    if (request.images_dropped.empty()) {
      doc.erase("images_dropped");
    } else {
      doc["images_dropped"] = request.images_dropped;
      events.push_back(fmt::format("images not kept: {}", request.images_dropped));
    }
  }
  return events;
}

// Applies a heartbeat's link problems to a node document ("link_problems" and the
// kLinkDegradedLabel label); returns the events (empty: nothing changed).
std::vector<std::string> ApplyLinkProblems(Json& doc, const wire::HeartbeatRequest& request) {
  std::vector<std::string> events;
  const Json problems = request.link_problems;
  if (wire::ArrayOr(doc, "link_problems") == problems) {
    return events;
  }
  std::map<std::string, std::string> labels = wire::StringMapOr(doc, "labels");
  if (request.link_problems.empty()) {
    doc.erase("link_problems");
    labels.erase(std::string(kLinkDegradedLabel));
    events.push_back("links healthy again");
  } else {
    doc["link_problems"] = problems;
    labels[std::string(kLinkDegradedLabel)] = "true";
    events.push_back(fmt::format("links degraded: {}", fmt::join(request.link_problems, "; ")));
  }
  doc["labels"] = labels;
  return events;
}

// Records on the node document's GPUs the final results the agent reports of the diagnostics
// they are held for ("diagnostic": {..., "result"}); the reliability step acts on them, and the
// GPU stays held until then. Returns the events.
std::vector<std::string> ApplyDiagnosticReports(
    Json& doc, const std::vector<wire::DiagnosticResult>& reports) {
  std::vector<std::string> events;
  if (reports.empty() || !doc.contains("gpus") || !doc["gpus"].is_array()) {
    return events;
  }
  for (Json& gpu : doc["gpus"]) {
    if (!gpu.contains(kDiagnosticHoldField) || gpu[kDiagnosticHoldField].contains("result")) {
      continue;
    }
    Json& hold = gpu[kDiagnosticHoldField];
    const std::string id = wire::StrOr(hold, "id");
    for (const wire::DiagnosticResult& report : reports) {
      if (report.id != id || !wire::IsFinal(report.phase)) {
        continue;
      }
      Json result = {{"phase", wire::DiagnosticPhaseName(report.phase)},
                     {"summary", report.summary},
                     {"output", report.output},
                     {"took_ms", report.took_ms}};
      if (report.exit_code) {
        result["exit_code"] = *report.exit_code;
      }
      hold["result"] = std::move(result);
      events.push_back(fmt::format("gpu {}: diagnostic {} {} in {} ms: {}",
                                   wire::IntOr(gpu, "index", -1), id,
                                   wire::DiagnosticPhaseName(report.phase), report.took_ms,
                                   report.summary.empty() ? "-" : report.summary));
    }
  }
  return events;
}

// The diagnostics a node whose agent runs them (wire::kDiagnosticsLabel) is asked for: those its
// GPUs are held for that have no result yet.
std::vector<wire::DesiredDiagnostic> WantedDiagnostics(const Json& doc) {
  std::vector<wire::DesiredDiagnostic> wanted;
  if (wire::StringMapOr(doc, "labels")[std::string(wire::kDiagnosticsLabel)] != "true") {
    return wanted;
  }
  for (const Json& gpu : wire::ArrayOr(doc, "gpus")) {
    if (!gpu.contains(kDiagnosticHoldField) || gpu[kDiagnosticHoldField].contains("result")) {
      continue;
    }
    const Json& hold = gpu[kDiagnosticHoldField];
    wanted.push_back({.id = wire::StrOr(hold, "id"),
                      .gpu_index = static_cast<int>(wire::IntOr(gpu, "index", 0)),
                      .gpu_uuid = wire::StrOr(gpu, "uuid"),
                      .kind = wire::StrOr(hold, "kind", "builtin")});
  }
  return wanted;
}

// Applies GPU reports to a node document; returns the events (empty: nothing changed).
// A GPU an operator quarantined stays Quarantined whatever the agent says; its reported health
// is kept beside it for `describe node` and for the release.
std::vector<std::string> ApplyGpuReports(Json& doc, const std::vector<wire::GpuReport>& reports) {
  std::vector<std::string> events;
  if (!doc.contains("gpus") || !doc["gpus"].is_array()) {
    return events;
  }
  for (const wire::GpuReport& report : reports) {
    for (Json& gpu : doc["gpus"]) {
      if (wire::IntOr(gpu, "index", -1) != report.index) {
        continue;
      }
      for (std::string& event : ApplyMigReport(gpu, report)) {
        events.push_back(std::move(event));
      }
      const std::string reported = GpuHealthName(report.health);
      const Json reasons = report.reasons;
      const bool changed = wire::StrOr(gpu, "reported_health", "Healthy") != reported ||
                           wire::ArrayOr(gpu, "reasons") != reasons;
      gpu["thermal_headroom_c"] = report.thermal_headroom_c;
      if (!changed) {
        continue;
      }
      gpu["reported_health"] = reported;
      gpu["reasons"] = reasons;
      gpu["drain"] = wire::DrainActionName(report.drain);
      if (wire::StrOr(gpu, "health") != GpuHealthName(GpuHealth::kQuarantined)) {
        gpu["health"] = reported;
      }
      events.push_back(report.reasons.empty()
                           ? fmt::format("gpu {}: {}", report.index, reported)
                           : fmt::format("gpu {}: {}: {}", report.index, reported,
                                         fmt::join(report.reasons, "; ")));
    }
  }
  return events;
}

// Whether every MIG instance the placements of `job` name has been reported by its node's agent.
// `node_doc_of` gives a node's stored document (nullptr when it cannot be read).
bool MigInstancesReported(const wire::JobRecord& job,
                          const std::function<const Json*(const std::string&)>& node_doc_of) {
  for (const wire::PlacementRecord& placement : job.placements) {
    const std::vector<PlacedGpu> placed = PlacedGpus(placement);
    for (size_t i = 0; i < placed.size(); ++i) {
      const wire::PlacedAssignment& assignment = placement.assignments[i];
      if (assignment.mig_profile.empty()) {
        continue;
      }
      const Json* node_doc = node_doc_of(placement.node);
      if (node_doc == nullptr) {
        return false;
      }
      const Json* gpu = FindPlacedGpu(wire::ArrayOr(*node_doc, "gpus"), placed[i]);
      if (gpu == nullptr ||
          FindMigDevice(*gpu, assignment.mig_profile, assignment.mig_start) == nullptr) {
        return false;
      }
    }
  }
  return true;
}

// The environment of an elastic job's tasks (docs/job-spec.md, "Elastic jobs").
constexpr std::string_view kWorldSizeEnv = "GPUFLEET_WORLD_SIZE";
constexpr std::string_view kRankEnv = "GPUFLEET_RANK";
constexpr std::string_view kRendezvousEnv = "GPUFLEET_RENDEZVOUS";
// Rendezvous ports are taken from this range by a hash of the job and its run, so that the runs
// of two jobs whose rank 0 shares a node seldom ask for the same port, and every rank computes
// the same one without asking.
constexpr uint64_t kRendezvousPortBase = 29400;
constexpr uint64_t kRendezvousPorts = 1000;

// "NODE:PORT" of the run's rank 0 (its replica 0, kept by every shrink); nullopt before it is
// placed. FNV-1a over "TEAM/NAME/ATTEMPT": stable across servers and releases.
std::optional<std::string> ElasticRendezvous(const wire::JobRecord& job) {
  for (const wire::PlacementRecord& placement : job.placements) {
    if (placement.replica != 0) {
      continue;
    }
    uint64_t hash = 14695981039346656037ULL;
    for (const char c : fmt::format("{}/{}", TeamScopedKey(job.team, job.name), job.attempt)) {
      hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
    }
    return fmt::format("{}:{}", placement.node, kRendezvousPortBase + hash % kRendezvousPorts);
  }
  return std::nullopt;
}

// Adds the tasks of `job` (whose spec is `spec`) that `node` should run to `reply`. A MIG task is
// added once the agent has reported each of its instances; it then names them and gets their
// MIG device UUIDs. The job's preemption notice goes with its tasks when the agent speaks
// `protocol` of wire::kNoticeAgentProtocol or later; an older agent's task gets the plain stop.
void AddDesiredTasks(const wire::JobRecord& job, const Job& spec, const Json& node_doc,
                     const std::string& node, wire::ProtocolVersion protocol, int64_t now_ns,
                     wire::AgentReply* reply) {
  if (!RunIsWanted(job.state)) {
    return;
  }
  const std::string name = TeamScopedKey(job.team, job.name);
  const std::optional<std::string> rendezvous =
      spec.IsElastic() ? ElasticRendezvous(job) : std::nullopt;
  for (const wire::PlacementRecord& placement : job.placements) {
    if (placement.node != node || placement.phase == "Succeeded" || placement.phase == "Failed") {
      continue;
    }
    // A released rank whose notice is over is no longer desired: its agent stops it.
    if (placement.release && NoticeOver(*placement.release, job.last_checkpoint_ns, now_ns)) {
      continue;
    }
    wire::DesiredTask task;
    task.job = job.name;
    task.task = placement.task;
    task.team = job.team;
    task.queue = job.queue;
    task.id = wire::MakeTaskId(name, task.task, job.attempt);
    if (placement.group >= 0 && placement.group < static_cast<int>(spec.groups.size())) {
      const TaskGroup& group = spec.groups[placement.group];
      task.command = group.command;
      task.env = group.env;
      task.image = ImageToRun(spec, group.image);
      task.image_pull_policy = group.image_pull_policy;
      task.host_network = group.host_network;
    }
    if (rendezvous) {
      task.env[std::string(kWorldSizeEnv)] =
          std::to_string(job.world_size.value_or(static_cast<int64_t>(job.placements.size())));
      task.env[std::string(kRankEnv)] = std::to_string(placement.replica);
      task.env[std::string(kRendezvousEnv)] = *rendezvous;
    }
    const std::vector<PlacedGpu> placed = PlacedGpus(placement);
    bool gpus_found = true;
    for (size_t i = 0; i < placed.size() && gpus_found; ++i) {
      // By UUID, wherever the node lists it now; a GPU it no longer has is never replaced by
      // another (ApplyReports ends the run).
      const Json* gpu = FindPlacedGpu(wire::ArrayOr(node_doc, "gpus"), placed[i]);
      const wire::PlacedAssignment& assignment = placement.assignments[i];
      if (gpu == nullptr || wire::StrOr(*gpu, "uuid").empty()) {
        gpus_found = false;
      } else if (assignment.mig_profile.empty()) {
        task.gpu_uuids.push_back(wire::StrOr(*gpu, "uuid"));
      } else {
        const Json* device = FindMigDevice(*gpu, assignment.mig_profile, assignment.mig_start);
        // The agent creates the instance first; the task follows its report.
        gpus_found = device != nullptr;
        if (device != nullptr) {
          task.mig_instances.push_back({static_cast<int>(wire::IntOr(*gpu, "index", -1)),
                                        assignment.mig_profile, assignment.mig_start,
                                        wire::StrOr(*device, "uuid")});
          task.gpu_uuids.push_back(wire::StrOr(*device, "uuid"));
        }
      }
    }
    if (!gpus_found) {
      continue;
    }
    for (const wire::PlacedAssignment& assignment : placement.assignments) {
      task.gpu_milli += assignment.milli;
      if (assignment.mps) {
        task.mps = true;
        task.gpu_memory_mib += assignment.memory_mib;
      }
    }
    task.cpu_milli = placement.cpu_milli;
    task.memory_mib = placement.memory_mib;
    const std::optional<wire::NoticeRecord>& notice =
        placement.release ? placement.release : job.notice;
    if (notice && protocol >= wire::kNoticeAgentProtocol) {
      task.notice =
          wire::TaskNotice{.signal = notice->signal,
                           .deadline_unix_s = (notice->deadline_ns + 999'999'999) / 1'000'000'000};
    }
    reply->tasks.push_back(std::move(task));
  }
}

}  // namespace

Result<int> ControlPlane::RegisterNodes(const Cluster& cluster) {
  GPUFLEET_RETURN_IF_ERROR(cluster.Validate(options_.catalog));
  for (const Node& node : cluster.nodes) {
    GPUFLEET_RETURN_IF_ERROR(wire::ValidateNodeName("node.name", node.id.value()));
    if (const Status status = scheduler::ValidateNode(node, cluster.topology, options_.catalog);
        !status.ok()) {
      return InvalidArgumentError(fmt::format("node {}: {}", node.id.value(), status.message()));
    }
  }
  const std::vector<std::string>& levels = cluster.topology.levels();
  // Agents register at once when a fleet comes up: a racing registration may create the topology
  // or the same node between this read and the commit (kAlreadyExists), so a second attempt reads
  // again and finds it.
  Status committed = Status::Ok();
  int added = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    store::WriteBatch batch;
    Result<store::StoredObject> topology = options_.store.Get(kClusterKind, kTopologyName);
    if (topology.ok()) {
      const Json recorded = wire::ParseDocument(topology->data);
      std::vector<std::string> recorded_levels;
      for (const Json& level : wire::ArrayOr(recorded, "levels")) {
        recorded_levels.push_back(level.is_string() ? level.get<std::string>() : "");
      }
      if (recorded_levels != levels) {
        return InvalidArgumentError(
            fmt::format("topology levels [{}] differ from the recorded [{}]",
                        fmt::join(levels, ", "), fmt::join(recorded_levels, ", ")));
      }
    } else if (topology.status().code() == StatusCode::kNotFound) {
      batch.Create(std::string(kClusterKind), std::string(kTopologyName),
                   Json{{"levels", levels}}.dump());
    } else {
      return topology.status();
    }
    // One read per node registered, not a list of the fleet: an agent registering alone costs
    // the same with 10 nodes stored as with 10,000.
    added = 0;
    for (const Node& node : cluster.nodes) {
      const Result<store::StoredObject> existing = options_.store.Get(kNodesKind, node.id.value());
      if (existing.ok()) {
        continue;
      }
      if (existing.status().code() != StatusCode::kNotFound) {
        return existing.status();
      }
      Json doc = wire::NodeToJson(node, levels);
      // The usage report counts the node's capacity from here (FleetCapacity).
      doc["registered_ns"] = UsageNowNanos();
      batch.Create(std::string(kNodesKind), node.id.value(), doc.dump());
      batch.AppendEvent(std::string(kNodesKind), node.id.value(), "registered");
      ++added;
    }
    committed = options_.store.Commit(batch);
    if (committed.code() != StatusCode::kAlreadyExists) {
      break;
    }
  }
  GPUFLEET_RETURN_IF_ERROR(committed);
  return added;
}

Result<wire::AgentReply> ControlPlane::RegisterAgent(const Principal& who, std::string_view body) {
  if (!who.is_admin() && who.role != Role::kAgent) {
    return Status(StatusCode::kPermissionDenied,
                  "registering a node needs an agent or admin token");
  }
  // Before anything else: an agent of a protocol this server does not serve is told so, naming
  // both versions, instead of an error about a field it sent differently.
  Result<wire::RegisterRequest> parsed = wire::ParseRegisterRequest(body);
  if (!parsed.ok()) {
    GPUFLEET_RETURN_IF_ERROR(
        wire::CheckProtocolOfRefusedRequest(body, wire::kAgentProtocolVersion));
    return parsed.status();
  }
  wire::RegisterRequest request = std::move(parsed).value();
  GPUFLEET_RETURN_IF_ERROR(wire::CheckAgentProtocol(request.protocol, request.agent_version,
                                                    wire::kAgentProtocolVersion));
  GPUFLEET_RETURN_IF_ERROR(wire::ValidateNodeName("node.name", request.node.id.value()));
  if (const Status status = scheduler::ValidateNode(request.node, Topology(request.topology_levels),
                                                    options_.catalog);
      !status.ok()) {
    return InvalidArgumentError(fmt::format("node.{}", status.message()));
  }
  for (const Gpu& gpu : request.node.gpus) {
    if (gpu.uuid.empty()) {
      return InvalidArgumentError(
          fmt::format("node.gpus[{}].uuid: empty (agents name GPUs by UUID)", gpu.index));
    }
  }
  {
    // Checked before anything is written: a registration refused for it leaves no credential
    // behind that the agent never received.
    std::lock_guard<std::mutex> lock(agents_mu_);
    if (!active_index_built_) {
      return UnavailableError("the server is starting; retry the registration");
    }
  }
  GPUFLEET_RETURN_IF_ERROR(CheckNodeCredential(who, request.node.id.value()));
  GPUFLEET_RETURN_IF_ERROR(ClaimGpuUuids(request.node));
  // A join token exchanges itself for a credential of this node alone, as kubeadm's bootstrap
  // tokens do; the agent uses that one from now on.
  NodeCredentials::Issued issued;
  const std::string& node_token = issued.token;
  if (who.role == Role::kAgent && who.node.empty()) {
    if (options_.node_credentials == nullptr) {
      return FailedPreconditionError("this control plane issues no node credentials");
    }
    GPUFLEET_ASSIGN_OR_RETURN(issued, options_.node_credentials->Issue(request.node.id.value()));
  }
  // A registration that fails takes back the credential it made, so that the agent may join
  // again with its join token (a node with a credential refuses join tokens).
  const auto fail = [&](Status status) {
    if (!node_token.empty()) {
      if (const Status revoked = options_.node_credentials->Revoke(node_token); !revoked.ok()) {
        fmt::print(stderr, "gpufleet server: node {}: taking back the unused credential: {}\n",
                   request.node.id.value(), revoked.ToString());
      }
    }
    return status;
  };
  Cluster cluster;
  cluster.topology = Topology(request.topology_levels);
  cluster.nodes.push_back(request.node);
  // Validates names, models and topology and records the levels on first use.
  if (const Result<int> added = RegisterNodes(cluster); !added.ok()) {
    return fail(added.status());
  }
  const std::string name = request.node.id.value();
  std::string replaced_credential;
  const Status registered = store::CommitWithRetries(
      options_.store, kCasAttempts, fmt::format("node \"{}\" kept changing; register again", name),
      [&]() -> store::AttemptResult {
        GPUFLEET_ASSIGN_OR_RETURN(const store::StoredObject stored,
                                  options_.store.Get(kNodesKind, name));
        const Json old_doc = wire::ParseDocument(stored.data);
        Json doc = MergeInventory(&old_doc, request.node, request.topology_levels);
        replaced_credential = wire::StrOr(old_doc, "credential");
        if (!node_token.empty()) {
          doc["credential"] = issued.id;
          // Until the agent uses it, the answer carrying it may have been lost: the join token
          // may then register the node again (CheckNodeCredential).
          doc[std::string(kCredentialUnclaimed)] = true;
        } else if (who.role == Role::kAgent) {
          doc["credential"] = who.token_id;
        } else if (old_doc.contains("credential")) {
          doc["credential"] = old_doc["credential"];
          if (old_doc.contains(kCredentialUnclaimed)) {
            doc[std::string(kCredentialUnclaimed)] = old_doc[std::string(kCredentialUnclaimed)];
          }
        }
        std::vector<std::string> events = ApplyGpuReports(doc, request.gpus);
        store::WriteBatch batch;
        // Runs whose GPUs or host resources the new inventory no longer has end here, in the same
        // commit, never silently kept on GPUs that are gone or freed.
        GPUFLEET_RETURN_IF_ERROR(EndRunsBrokenByReregistration(name, old_doc, doc, batch));
        batch.Update(std::string(kNodesKind), name, doc.dump(), stored.version);
        batch.AppendEvent(
            std::string(kNodesKind), name,
            fmt::format("agent registered ({} GPUs, driver {})", request.node.gpus.size(),
                        request.node.labels.count(std::string(kDriverVersionLabel)) > 0
                            ? request.node.labels.at(std::string(kDriverVersionLabel))
                            : "unknown"));
        for (const std::string& event : events) {
          batch.AppendEvent(std::string(kNodesKind), name, event);
        }
        return store::Write(std::move(batch));
      });
  if (!registered.ok()) {
    return fail(registered);
  }
  if (!node_token.empty() && !replaced_credential.empty()) {
    // The unclaimed credential an earlier registration made is replaced by this one.
    if (const Status revoked = options_.node_credentials->RevokeById(replaced_credential);
        !revoked.ok() && revoked.code() != StatusCode::kNotFound) {
      fmt::print(stderr, "gpufleet server: node {}: revoking the replaced credential: {}\n", name,
                 revoked.ToString());
    }
  }
  wire::HeartbeatRequest heartbeat;
  heartbeat.gpus = std::move(request.gpus);
  heartbeat.tasks = std::move(request.tasks);
  heartbeat.sequence = request.sequence;
  heartbeat.protocol = request.protocol;
  GPUFLEET_ASSIGN_OR_RETURN(wire::AgentReply reply,
                            ProcessHeartbeat(name, heartbeat, /*gpus_applied=*/true));
  NoteAgentProtocol(name, request.protocol);
  reply.node_token = std::move(issued.token);
  return reply;
}

Status ControlPlane::CheckNodeCredential(const Principal& who, const std::string& node) {
  if (who.role != Role::kAgent) {
    return Status::Ok();  // an admin acts for any node
  }
  if (!who.node.empty()) {
    if (who.node != node) {
      return Status(StatusCode::kPermissionDenied,
                    fmt::format("this credential acts for node {} only, not {}", who.node, node));
    }
    return Status::Ok();
  }
  Result<store::StoredObject> stored = options_.store.Get(kNodesKind, node);
  bool has_credential = false;
  if (stored.ok()) {
    const Json doc = wire::ParseDocument(stored->data);
    if (wire::BoolOr(doc, kCredentialUnclaimed, false)) {
      return Status::Ok();  // the registration that made it may never have been answered
    }
    has_credential = !wire::StrOr(doc, "credential").empty();
  } else if (stored.status().code() != StatusCode::kNotFound) {
    return stored.status();
  }
  if (!has_credential && options_.node_credentials != nullptr) {
    // An admin may have made the node's credential before the node first registered.
    GPUFLEET_ASSIGN_OR_RETURN(has_credential, options_.node_credentials->Exists(node));
  }
  if (has_credential) {
    return Status(
        StatusCode::kPermissionDenied,
        fmt::format(
            "node {} has its own credential; a join token cannot act for it (gpufleet create token "
            "--role agent --node {} makes a new one)",
            node, node));
  }
  return Status::Ok();
}

Status ControlPlane::ClaimNodeCredential(const Principal& who) {
  {
    std::lock_guard<std::mutex> lock(agents_mu_);
    if (claimed_credentials_.count(who.token_id) > 0) {
      return Status::Ok();
    }
  }
  GPUFLEET_RETURN_IF_ERROR(store::CommitWithRetries(
      options_.store, kCasAttempts,
      fmt::format("node \"{}\" kept changing; heartbeat again", who.node),
      [&]() -> store::AttemptResult {
        GPUFLEET_ASSIGN_OR_RETURN(const store::StoredObject stored,
                                  options_.store.Get(kNodesKind, who.node));
        Json doc = wire::ParseDocument(stored.data);
        if (!wire::BoolOr(doc, kCredentialUnclaimed, false) ||
            wire::StrOr(doc, "credential") != who.token_id) {
          return store::Write(store::WriteBatch());
        }
        doc.erase(std::string(kCredentialUnclaimed));
        store::WriteBatch batch;
        batch.Update(std::string(kNodesKind), who.node, doc.dump(), stored.version);
        batch.AppendEvent(std::string(kNodesKind), who.node,
                          fmt::format("agent claimed its credential {}", who.token_id));
        return store::Write(std::move(batch));
      }));
  std::lock_guard<std::mutex> lock(agents_mu_);
  claimed_credentials_.insert(who.token_id);
  return Status::Ok();
}

Status ControlPlane::ClaimGpuUuids(const Node& node) {
  std::lock_guard<std::mutex> lock(agents_mu_);
  if (!gpu_owners_loaded_) {
    gpu_owners_.clear();
    gpus_of_node_.clear();
    GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> nodes,
                              options_.store.List(kNodesKind));
    for (const store::StoredObject& object : nodes) {
      for (const Json& gpu : wire::ArrayOr(wire::ParseDocument(object.data), "gpus")) {
        if (const std::string uuid = wire::StrOr(gpu, "uuid"); !uuid.empty()) {
          gpu_owners_[uuid] = object.name;
          gpus_of_node_[object.name].push_back(uuid);
        }
      }
    }
    gpu_owners_loaded_ = true;
  }
  const std::string& name = node.id.value();
  for (const Gpu& gpu : node.gpus) {
    const auto owner = gpu_owners_.find(gpu.uuid.value());
    if (owner != gpu_owners_.end() && owner->second != name) {
      return AlreadyExistsError(
          fmt::format("node.gpus[{}].uuid: {} is a GPU of node {}; a GPU belongs to one node "
                      "(delete that node first if it moved)",
                      gpu.index, gpu.uuid.value(), owner->second));
    }
  }
  ForgetGpuOwnersLocked(name);
  std::vector<std::string>& uuids = gpus_of_node_[name];
  for (const Gpu& gpu : node.gpus) {
    gpu_owners_[gpu.uuid.value()] = name;
    uuids.push_back(gpu.uuid.value());
  }
  return Status::Ok();
}

void ControlPlane::ForgetGpuOwnersLocked(const std::string& node) {
  const auto uuids = gpus_of_node_.find(node);
  if (uuids == gpus_of_node_.end()) {
    return;
  }
  for (const std::string& uuid : uuids->second) {
    if (const auto owner = gpu_owners_.find(uuid);
        owner != gpu_owners_.end() && owner->second == node) {
      gpu_owners_.erase(owner);
    }
  }
  gpus_of_node_.erase(uuids);
}

void ControlPlane::ForgetNode(const std::string& node) {
  {
    std::lock_guard<std::mutex> lock(agents_mu_);
    ForgetGpuOwnersLocked(node);
    agent_protocols_.erase(node);
  }
  leases_.Forget(node);
}

Status ControlPlane::EndRunsBrokenByReregistration(const std::string& node, const Json& before,
                                                   const Json& after, store::WriteBatch& batch) {
  // The jobs that may hold resources on `node`: the heartbeat index's (a superset: jobs are
  // indexed before their placement commits) once the first cycle has built it, so that a
  // registration storm costs each node its own jobs rather than a scan of the whole job history;
  // before that, every stored job.
  const std::optional<std::set<std::string>> indexed = ActiveJobsOn(node);
  std::vector<store::StoredObject> jobs;
  if (indexed) {
    for (const std::string& name : *indexed) {
      Result<store::StoredObject> object = options_.store.Get(kJobsKind, name);
      if (object.ok()) {
        jobs.push_back(*std::move(object));
      } else if (object.status().code() != StatusCode::kNotFound) {
        return object.status();
      }
    }
  } else {
    GPUFLEET_ASSIGN_OR_RETURN(jobs, options_.store.ListWhere(kJobsKind, UnfinishedJobs()));
  }
  for (const store::StoredObject& object : jobs) {
    const std::optional<std::string> state = TopLevelString(object.data, "state");
    if (!state || !ParseJobState(*state) || !HoldsResources(*ParseJobState(*state)) ||
        object.data.find(node) == std::string::npos) {
      continue;
    }
    const Json job = wire::ParseDocument(object.data);
    // A Stopping run is renamed too, so that it keeps holding the GPUs its tasks are on.
    Json renamed = job;
    const std::optional<std::string> why = RenameForReregistration(renamed, node, before, after);
    if (why && RunIsWanted(*ParseJobState(*state))) {
      const std::string event = EndRunOnFailure(renamed, *why, NowText());
      AddJobWrite(job, renamed, object.version, event, batch);
    } else if (renamed != job) {
      AddJobWrite(job, renamed, object.version,
                  fmt::format("{} registered again; its tasks there keep their GPUs by UUID", node),
                  batch);
    }
  }
  return Status::Ok();
}

Result<wire::AgentReply> ControlPlane::AgentHeartbeat(const Principal& who, std::string_view node,
                                                      std::string_view body) {
  if (!who.is_admin() && who.role != Role::kAgent) {
    return Status(StatusCode::kPermissionDenied, "heartbeats need an agent or admin token");
  }
  Result<wire::HeartbeatRequest> parsed = wire::ParseHeartbeatRequest(body);
  if (!parsed.ok()) {
    GPUFLEET_RETURN_IF_ERROR(
        wire::CheckProtocolOfRefusedRequest(body, wire::kAgentProtocolVersion));
    return parsed.status();
  }
  const wire::HeartbeatRequest request = std::move(parsed).value();
  GPUFLEET_RETURN_IF_ERROR(wire::CheckAgentProtocol(request.protocol, request.agent_version,
                                                    wire::kAgentProtocolVersion));
  GPUFLEET_RETURN_IF_ERROR(CheckNodeCredential(who, std::string(node)));
  if (who.role == Role::kAgent && !who.node.empty()) {
    GPUFLEET_RETURN_IF_ERROR(ClaimNodeCredential(who));
  }
  Result<wire::AgentReply> reply =
      ProcessHeartbeat(std::string(node), request, /*gpus_applied=*/false);
  if (reply.ok()) {
    NoteAgentProtocol(std::string(node), request.protocol);
  }
  return reply;
}

void ControlPlane::NoteAgentProtocol(const std::string& node, wire::ProtocolVersion protocol) {
  std::lock_guard<std::mutex> lock(agents_mu_);
  agent_protocols_[node] = wire::ProtocolVersionName(protocol);
}

std::map<std::string, int64_t> ControlPlane::AgentsByProtocol() {
  std::lock_guard<std::mutex> lock(agents_mu_);
  std::map<std::string, int64_t> counts;
  for (const auto& [node, protocol] : agent_protocols_) {
    ++counts[protocol];
  }
  return counts;
}

Result<wire::AgentReply> ControlPlane::ProcessHeartbeat(const std::string& node,
                                                        const wire::HeartbeatRequest& request,
                                                        bool gpus_applied) {
  // Until the first cycle has indexed the running jobs, an empty answer would tell agents to
  // stop everything; they retry instead.
  const std::optional<std::set<std::string>> indexed_first = ActiveJobsOn(node);
  if (!indexed_first) {
    return UnavailableError("the server is starting; retry the heartbeat");
  }
  // A report older than one already applied (delivered late) renews nothing, and the absence of
  // a task from it says nothing.
  // Before the node document is read: a NotReady mark that has not yet seen this heartbeat
  // holds the leases until its write is in, and this heartbeat then undoes it.
  const bool stale = !leases_.Renew(node, request.sequence, /*registering=*/gpus_applied);
  // The node: back to its state before NotReady, and the GPUs' health and MIG devices.
  Json node_doc;
  const Status node_written = store::CommitWithRetries(
      options_.store, kCasAttempts,
      fmt::format("node \"{}\" kept changing; send the heartbeat again", node),
      [&]() -> store::AttemptResult {
        Result<store::StoredObject> stored = options_.store.Get(kNodesKind, node);
        if (!stored.ok()) {
          if (stored.status().code() == StatusCode::kNotFound) {
            return NotFoundError(fmt::format("node \"{}\" is not registered", node));
          }
          return stored.status();
        }
        Json doc = wire::ParseDocument(stored->data);
        if (!wire::BoolOr(doc, "agent", false)) {
          return FailedPreconditionError(
              fmt::format("node \"{}\" was not registered by an agent; register first", node));
        }
        std::vector<std::string> events;
        if (!gpus_applied) {
          events = ApplyGpuReports(doc, request.gpus);
        }
        if (!request.fenced.empty()) {
          events.push_back(fmt::format("agent fenced itself: {}", request.fenced));
        }
        for (std::string& event : ApplyDiagnosticReports(doc, request.diagnostics)) {
          events.push_back(std::move(event));
        }
        for (std::string& event : ApplyImageReport(doc, request)) {
          events.push_back(std::move(event));
        }
        // A registration carries no link report: the problems stand until a heartbeat's.
        if (!gpus_applied) {
          for (std::string& event : ApplyLinkProblems(doc, request)) {
            events.push_back(std::move(event));
          }
        }
        if (wire::StrOr(doc, "state") == NodeStateName(NodeState::kNotReady)) {
          doc["state"] =
              wire::StrOr(doc, "state_before_not_ready", NodeStateName(NodeState::kReady));
          doc.erase("state_before_not_ready");
          events.push_back(fmt::format("heartbeat again: {}", wire::StrOr(doc, "state")));
        }
        node_doc = doc;
        if (events.empty()) {
          return store::NoWrite();
        }
        store::WriteBatch batch;
        batch.Update(std::string(kNodesKind), node, doc.dump(), stored->version);
        for (const std::string& event : events) {
          batch.AppendEvent(std::string(kNodesKind), node, event);
        }
        return store::Write(std::move(batch));
      });
  if (!node_written.ok()) {
    return node_written;
  }
  // Busy time: this report's utilization held since the node's previous report (not for a
  // report delivered late).
  const int64_t busy_interval_ms = stale ? 0 : UsageHeartbeatInterval(node);
  std::map<int64_t, int> reported_utilization;
  for (const wire::GpuReport& gpu : request.gpus) {
    if (gpu.utilization_pct) {
      reported_utilization[gpu.index] = *gpu.utilization_pct;
    }
  }
  RecordGpuUtilization(node, reported_utilization);
  // Read again after the node's write: the jobs placed on it meanwhile are desired too.
  std::set<std::string> active_jobs = ActiveJobsOn(node).value_or(*indexed_first);
  // Task reports, per job. A job only the reports name (not placed on this node) is not kept
  // parsed.
  std::map<std::string, const wire::TaskReport*> reports;
  std::set<std::string> reported_only;
  for (const wire::TaskReport& report : request.tasks) {
    reports[report.id] = &report;
    if (const std::optional<TaskId> id = ParseTaskId(report.id)) {
      if (active_jobs.insert(id->job).second) {
        reported_only.insert(id->job);
      }
    }
  }
  std::set<int64_t> drain_now;
  for (const wire::GpuReport& gpu : request.gpus) {
    if (gpu.drain == wire::DrainAction::kNow) {
      drain_now.insert(gpu.index);
    }
  }
  wire::AgentReply reply;
  reply.heartbeat_interval_ms = options_.heartbeat_interval.count();
  reply.lease_ms = options_.node_timeout.count();
  reply.stop_grace_ms = options_.stop_grace.count();
  std::map<int, std::vector<MigInstance>> created_mig_instances;
  std::map<std::string, Json> other_node_docs;  // read once per heartbeat, for MIG gangs
  for (const std::string& job_name : active_jobs) {
    // The job with this heartbeat's reports applied; null for an unknown job, whose tasks are
    // not desired (the agent stops them).
    Json doc;
    std::shared_ptr<const Result<Job>> spec;  // null until parsed
    std::vector<double> pull_seconds;         // the pulls this heartbeat recorded, for /metrics
    const auto parse_job = [&](const std::string& text) {
      return reported_only.count(job_name) == 0 ? parsed_jobs_.ParseJob(job_name, text)
                                                : ParsedJob{wire::ParseDocument(text), nullptr};
    };
    const Status job_written = store::CommitWithRetries(
        options_.store, kCasAttempts,
        fmt::format("job \"{}\" kept changing; send the heartbeat again", job_name),
        [&]() -> store::AttemptResult {
          doc = Json();
          spec.reset();
          pull_seconds.clear();
          Result<store::StoredObject> stored = options_.store.Get(kJobsKind, job_name);
          if (!stored.ok()) {
            if (stored.status().code() != StatusCode::kNotFound &&
                stored.status().code() != StatusCode::kInvalidArgument) {
              return stored.status();
            }
            return store::NoWrite();
          }
          ParsedJob parsed = parse_job(stored->data);
          doc = std::move(parsed.doc);
          spec = std::move(parsed.spec);
          bool progressed = false;
          std::vector<std::string> events =
              ApplyReports(doc, node, wire::ArrayOr(node_doc, "gpus"), reports, drain_now,
                           ReportTime{NowText(), UsageNowNanos()},
                           /*absent_means_gone=*/!stale, progressed);
          if (events.empty() && !progressed) {
            return store::NoWrite();
          }
          const Json before = parse_job(stored->data).doc;
          if (events.empty()) {
            events.emplace_back();  // a pull's progress: written without an event
          }
          pull_seconds = NewImagePulls(before, doc);
          store::WriteBatch batch;
          AddJobWrite(before, doc, stored->version, events.front(), batch);
          for (size_t i = 1; i < events.size(); ++i) {
            batch.AppendEvent(std::string(kJobsKind), job_name, events[i]);
          }
          return store::Write(std::move(batch));
        });
    if (!job_written.ok()) {
      return job_written;
    }
    for (const double seconds : pull_seconds) {
      if (options_.observe_image_pull) {
        options_.observe_image_pull(seconds);
      }
    }
    if (doc.is_null()) {
      continue;
    }
    CreditBusy(doc, node, reported_utilization, busy_interval_ms);
    const Result<wire::JobRecord> record = wire::JobRecordFromJson(doc, nullptr);
    if (!record.ok()) {
      // Never expected (the server writes these documents). The heartbeat fails rather than
      // answer without the job: no task of it is stopped and no MIG instance of it removed.
      return InternalError(fmt::format("jobs/{}: {}", job_name, record.status().message()));
    }
    // A gang starts together: until the agents have made every MIG instance it was placed on
    // (on any of its nodes), none of a Scheduled job's tasks is sent, so no part of it runs
    // and is then killed when an instance does not come.
    const bool gang_ready =
        record->state != JobState::kScheduled ||
        MigInstancesReported(*record, [&](const std::string& other) -> const Json* {
          if (other == node) {
            return &node_doc;
          }
          auto [it, inserted] = other_node_docs.try_emplace(other);
          if (inserted) {
            const Result<store::StoredObject> object = options_.store.Get(kNodesKind, other);
            it->second = object.ok() ? wire::ParseDocument(object->data) : Json();
          }
          return it->second.is_object() ? &it->second : nullptr;
        });
    if (gang_ready && RunIsWanted(record->state)) {
      if (spec == nullptr) {
        spec = std::make_shared<const Result<Job>>(wire::StoredJobSpec(doc, options_.catalog));
      }
      if (spec->ok()) {
        AddDesiredTasks(*record, **spec, node_doc, node, request.protocol, UsageNowNanos(), &reply);
      } else {
        // A spec this server's catalog no longer takes: what to run is unknown.
        fmt::print(stderr, "gpufleet server: jobs/{}: stored spec is invalid: {}\n", job_name,
                   spec->status().message());
      }
    }
    AddCreatedMigInstances(*record, node, node_doc, created_mig_instances);
  }
  reply.mig_layouts = MigLayoutsToApply(node_doc, created_mig_instances);
  reply.diagnostics = WantedDiagnostics(node_doc);
  return reply;
}

}  // namespace gpufleet::control

namespace gpufleet::control {
namespace {

// The top-level fields in which two provenance records differ, "recorded_at" aside.
std::vector<std::string> DifferingFields(const Json& stored, const Json& reported) {
  std::set<std::string> keys;
  for (const Json* doc : {&stored, &reported}) {
    for (const auto& [key, value] : doc->items()) {
      keys.insert(key);
    }
  }
  std::vector<std::string> out;
  for (const std::string& key : keys) {
    if (key == "recorded_at") {
      continue;
    }
    const auto a = stored.find(key);
    const auto b = reported.find(key);
    if ((a == stored.end()) != (b == reported.end()) ||
        (a != stored.end() && b != reported.end() && *a != *b)) {
      out.push_back(key);
    }
  }
  return out;
}

}  // namespace

Result<Json> ControlPlane::RecordProvenance(const Principal& who, std::string_view node,
                                            std::string_view body) {
  if (!who.is_admin() && who.role != Role::kAgent) {
    return Status(StatusCode::kPermissionDenied, "provenance records need an agent or admin token");
  }
  GPUFLEET_ASSIGN_OR_RETURN(const wire::ProvenanceReport report, wire::ParseProvenanceReport(body));
  GPUFLEET_RETURN_IF_ERROR(CheckNodeCredential(who, std::string(node)));
  const std::optional<TaskId> id = ParseTaskId(report.task_id);
  if (!id) {
    return InvalidArgumentError(
        fmt::format("task_id: \"{}\" is not JOB/TASK/ATTEMPT", report.task_id));
  }
  Result<store::StoredObject> stored_job = options_.store.Get(kJobsKind, id->job);
  if (!stored_job.ok()) {
    return stored_job.status().code() == StatusCode::kNotFound
               ? NotFoundError(fmt::format("task_id: job \"{}\" not found", id->job))
               : stored_job.status();
  }
  const Result<wire::JobRecord> job =
      wire::JobRecordFromJson(wire::ParseDocument(stored_job->data), &options_.catalog);
  if (!job.ok()) {
    return InternalError(fmt::format("jobs/{}: {}", id->job, job.status().message()));
  }
  const Job& spec = *job->spec;
  const int64_t attempt = job->attempt;
  if (id->attempt != attempt) {
    return NotFoundError(
        fmt::format("task_id: job \"{}\" has no run of attempt {} to record (its attempt is {})",
                    id->job, id->attempt, attempt));
  }
  const wire::PlacementRecord* placement = nullptr;
  for (const wire::PlacementRecord& candidate : job->placements) {
    if (candidate.task == id->task) {
      placement = &candidate;
    }
  }
  if (placement == nullptr) {
    return NotFoundError(fmt::format("task_id: job \"{}\" has no task \"{}\" placed in attempt {}",
                                     id->job, id->task, attempt));
  }
  const std::string& placed_on = placement->node;
  if (placed_on != node) {
    return Status(StatusCode::kPermissionDenied,
                  fmt::format("task {} runs on node {}, not {}: an agent records only its own "
                              "node's runs",
                              report.task_id, placed_on, node));
  }
  const int group = placement->group;
  const std::string image = ImageToRun(
      spec, group >= 0 && group < static_cast<int>(spec.groups.size()) ? spec.groups[group].image
                                                                       : std::string());
  if (report.image != image) {
    return InvalidArgumentError(
        fmt::format("image: \"{}\" is not the task's image \"{}\"", report.image, image));
  }
  Json record = wire::ParseDocument(wire::ProvenanceReportToJson(report));
  record.erase("task_id");
  record["task_id"] = report.task_id;
  record["job"] = id->job;
  record["team"] = job->team;
  record["task"] = id->task;
  record["attempt"] = id->attempt;
  record["node"] = std::string(node);
  // The job's side, from its stored spec, not from the agent.
  record["provenance"] = spec.provenance;
  record["labels"] = spec.labels;
  if (const std::string now = NowText(); !now.empty()) {
    record["recorded_at"] = now;
  }
  store::WriteBatch batch;
  batch.Create(std::string(kProvenanceKind), report.task_id, record.dump());
  const Status created = options_.store.Commit(batch);
  if (created.ok()) {
    Json answer = record;
    answer["created"] = true;
    return answer;
  }
  if (created.code() != StatusCode::kAlreadyExists) {
    return created;
  }
  GPUFLEET_ASSIGN_OR_RETURN(const store::StoredObject existing,
                            options_.store.Get(kProvenanceKind, report.task_id));
  Json kept = wire::ParseDocument(existing.data);
  const std::vector<std::string> differ = DifferingFields(kept, record);
  if (!differ.empty()) {
    return Status(StatusCode::kAlreadyExists,
                  fmt::format("the provenance of task {} is recorded already and records are "
                              "immutable; this report differs in {}",
                              report.task_id, fmt::join(differ, ", ")));
  }
  kept["created"] = false;
  return kept;
}

Status ControlPlane::RecordTaskLog(const Principal& who, std::string_view node,
                                   std::string_view body) {
  if (!who.is_admin() && who.role != Role::kAgent) {
    return Status(StatusCode::kPermissionDenied, "task logs need an agent or admin token");
  }
  GPUFLEET_ASSIGN_OR_RETURN(wire::TaskLogReport report, wire::ParseTaskLogReport(body));
  GPUFLEET_RETURN_IF_ERROR(CheckNodeCredential(who, std::string(node)));
  // The run's provenance record says which node ran it, also once the job has ended and its
  // placements are gone.
  const Result<store::StoredObject> run = options_.store.Get(kProvenanceKind, report.task_id);
  if (!run.ok()) {
    return run.status().code() == StatusCode::kNotFound
               ? NotFoundError(fmt::format("task_id: no run of task {} is recorded (its agent "
                                           "records it when it starts it)",
                                           report.task_id))
               : run.status();
  }
  const std::string ran_on = wire::StrOr(wire::ParseDocument(run->data), "node");
  if (ran_on != node) {
    return Status(StatusCode::kPermissionDenied,
                  fmt::format("task {} ran on node {}, not {}: an agent ships only its own "
                              "node's logs",
                              report.task_id, ran_on, node));
  }
  task_logs_.Put(
      {.node = std::string(node), .report = std::move(report), .received_ns = UsageNowNanos()});
  return Status::Ok();
}

Result<std::vector<ControlPlane::TaskRunLog>> ControlPlane::TaskRunLogs(
    const std::string& job_key) {
  // Task ids are JOB/TASK/ATTEMPT; another job's key may extend this one's ("a" and "a/b"), so
  // each record's job is checked.
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> records,
                            options_.store.List(kProvenanceKind, job_key + "/"));
  std::vector<TaskRunLog> runs;
  for (const store::StoredObject& object : records) {
    const Json record = wire::ParseDocument(object.data);
    if (wire::StrOr(record, "job") != job_key) {
      continue;
    }
    runs.push_back({.task_id = object.name,
                    .task = wire::StrOr(record, "task"),
                    .attempt = wire::IntOr(record, "attempt", 0),
                    .node = wire::StrOr(record, "node"),
                    .log = task_logs_.Get(object.name)});
  }
  std::stable_sort(runs.begin(), runs.end(),
                   [](const TaskRunLog& a, const TaskRunLog& b) { return a.attempt < b.attempt; });
  return runs;
}

}  // namespace gpufleet::control
