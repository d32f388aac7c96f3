// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/agent_protocol.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_fields.h"
#include "gpufleet/wire/node_json.h"

namespace gpufleet::wire {
namespace {

using Json = nlohmann::json;

Status FieldError(const std::string& path, std::string_view message) {
  return InvalidArgumentError(fmt::format("{}: {}", path, message));
}

// Reads the fields of one JSON object; unknown fields are refused so a typo is not ignored.
class ObjectReader {
 public:
  static Result<ObjectReader> Open(const Json& j, std::string path,
                                   std::initializer_list<std::string_view> known) {
    if (!j.is_object()) {
      return FieldError(path.empty() ? "body" : path, "expected an object, got " + ShownValue(j));
    }
    for (const auto& [key, value] : j.items()) {
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        return FieldError(Join(path, key), "unknown field");
      }
    }
    return ObjectReader(j, std::move(path));
  }

  std::string Path(std::string_view key) const { return Join(path_, key); }
  const Json* Find(std::string_view key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  Status String(std::string_view key, std::string* out, bool required = false) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      return required ? FieldError(Path(key), "required field missing") : Status::Ok();
    }
    if (!v->is_string()) {
      return FieldError(Path(key), "expected a string, got " + ShownValue(*v));
    }
    *out = v->get<std::string>();
    return Status::Ok();
  }

  template <typename Int>
  Status Integer(std::string_view key, Int* out, int64_t min, int64_t max) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      return Status::Ok();
    }
    if (!v->is_number_integer()) {
      return FieldError(Path(key), "expected an integer, got " + ShownValue(*v));
    }
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(max)) {
      return FieldError(Path(key),
                        fmt::format("{} is out of range [{}, {}]", ShownValue(*v), min, max));
    }
    const int64_t value = v->get<int64_t>();
    if (value < min || value > max) {
      return FieldError(Path(key), fmt::format("{} is out of range [{}, {}]", value, min, max));
    }
    *out = static_cast<Int>(value);
    return Status::Ok();
  }

  Status OptionalPercent(std::string_view key, std::optional<int>* out) const {
    if (Find(key) == nullptr) {
      return Status::Ok();
    }
    int value = 0;
    GPUFLEET_RETURN_IF_ERROR(Integer(key, &value, 0, 100));
    *out = value;
    return Status::Ok();
  }

  Status Strings(std::string_view key, std::vector<std::string>* out) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      return Status::Ok();
    }
    if (!v->is_array()) {
      return FieldError(Path(key), "expected a list of strings, got " + ShownValue(*v));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) {
        return FieldError(fmt::format("{}[{}]", Path(key), i),
                          "expected a string, got " + ShownValue((*v)[i]));
      }
      out->push_back((*v)[i].get<std::string>());
    }
    return Status::Ok();
  }

  Status StringMap(std::string_view key, std::map<std::string, std::string>* out) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      return Status::Ok();
    }
    if (!v->is_object()) {
      return FieldError(Path(key), "expected an object of strings, got " + ShownValue(*v));
    }
    for (const auto& [k, value] : v->items()) {
      if (!value.is_string()) {
        return FieldError(Join(Path(key), k), "expected a string, got " + ShownValue(value));
      }
      (*out)[k] = value.get<std::string>();
    }
    return Status::Ok();
  }

  // Calls read(element, path) for each element of the list `key`.
  template <typename Fn>
  Status List(std::string_view key, Fn read) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      return Status::Ok();
    }
    if (!v->is_array()) {
      return FieldError(Path(key), "expected a list, got " + ShownValue(*v));
    }
    for (size_t i = 0; i < v->size(); ++i) {
      GPUFLEET_RETURN_IF_ERROR(read((*v)[i], fmt::format("{}[{}]", Path(key), i)));
    }
    return Status::Ok();
  }

 private:
  ObjectReader(const Json& j, std::string path) : j_(j), path_(std::move(path)) {}
  static std::string Join(std::string_view path, std::string_view key) {
    return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
  }

  const Json& j_;
  std::string path_;
};

Result<Json> ParseBody(std::string_view text) {
  Result<Json> parsed = ParseJson(text);
  if (!parsed.ok()) {
    return FieldError("body", parsed.status().message());
  }
  return parsed;
}

template <typename Enum, size_t N>
Status ReadEnum(const ObjectReader& r, std::string_view key, const Enum (&values)[N],
                const char* (*name)(Enum), Enum* out) {
  std::string text;
  GPUFLEET_RETURN_IF_ERROR(r.String(key, &text));
  if (text.empty()) {
    return Status::Ok();
  }
  std::vector<std::string_view> valid;
  for (const Enum value : values) {
    if (text == name(value)) {
      *out = value;
      return Status::Ok();
    }
    valid.push_back(name(value));
  }
  return FieldError(r.Path(key),
                    fmt::format("unknown \"{}\" (valid: {})", text, fmt::join(valid, ", ")));
}

// "protocol" and "agent_version" of a registration or heartbeat; no "protocol" is the protocol
// of the agents that did not send one.
Status ReadProtocol(const ObjectReader& r, ProtocolVersion* protocol, std::string* agent_version) {
  std::string text;
  GPUFLEET_RETURN_IF_ERROR(r.String("protocol", &text));
  if (r.Find("protocol") == nullptr) {
    *protocol = kUnversionedAgentProtocol;
  } else {
    Result<ProtocolVersion> parsed = ParseProtocolVersion(text);
    if (!parsed.ok()) {
      return FieldError(r.Path("protocol"), parsed.status().message());
    }
    *protocol = *parsed;
  }
  return r.String("agent_version", agent_version);
}

void WriteProtocol(ProtocolVersion protocol, const std::string& agent_version, Json& j) {
  j["protocol"] = ProtocolVersionName(protocol);
  if (!agent_version.empty()) {
    j["agent_version"] = agent_version;
  }
}

constexpr GpuHealth kReportableHealth[] = {GpuHealth::kHealthy, GpuHealth::kDegraded,
                                           GpuHealth::kUnhealthy};
constexpr DrainAction kDrainActions[] = {DrainAction::kNone, DrainAction::kAfterJob,
                                         DrainAction::kNow};
constexpr DiagnosticPhase kDiagnosticPhases[] = {
    DiagnosticPhase::kRunning, DiagnosticPhase::kWaiting, DiagnosticPhase::kPassed,
    DiagnosticPhase::kFailed, DiagnosticPhase::kUnavailable};
constexpr TaskPhase kTaskPhases[] = {TaskPhase::kRunning, TaskPhase::kSucceeded, TaskPhase::kFailed,
                                     TaskPhase::kWaiting, TaskPhase::kPulling};
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int kMaxGpuIndex = 1023;
constexpr int kMaxMigStart = kMigMemorySlices - 1;

Status RequireField(const ObjectReader& r, std::string_view key) {
  return r.Find(key) == nullptr ? FieldError(r.Path(key), "required field missing") : Status::Ok();
}

// A MIG instance's "profile" (non-empty) and "start" (a memory slice), both required.
Status ReadMigPlacement(const ObjectReader& r, std::string* profile, int* start) {
  GPUFLEET_RETURN_IF_ERROR(r.String("profile", profile, /*required=*/true));
  if (profile->empty()) {
    return FieldError(r.Path("profile"), "must not be empty");
  }
  GPUFLEET_RETURN_IF_ERROR(RequireField(r, "start"));
  return r.Integer("start", start, 0, kMaxMigStart);
}

// A list of {"profile", "start"} objects under `key`.
Status ReadMigInstances(const ObjectReader& r, std::string_view key,
                        std::vector<MigInstance>* out) {
  return r.List(key, [&](const Json& j, const std::string& path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(const ObjectReader m,
                              ObjectReader::Open(j, path, {"profile", "start"}));
    MigInstance instance;
    GPUFLEET_RETURN_IF_ERROR(ReadMigPlacement(m, &instance.profile, &instance.start));
    out->push_back(std::move(instance));
    return Status::Ok();
  });
}

Json MigInstancesToJson(const std::vector<MigInstance>& instances) {
  Json out = Json::array();
  for (const MigInstance& instance : instances) {
    out.push_back({{"profile", instance.profile}, {"start", instance.start}});
  }
  return out;
}

Status ReadMigDevices(const ObjectReader& r, std::optional<std::vector<MigDeviceReport>>* out) {
  if (r.Find("mig_devices") == nullptr) {
    return Status::Ok();
  }
  std::vector<MigDeviceReport> devices;
  std::set<std::string> seen;
  const auto read_device = [&](const Json& j, const std::string& path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(const ObjectReader m,
                              ObjectReader::Open(j, path, {"uuid", "profile", "start"}));
    MigDeviceReport device;
    GPUFLEET_RETURN_IF_ERROR(m.String("uuid", &device.uuid, /*required=*/true));
    if (device.uuid.empty() || !seen.insert(device.uuid).second) {
      return FieldError(m.Path("uuid"), device.uuid.empty()
                                            ? "must not be empty"
                                            : fmt::format("duplicate \"{}\"", device.uuid));
    }
    GPUFLEET_RETURN_IF_ERROR(ReadMigPlacement(m, &device.profile, &device.start));
    devices.push_back(std::move(device));
    return Status::Ok();
  };
  GPUFLEET_RETURN_IF_ERROR(r.List("mig_devices", read_device));
  *out = std::move(devices);
  return Status::Ok();
}

Status ReadGpuReports(const ObjectReader& r, std::vector<GpuReport>* out) {
  std::set<int> seen;
  return r.List("gpus", [&](const Json& j, const std::string& path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(
        const ObjectReader g,
        ObjectReader::Open(j, path,
                           {"index", "health", "reasons", "drain", "thermal_headroom_c",
                            "utilization_pct", "mig_devices", "mig_error"}));
    GpuReport report;
    GPUFLEET_RETURN_IF_ERROR(g.Integer("index", &report.index, 0, 1023));
    if (!seen.insert(report.index).second) {
      return FieldError(g.Path("index"), fmt::format("duplicate GPU index {}", report.index));
    }
    GPUFLEET_RETURN_IF_ERROR(
        ReadEnum(g, "health", kReportableHealth, &GpuHealthName, &report.health));
    GPUFLEET_RETURN_IF_ERROR(g.Strings("reasons", &report.reasons));
    GPUFLEET_RETURN_IF_ERROR(ReadEnum(g, "drain", kDrainActions, &DrainActionName, &report.drain));
    GPUFLEET_RETURN_IF_ERROR(
        g.Integer("thermal_headroom_c", &report.thermal_headroom_c, -1000, 1000));
    GPUFLEET_RETURN_IF_ERROR(g.OptionalPercent("utilization_pct", &report.utilization_pct));
    GPUFLEET_RETURN_IF_ERROR(ReadMigDevices(g, &report.mig_devices));
    GPUFLEET_RETURN_IF_ERROR(g.String("mig_error", &report.mig_error));
    out->push_back(std::move(report));
    return Status::Ok();
  });
}

Status ReadTaskReports(const ObjectReader& r, std::vector<TaskReport>* out) {
  std::set<std::string> seen;
  return r.List("tasks", [&](const Json& j, const std::string& path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(
        const ObjectReader t,
        ObjectReader::Open(j, path,
                           {"id", "phase", "exit_code", "message", "gpu_utilization_pct",
                            "image_pull_ms", "image_digest", "last_checkpoint_unix_s"}));
    TaskReport report;
    GPUFLEET_RETURN_IF_ERROR(t.String("id", &report.id, /*required=*/true));
    if (!seen.insert(report.id).second) {
      return FieldError(t.Path("id"), fmt::format("duplicate task \"{}\"", report.id));
    }
    GPUFLEET_RETURN_IF_ERROR(ReadEnum(t, "phase", kTaskPhases, &TaskPhaseName, &report.phase));
    GPUFLEET_RETURN_IF_ERROR(t.Integer("exit_code", &report.exit_code, -kIntMax - 1, kIntMax));
    GPUFLEET_RETURN_IF_ERROR(t.String("message", &report.message));
    GPUFLEET_RETURN_IF_ERROR(t.OptionalPercent("gpu_utilization_pct", &report.gpu_utilization_pct));
    if (t.Find("image_pull_ms") != nullptr) {
      int64_t pull_ms = 0;
      GPUFLEET_RETURN_IF_ERROR(t.Integer("image_pull_ms", &pull_ms, 0, int64_t{1} << 40));
      report.image_pull_ms = pull_ms;
    }
    if (t.Find("last_checkpoint_unix_s") != nullptr) {
      int64_t checkpoint = 0;
      GPUFLEET_RETURN_IF_ERROR(
          t.Integer("last_checkpoint_unix_s", &checkpoint, 0, kMaxCheckpointUnixSeconds));
      report.last_checkpoint_unix_s = checkpoint;
    }
    GPUFLEET_RETURN_IF_ERROR(t.String("image_digest", &report.image_digest));
    if (!report.image_digest.empty()) {
      if (const Status digest = ValidateImageDigest(report.image_digest); !digest.ok()) {
        return FieldError(t.Path("image_digest"), digest.message());
      }
    }
    out->push_back(std::move(report));
    return Status::Ok();
  });
}

// A hostile agent cannot grow the node document: results past the bound are dropped and long
// texts cut, not refused (a refused heartbeat would leave the node NotReady).
Status ReadDiagnosticResults(const ObjectReader& r, std::vector<DiagnosticResult>* out) {
  std::set<std::string> seen;
  const auto cut = [](std::string& text, size_t limit) {
    if (text.size() > limit) {
      text = text.substr(0, limit - 3) + "...";
    }
  };
  return r.List("diagnostics", [&](const Json& j, const std::string& path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(
        const ObjectReader d,
        ObjectReader::Open(j, path, {"id", "phase", "summary", "exit_code", "output", "took_ms"}));
    DiagnosticResult result;
    GPUFLEET_RETURN_IF_ERROR(d.String("id", &result.id, /*required=*/true));
    if (!seen.insert(result.id).second) {
      return FieldError(d.Path("id"), fmt::format("duplicate diagnostic \"{}\"", result.id));
    }
    GPUFLEET_RETURN_IF_ERROR(
        ReadEnum(d, "phase", kDiagnosticPhases, &DiagnosticPhaseName, &result.phase));
    GPUFLEET_RETURN_IF_ERROR(d.String("summary", &result.summary));
    GPUFLEET_RETURN_IF_ERROR(d.String("output", &result.output));
    cut(result.summary, kMaxDiagnosticSummaryBytes);
    cut(result.output, kMaxDiagnosticOutputBytes);
    if (d.Find("exit_code") != nullptr) {
      int exit_code = 0;
      GPUFLEET_RETURN_IF_ERROR(d.Integer("exit_code", &exit_code, -kIntMax - 1, kIntMax));
      result.exit_code = exit_code;
    }
    GPUFLEET_RETURN_IF_ERROR(d.Integer("took_ms", &result.took_ms, 0, int64_t{1} << 40));
    if (out->size() < kMaxDiagnosticResults) {
      out->push_back(std::move(result));
    }
    return Status::Ok();
  });
}

Json DiagnosticResultsToJson(const std::vector<DiagnosticResult>& results) {
  Json out = Json::array();
  for (const DiagnosticResult& d : results) {
    Json j = {{"id", d.id}, {"phase", DiagnosticPhaseName(d.phase)}, {"took_ms", d.took_ms}};
    if (!d.summary.empty()) {
      j["summary"] = d.summary;
    }
    if (d.exit_code.has_value()) {
      j["exit_code"] = *d.exit_code;
    }
    if (!d.output.empty()) {
      j["output"] = d.output;
    }
    out.push_back(std::move(j));
  }
  return out;
}

Json GpuReportsToJson(const std::vector<GpuReport>& gpus) {
  Json out = Json::array();
  for (const GpuReport& g : gpus) {
    Json j = {{"index", g.index},
              {"health", GpuHealthName(g.health)},
              {"reasons", g.reasons},
              {"drain", DrainActionName(g.drain)},
              {"thermal_headroom_c", g.thermal_headroom_c}};
    if (g.utilization_pct) {
      j["utilization_pct"] = *g.utilization_pct;
    }
    if (g.mig_devices) {
      Json devices = Json::array();
      for (const MigDeviceReport& device : *g.mig_devices) {
        devices.push_back(
            {{"uuid", device.uuid}, {"profile", device.profile}, {"start", device.start}});
      }
      j["mig_devices"] = std::move(devices);
    }
    if (!g.mig_error.empty()) {
      j["mig_error"] = g.mig_error;
    }
    out.push_back(std::move(j));
  }
  return out;
}

Json TaskReportsToJson(const std::vector<TaskReport>& tasks) {
  Json out = Json::array();
  for (const TaskReport& t : tasks) {
    Json j = {{"id", t.id}, {"phase", TaskPhaseName(t.phase)}, {"exit_code", t.exit_code}};
    if (!t.message.empty()) {
      j["message"] = t.message;
    }
    if (t.gpu_utilization_pct) {
      j["gpu_utilization_pct"] = *t.gpu_utilization_pct;
    }
    if (t.image_pull_ms) {
      j["image_pull_ms"] = *t.image_pull_ms;
    }
    if (!t.image_digest.empty()) {
      j["image_digest"] = t.image_digest;
    }
    if (t.last_checkpoint_unix_s) {
      j["last_checkpoint_unix_s"] = *t.last_checkpoint_unix_s;
    }
    out.push_back(std::move(j));
  }
  return out;
}

// The heartbeat's "images": the structure is checked strictly (a list of objects with
// "references", "digest" and "size_bytes"), the values leniently: what is past the bounds or not
// a valid reference or digest is dropped and counted in `dropped`.
Status ReadImageReports(const ObjectReader& r, HeartbeatRequest* request) {
  if (r.Find("images") == nullptr) {
    return Status::Ok();
  }
  std::vector<CachedImage> images;
  size_t reference_bytes = 0;
  size_t past_bound = 0;
  std::vector<std::string> dropped;
  const auto drop = [&](std::string why) {
    // The first few reasons, cut short, are enough to act on; the count says how many there were.
    if (dropped.size() < 3) {
      dropped.push_back(why.size() > 200 ? why.substr(0, 197) + "..." : std::move(why));
    }
  };
  size_t dropped_count = 0;
  const auto read_image = [&](const Json& j, const std::string& path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(const ObjectReader ir,
                              ObjectReader::Open(j, path, {"references", "digest", "size_bytes"}));
    CachedImage image;
    std::vector<std::string> references;
    GPUFLEET_RETURN_IF_ERROR(ir.Strings("references", &references));
    GPUFLEET_RETURN_IF_ERROR(ir.String("digest", &image.digest));
    GPUFLEET_RETURN_IF_ERROR(ir.Integer("size_bytes", &image.size_bytes, 0, int64_t{1} << 50));
    if (images.size() == kMaxReportedImages) {
      ++past_bound;
      return Status::Ok();
    }
    for (size_t i = 0; i < references.size(); ++i) {
      const std::string& reference = references[i];
      if (const Status valid = ValidateImageReference(reference); !valid.ok()) {
        ++dropped_count;
        drop(fmt::format("{}.references[{}]: {}", path, i, valid.message()));
      } else if (image.references.size() == kMaxReferencesPerImage ||
                 reference_bytes + reference.size() > kMaxImageReferenceBytes) {
        ++dropped_count;
        drop(
            fmt::format("{}.references[{}]: past the bound of {} references an image and {} "
                        "bytes in all",
                        path, i, kMaxReferencesPerImage, kMaxImageReferenceBytes));
      } else {
        reference_bytes += reference.size();
        image.references.push_back(reference);
      }
    }
    if (const Status digest = ValidateImageDigest(image.digest); !digest.ok()) {
      ++dropped_count;
      drop(fmt::format("{}.digest: {}", path, digest.message()));
      return Status::Ok();
    }
    images.push_back(std::move(image));
    return Status::Ok();
  };
  GPUFLEET_RETURN_IF_ERROR(r.List("images", read_image));
  if (past_bound > 0) {
    dropped_count += past_bound;
    drop(fmt::format("{} images past the bound of {}", past_bound, kMaxReportedImages));
  }
  if (dropped_count > 0) {
    request->images_dropped =
        fmt::format("{} dropped: {}", dropped_count, fmt::join(dropped, "; "));
  }
  request->images = std::move(images);
  return Status::Ok();
}

Result<Node> ReadNode(const Json& j, const std::string& path,
                      const std::vector<std::string>& levels) {
  GPUFLEET_ASSIGN_OR_RETURN(const ObjectReader r,
                            ObjectReader::Open(j, path,
                                               {"name", "cpu_milli", "memory_mib", "labels",
                                                "fault_domains", "topology", "gpus"}));
  Node node;
  std::string name;
  GPUFLEET_RETURN_IF_ERROR(r.String("name", &name, /*required=*/true));
  node.id = NodeId(name);
  GPUFLEET_RETURN_IF_ERROR(r.Integer("cpu_milli", &node.capacity.cpu_milli, 0, int64_t{1} << 40));
  GPUFLEET_RETURN_IF_ERROR(r.Integer("memory_mib", &node.capacity.memory_mib, 0, int64_t{1} << 40));
  GPUFLEET_RETURN_IF_ERROR(r.StringMap("labels", &node.labels));
  GPUFLEET_RETURN_IF_ERROR(r.StringMap("fault_domains", &node.fault_domains));
  std::map<std::string, std::string> topology;
  GPUFLEET_RETURN_IF_ERROR(r.StringMap("topology", &topology));
  for (const std::string& level : levels) {
    const auto it = topology.find(level);
    if (it == topology.end()) {
      return FieldError(r.Path("topology"), fmt::format("no value for level \"{}\"", level));
    }
    node.topology.push_back(it->second);
  }
  if (topology.size() != levels.size()) {
    return FieldError(r.Path("topology"), "has levels that topology_levels does not list");
  }
  const auto read_gpu = [&](const Json& g, const std::string& gpu_path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(
        const ObjectReader gr,
        ObjectReader::Open(g, gpu_path,
                           {"index", "uuid", "model", "memory_mib", "nvlink_domain", "mig_enabled",
                            "mig_instances"}));
    Gpu gpu;
    std::string uuid;
    GPUFLEET_RETURN_IF_ERROR(gr.Integer("index", &gpu.index, 0, 1023));
    GPUFLEET_RETURN_IF_ERROR(gr.String("uuid", &uuid, /*required=*/true));
    gpu.uuid = GpuUuid(uuid);
    GPUFLEET_RETURN_IF_ERROR(gr.String("model", &gpu.model, /*required=*/true));
    GPUFLEET_RETURN_IF_ERROR(gr.Integer("memory_mib", &gpu.memory_mib, 0, int64_t{1} << 30));
    GPUFLEET_RETURN_IF_ERROR(gr.Integer("nvlink_domain", &gpu.nvlink_domain, 0, 1023));
    if (const Json* mig = gr.Find("mig_enabled")) {
      if (!mig->is_boolean()) {
        return FieldError(gr.Path("mig_enabled"),
                          "expected true or false, got " + ShownValue(*mig));
      }
      gpu.mig_enabled = mig->get<bool>();
    }
    GPUFLEET_RETURN_IF_ERROR(ReadMigInstances(gr, "mig_instances", &gpu.mig_instances));
    if (!gpu.mig_enabled && !gpu.mig_instances.empty()) {
      return FieldError(gr.Path("mig_instances"), "set on a GPU with MIG disabled");
    }
    node.gpus.push_back(std::move(gpu));
    return Status::Ok();
  };
  GPUFLEET_RETURN_IF_ERROR(r.List("gpus", read_gpu));
  return node;
}

// The node as the store writes it (NodeToJson), less what the server decides (state, health).
Json NodeInventoryToJson(const Node& node, const std::vector<std::string>& levels) {
  Json j = NodeToJson(node, levels);
  j.erase("state");
  j.erase("images");  // heartbeats carry them
  for (Json& gpu : j["gpus"]) {
    gpu.erase("health");
    gpu.erase("thermal_headroom_c");
  }
  return j;
}

}  // namespace

std::string MakeTaskId(std::string_view job, std::string_view task, int64_t attempt) {
  return fmt::format("{}/{}/{}", job, task, attempt);
}

std::string RunIdOfTask(std::string_view task_id) {
  const size_t attempt = task_id.rfind('/');
  if (attempt == std::string_view::npos || attempt == 0) {
    return std::string(task_id);
  }
  const size_t task = task_id.rfind('/', attempt - 1);
  if (task == std::string_view::npos) {
    return std::string(task_id);
  }
  return fmt::format("{}{}", task_id.substr(0, task), task_id.substr(attempt));
}

Status CheckTaskIdLength(std::string_view key, const Job& job) {
  // Task names are "GROUP-REPLICA" (the server's placements).
  size_t longest_task = 0;
  for (const TaskGroup& group : job.groups) {
    longest_task = std::max(
        longest_task, fmt::formatted_size("{}-{}", group.name, std::max(group.replicas, 1) - 1));
  }
  const size_t longest = key.size() + 1 + longest_task + 1 + kAttemptDigits;
  if (longest > kMaxTaskIdLength) {
    return InvalidArgumentError(fmt::format(
        "metadata.name: task ids of job \"{}\" (TEAM/NAME/TASK/ATTEMPT) could reach {} "
        "characters, more than the agent's limit of {}; use a shorter job or task group name",
        key, longest, kMaxTaskIdLength));
  }
  return Status::Ok();
}

const char* DrainActionName(DrainAction action) {
  switch (action) {
    case DrainAction::kNone:
      return "none";
    case DrainAction::kAfterJob:
      return "after-job";
    case DrainAction::kNow:
      return "now";
  }
  return "unknown";
}

const char* DiagnosticPhaseName(DiagnosticPhase phase) {
  switch (phase) {
    case DiagnosticPhase::kRunning:
      return "Running";
    case DiagnosticPhase::kWaiting:
      return "Waiting";
    case DiagnosticPhase::kPassed:
      return "Passed";
    case DiagnosticPhase::kFailed:
      return "Failed";
    case DiagnosticPhase::kUnavailable:
      return "Unavailable";
  }
  return "unknown";
}

const char* TaskPhaseName(TaskPhase phase) {
  switch (phase) {
    case TaskPhase::kRunning:
      return "Running";
    case TaskPhase::kSucceeded:
      return "Succeeded";
    case TaskPhase::kFailed:
      return "Failed";
    case TaskPhase::kWaiting:
      return "Waiting";
    case TaskPhase::kPulling:
      return "Pulling";
  }
  return "unknown";
}

std::string ProtocolVersionName(ProtocolVersion version) {
  return fmt::format("{}.{}", version.major, version.minor);
}

Result<ProtocolVersion> ParseProtocolVersion(std::string_view text) {
  // Each part a number of at most four digits: "1.1", never "1", "1.1.0", "+1.1" or "1.-1".
  const auto part = [](std::string_view digits) -> std::optional<int> {
    int value = 0;
    if (digits.empty() || digits.size() > 4 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return std::nullopt;
    }
    std::from_chars(digits.data(), digits.data() + digits.size(), value);
    return value;
  };
  const size_t dot = text.find('.');
  const std::optional<int> major =
      dot == std::string_view::npos ? std::nullopt : part(text.substr(0, dot));
  const std::optional<int> minor =
      dot == std::string_view::npos ? std::nullopt : part(text.substr(dot + 1));
  if (!major || !minor) {
    return InvalidArgumentError(fmt::format("{} is not a protocol version MAJOR.MINOR",
                                            ShownValue(Json(std::string(text)))));
  }
  return ProtocolVersion{*major, *minor};
}

namespace {
constexpr std::string_view kRefusalPrefix = "agent protocol ";
}  // namespace

Status CheckAgentProtocol(ProtocolVersion agent, std::string_view agent_version,
                          ProtocolVersion server) {
  const bool served = agent.major == server.major &&
                      (agent.minor == server.minor || agent.minor + 1 == server.minor);
  if (served) {
    return Status::Ok();
  }
  const std::string build = agent_version.empty() ? "" : fmt::format(" (agent {})", agent_version);
  if (agent > server) {
    return FailedPreconditionError(fmt::format(
        "{}{}{} is newer than this server's {}: upgrade the servers before the agents",
        kRefusalPrefix, ProtocolVersionName(agent), build, ProtocolVersionName(server)));
  }
  const ProtocolVersion oldest{server.major, std::max(server.minor - 1, 0)};
  return FailedPreconditionError(
      fmt::format("{}{}{} is too old for this server's {} (it serves {} to {}): upgrade the agent",
                  kRefusalPrefix, ProtocolVersionName(agent), build, ProtocolVersionName(server),
                  ProtocolVersionName(oldest), ProtocolVersionName(server)));
}

Status CheckProtocolOfRefusedRequest(std::string_view body, ProtocolVersion server) {
  const Result<Json> j = ParseJson(body);
  if (!j.ok() || !j->is_object()) {
    return Status::Ok();
  }
  const auto protocol = j->find("protocol");
  if (protocol == j->end() || !protocol->is_string()) {
    return Status::Ok();
  }
  const Result<ProtocolVersion> version = ParseProtocolVersion(protocol->get<std::string>());
  if (!version.ok()) {
    return Status::Ok();
  }
  const auto agent_version = j->find("agent_version");
  return CheckAgentProtocol(*version,
                            agent_version != j->end() && agent_version->is_string()
                                ? agent_version->get<std::string>()
                                : "",
                            server);
}

bool IsAgentProtocolRefusal(const Status& status) {
  return status.code() == StatusCode::kFailedPrecondition &&
         status.message().find(kRefusalPrefix) != std::string::npos;
}

std::string RegisterRequestToJson(const RegisterRequest& request) {
  Json j = {{"node", NodeInventoryToJson(request.node, request.topology_levels)},
            {"topology_levels", request.topology_levels},
            {"gpus", GpuReportsToJson(request.gpus)},
            {"tasks", TaskReportsToJson(request.tasks)},
            {"sequence", request.sequence}};
  WriteProtocol(request.protocol, request.agent_version, j);
  return j.dump();
}

std::string HeartbeatRequestToJson(const HeartbeatRequest& request) {
  Json j = {{"gpus", GpuReportsToJson(request.gpus)},
            {"tasks", TaskReportsToJson(request.tasks)},
            {"sequence", request.sequence}};
  WriteProtocol(request.protocol, request.agent_version, j);
  if (!request.fenced.empty()) {
    j["fenced"] = request.fenced;
  }
  if (request.images) {
    j["images"] = CachedImagesToJson(*request.images);
  }
  if (!request.link_problems.empty()) {
    j["link_problems"] = request.link_problems;
  }
  if (!request.diagnostics.empty()) {
    // Output is a tool's bytes: replaced where it is not UTF-8 rather than failing the dump.
    j["diagnostics"] = DiagnosticResultsToJson(request.diagnostics);
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  return j.dump();
}

std::string DescribeMigInstances(const std::vector<MigInstance>& instances) {
  if (instances.empty()) {
    return "none";
  }
  std::vector<std::string> parts;
  for (const MigInstance& instance : instances) {
    parts.push_back(fmt::format("{} at {}", instance.profile, instance.start));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string AgentReplyToJson(const AgentReply& reply) {
  Json tasks = Json::array();
  for (const DesiredTask& t : reply.tasks) {
    Json task = {{"id", t.id},
                 {"job", t.job},
                 {"task", t.task},
                 {"team", t.team},
                 {"queue", t.queue},
                 {"command", t.command},
                 {"env", t.env},
                 {"gpu_uuids", t.gpu_uuids},
                 {"gpu_milli", t.gpu_milli},
                 {"cpu_milli", t.cpu_milli},
                 {"memory_mib", t.memory_mib}};
    // Only for MPS shares, so that an agent from before MPS reads every other task.
    if (t.mps) {
      task["mps"] = true;
      task["gpu_memory_mib"] = t.gpu_memory_mib;
    }
    if (!t.mig_instances.empty()) {
      Json instances = Json::array();
      for (const TaskMigInstance& m : t.mig_instances) {
        instances.push_back({{"gpu_index", m.gpu_index},
                             {"profile", m.profile},
                             {"start", m.start},
                             {"uuid", m.uuid}});
      }
      task["mig_instances"] = std::move(instances);
    }
    if (!t.image.empty()) {
      task["image"] = t.image;
      task["image_pull_policy"] = ImagePullPolicyName(t.image_pull_policy);
      task["host_network"] = t.host_network;
    }
    if (t.notice) {
      task["notice"] = {{"signal", t.notice->signal},
                        {"deadline_unix_s", t.notice->deadline_unix_s}};
    }
    tasks.push_back(std::move(task));
  }
  Json j = {{"heartbeat_interval_ms", reply.heartbeat_interval_ms},
            {"lease_ms", reply.lease_ms},
            {"stop_grace_ms", reply.stop_grace_ms},
            {"tasks", std::move(tasks)}};
  if (!reply.node_token.empty()) {
    j["node_token"] = reply.node_token;
  }
  if (!reply.mig_layouts.empty()) {
    Json layouts = Json::array();
    for (const WantedMigLayout& layout : reply.mig_layouts) {
      layouts.push_back(
          {{"gpu_index", layout.gpu_index}, {"instances", MigInstancesToJson(layout.instances)}});
    }
    j["mig_layouts"] = std::move(layouts);
  }
  if (!reply.diagnostics.empty()) {
    Json diagnostics = Json::array();
    for (const DesiredDiagnostic& d : reply.diagnostics) {
      diagnostics.push_back(
          {{"id", d.id}, {"gpu_index", d.gpu_index}, {"gpu_uuid", d.gpu_uuid}, {"kind", d.kind}});
    }
    j["diagnostics"] = std::move(diagnostics);
  }
  return j.dump();
}

Result<RegisterRequest> ParseRegisterRequest(std::string_view text) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ParseBody(text));
  GPUFLEET_ASSIGN_OR_RETURN(const ObjectReader r,
                            ObjectReader::Open(j, "",
                                               {"node", "topology_levels", "gpus", "tasks",
                                                "sequence", "protocol", "agent_version"}));
  RegisterRequest request;
  GPUFLEET_RETURN_IF_ERROR(ReadProtocol(r, &request.protocol, &request.agent_version));
  GPUFLEET_RETURN_IF_ERROR(r.Strings("topology_levels", &request.topology_levels));
  const Json* node = r.Find("node");
  if (node == nullptr) {
    return FieldError("node", "required field missing");
  }
  GPUFLEET_ASSIGN_OR_RETURN(request.node, ReadNode(*node, "node", request.topology_levels));
  GPUFLEET_RETURN_IF_ERROR(ReadGpuReports(r, &request.gpus));
  GPUFLEET_RETURN_IF_ERROR(ReadTaskReports(r, &request.tasks));
  GPUFLEET_RETURN_IF_ERROR(
      r.Integer("sequence", &request.sequence, 0, std::numeric_limits<int64_t>::max()));
  return request;
}

Result<HeartbeatRequest> ParseHeartbeatRequest(std::string_view text) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ParseBody(text));
  GPUFLEET_ASSIGN_OR_RETURN(
      const ObjectReader r,
      ObjectReader::Open(j, "",
                         {"gpus", "tasks", "fenced", "sequence", "images", "link_problems",
                          "protocol", "agent_version", "diagnostics"}));
  HeartbeatRequest request;
  GPUFLEET_RETURN_IF_ERROR(ReadProtocol(r, &request.protocol, &request.agent_version));
  GPUFLEET_RETURN_IF_ERROR(ReadGpuReports(r, &request.gpus));
  GPUFLEET_RETURN_IF_ERROR(ReadTaskReports(r, &request.tasks));
  GPUFLEET_RETURN_IF_ERROR(r.String("fenced", &request.fenced));
  GPUFLEET_RETURN_IF_ERROR(ReadImageReports(r, &request));
  GPUFLEET_RETURN_IF_ERROR(ReadDiagnosticResults(r, &request.diagnostics));
  GPUFLEET_RETURN_IF_ERROR(r.Strings("link_problems", &request.link_problems));
  if (request.link_problems.size() > kMaxLinkProblems) {
    request.link_problems.resize(kMaxLinkProblems);
  }
  for (std::string& problem : request.link_problems) {
    if (problem.size() > kMaxLinkProblemBytes) {
      problem = problem.substr(0, kMaxLinkProblemBytes - 3) + "...";
    }
  }
  GPUFLEET_RETURN_IF_ERROR(
      r.Integer("sequence", &request.sequence, 0, std::numeric_limits<int64_t>::max()));
  return request;
}

Result<AgentReply> ParseAgentReply(std::string_view text) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ParseBody(text));
  GPUFLEET_ASSIGN_OR_RETURN(
      const ObjectReader r,
      ObjectReader::Open(j, "",
                         {"heartbeat_interval_ms", "lease_ms", "stop_grace_ms", "tasks",
                          "mig_layouts", "node_token", "diagnostics"}));
  AgentReply reply;
  GPUFLEET_RETURN_IF_ERROR(
      r.Integer("heartbeat_interval_ms", &reply.heartbeat_interval_ms, 1, 3600 * 1000));
  GPUFLEET_RETURN_IF_ERROR(r.Integer("lease_ms", &reply.lease_ms, 1, 3600 * 1000));
  GPUFLEET_RETURN_IF_ERROR(r.Integer("stop_grace_ms", &reply.stop_grace_ms, 0, 3600 * 1000));
  GPUFLEET_RETURN_IF_ERROR(r.String("node_token", &reply.node_token));
  const auto read_task = [&](const Json& t, const std::string& path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(
        const ObjectReader tr,
        ObjectReader::Open(
            t, path,
            {"id", "job", "task", "team", "queue", "command", "env", "gpu_uuids", "gpu_milli",
             "cpu_milli", "memory_mib", "mig_instances", "image", "image_pull_policy",
             "host_network", "mps", "gpu_memory_mib", "notice"}));
    DesiredTask task;
    GPUFLEET_RETURN_IF_ERROR(tr.String("id", &task.id, /*required=*/true));
    GPUFLEET_RETURN_IF_ERROR(tr.String("job", &task.job));
    GPUFLEET_RETURN_IF_ERROR(tr.String("task", &task.task));
    GPUFLEET_RETURN_IF_ERROR(tr.String("team", &task.team));
    GPUFLEET_RETURN_IF_ERROR(tr.String("queue", &task.queue));
    GPUFLEET_RETURN_IF_ERROR(tr.Strings("command", &task.command));
    GPUFLEET_RETURN_IF_ERROR(tr.StringMap("env", &task.env));
    GPUFLEET_RETURN_IF_ERROR(tr.Strings("gpu_uuids", &task.gpu_uuids));
    GPUFLEET_RETURN_IF_ERROR(tr.Integer("gpu_milli", &task.gpu_milli, 0, int64_t{1} << 40));
    GPUFLEET_RETURN_IF_ERROR(tr.Integer("cpu_milli", &task.cpu_milli, 0, int64_t{1} << 40));
    GPUFLEET_RETURN_IF_ERROR(tr.Integer("memory_mib", &task.memory_mib, 0, int64_t{1} << 40));
    GPUFLEET_RETURN_IF_ERROR(
        tr.Integer("gpu_memory_mib", &task.gpu_memory_mib, 0, int64_t{1} << 40));
    GPUFLEET_RETURN_IF_ERROR(tr.String("image", &task.image));
    if (!task.image.empty()) {
      if (const Status image = ValidateImageReference(task.image); !image.ok()) {
        return FieldError(tr.Path("image"), image.message());
      }
    }
    std::string pull_policy = ImagePullPolicyName(ImagePullPolicy::kIfNotPresent);
    GPUFLEET_RETURN_IF_ERROR(tr.String("image_pull_policy", &pull_policy));
    const std::optional<ImagePullPolicy> policy = ImagePullPolicyFromName(pull_policy);
    if (!policy.has_value()) {
      return FieldError(
          tr.Path("image_pull_policy"),
          fmt::format("\"{}\" is not one of IfNotPresent, Always, Never", pull_policy));
    }
    task.image_pull_policy = *policy;
    for (const auto& [key, flag] :
         {std::pair{"host_network", &task.host_network}, std::pair{"mps", &task.mps}}) {
      if (const Json* value = tr.Find(key)) {
        if (!value->is_boolean()) {
          return FieldError(tr.Path(key), "expected true or false, got " + ShownValue(*value));
        }
        *flag = value->get<bool>();
      }
    }
    const auto read_instance = [&](const Json& m, const std::string& m_path) -> Status {
      GPUFLEET_ASSIGN_OR_RETURN(
          const ObjectReader mr,
          ObjectReader::Open(m, m_path, {"gpu_index", "profile", "start", "uuid"}));
      TaskMigInstance instance;
      GPUFLEET_RETURN_IF_ERROR(RequireField(mr, "gpu_index"));
      GPUFLEET_RETURN_IF_ERROR(mr.Integer("gpu_index", &instance.gpu_index, 0, kMaxGpuIndex));
      GPUFLEET_RETURN_IF_ERROR(ReadMigPlacement(mr, &instance.profile, &instance.start));
      GPUFLEET_RETURN_IF_ERROR(mr.String("uuid", &instance.uuid, /*required=*/true));
      if (instance.uuid.empty()) {
        return FieldError(mr.Path("uuid"), "must not be empty");
      }
      task.mig_instances.push_back(std::move(instance));
      return Status::Ok();
    };
    GPUFLEET_RETURN_IF_ERROR(tr.List("mig_instances", read_instance));
    if (const Json* notice = tr.Find("notice")) {
      GPUFLEET_ASSIGN_OR_RETURN(
          const ObjectReader nr,
          ObjectReader::Open(*notice, tr.Path("notice"), {"signal", "deadline_unix_s"}));
      TaskNotice parsed;
      GPUFLEET_RETURN_IF_ERROR(nr.String("signal", &parsed.signal, /*required=*/true));
      if (!NoticeSignalNumber(parsed.signal)) {
        return FieldError(nr.Path("signal"),
                          fmt::format("\"{}\" is not a notice signal (one of {})", parsed.signal,
                                      NoticeSignalNames()));
      }
      GPUFLEET_RETURN_IF_ERROR(RequireField(nr, "deadline_unix_s"));
      GPUFLEET_RETURN_IF_ERROR(
          nr.Integer("deadline_unix_s", &parsed.deadline_unix_s, 0, kMaxCheckpointUnixSeconds));
      task.notice = std::move(parsed);
    }
    reply.tasks.push_back(std::move(task));
    return Status::Ok();
  };
  GPUFLEET_RETURN_IF_ERROR(r.List("tasks", read_task));
  std::set<int> layout_gpus;
  const auto read_layout = [&](const Json& l, const std::string& path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(const ObjectReader lr,
                              ObjectReader::Open(l, path, {"gpu_index", "instances"}));
    WantedMigLayout layout;
    GPUFLEET_RETURN_IF_ERROR(RequireField(lr, "gpu_index"));
    GPUFLEET_RETURN_IF_ERROR(lr.Integer("gpu_index", &layout.gpu_index, 0, kMaxGpuIndex));
    if (!layout_gpus.insert(layout.gpu_index).second) {
      return FieldError(lr.Path("gpu_index"),
                        fmt::format("duplicate GPU index {}", layout.gpu_index));
    }
    GPUFLEET_RETURN_IF_ERROR(RequireField(lr, "instances"));
    GPUFLEET_RETURN_IF_ERROR(ReadMigInstances(lr, "instances", &layout.instances));
    reply.mig_layouts.push_back(std::move(layout));
    return Status::Ok();
  };
  GPUFLEET_RETURN_IF_ERROR(r.List("mig_layouts", read_layout));
  std::set<std::string> diagnostic_ids;
  const auto read_diagnostic = [&](const Json& d, const std::string& path) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(const ObjectReader dr,
                              ObjectReader::Open(d, path, {"id", "gpu_index", "gpu_uuid", "kind"}));
    DesiredDiagnostic diagnostic;
    GPUFLEET_RETURN_IF_ERROR(dr.String("id", &diagnostic.id, /*required=*/true));
    if (diagnostic.id.empty() || !diagnostic_ids.insert(diagnostic.id).second) {
      return FieldError(dr.Path("id"),
                        fmt::format("\"{}\" is empty or a duplicate", diagnostic.id));
    }
    GPUFLEET_RETURN_IF_ERROR(RequireField(dr, "gpu_index"));
    GPUFLEET_RETURN_IF_ERROR(dr.Integer("gpu_index", &diagnostic.gpu_index, 0, kMaxGpuIndex));
    GPUFLEET_RETURN_IF_ERROR(dr.String("gpu_uuid", &diagnostic.gpu_uuid));
    GPUFLEET_RETURN_IF_ERROR(dr.String("kind", &diagnostic.kind));
    if (diagnostic.kind != "builtin" && diagnostic.kind != "command") {
      return FieldError(dr.Path("kind"),
                        fmt::format("unknown \"{}\" (valid: builtin, command)", diagnostic.kind));
    }
    reply.diagnostics.push_back(std::move(diagnostic));
    return Status::Ok();
  };
  GPUFLEET_RETURN_IF_ERROR(r.List("diagnostics", read_diagnostic));
  return reply;
}

std::string ProvenanceReportToJson(const ProvenanceReport& report) {
  Json gpus = Json::array();
  for (const ProvenanceGpu& gpu : report.gpus) {
    gpus.push_back(
        {{"uuid", gpu.uuid}, {"serial", gpu.serial}, {"vbios_version", gpu.vbios_version}});
  }
  const Json j = {{"task_id", report.task_id},
                  {"image", report.image},
                  {"image_digest", report.image_digest},
                  {"driver_version", report.driver_version},
                  {"cuda_version", report.cuda_version},
                  {"nvml_version", report.nvml_version},
                  {"gpus", std::move(gpus)},
                  {"command", report.command},
                  {"env_names", report.env_names}};
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

bool IsEnvVarName(std::string_view name) {
  if (name.empty() || (std::isdigit(static_cast<unsigned char>(name[0])) != 0)) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return c == '_' || std::isalnum(static_cast<unsigned char>(c)) != 0;
  });
}

// A string field of at most kMaxProvenanceFieldBytes.
Status BoundedString(const ObjectReader& r, std::string_view key, std::string* out) {
  GPUFLEET_RETURN_IF_ERROR(r.String(key, out));
  if (out->size() > kMaxProvenanceFieldBytes) {
    return FieldError(r.Path(key),
                      fmt::format("{} bytes, more than {}", out->size(), kMaxProvenanceFieldBytes));
  }
  return Status::Ok();
}

}  // namespace

Result<ProvenanceReport> ParseProvenanceReport(std::string_view text) {
  if (text.size() > kMaxProvenanceReportBytes) {
    return InvalidArgumentError(
        fmt::format("body: {} bytes, more than the {} bytes a provenance report may hold",
                    text.size(), kMaxProvenanceReportBytes));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ParseBody(text));
  GPUFLEET_ASSIGN_OR_RETURN(
      const ObjectReader r,
      ObjectReader::Open(j, "",
                         {"task_id", "image", "image_digest", "driver_version", "cuda_version",
                          "nvml_version", "gpus", "command", "env_names"}));
  ProvenanceReport report;
  GPUFLEET_RETURN_IF_ERROR(r.String("task_id", &report.task_id, /*required=*/true));
  if (report.task_id.empty() || report.task_id.size() > kMaxTaskIdLength) {
    return FieldError(r.Path("task_id"),
                      fmt::format("must hold 1 to {} characters", kMaxTaskIdLength));
  }
  GPUFLEET_RETURN_IF_ERROR(r.String("image", &report.image));
  if (!report.image.empty()) {
    if (const Status image = ValidateImageReference(report.image); !image.ok()) {
      return FieldError(r.Path("image"), image.message());
    }
  }
  GPUFLEET_RETURN_IF_ERROR(r.String("image_digest", &report.image_digest));
  if (!report.image_digest.empty()) {
    if (const Status digest = ValidateImageDigest(report.image_digest); !digest.ok()) {
      return FieldError(r.Path("image_digest"), digest.message());
    }
  }
  GPUFLEET_RETURN_IF_ERROR(BoundedString(r, "driver_version", &report.driver_version));
  GPUFLEET_RETURN_IF_ERROR(BoundedString(r, "cuda_version", &report.cuda_version));
  GPUFLEET_RETURN_IF_ERROR(BoundedString(r, "nvml_version", &report.nvml_version));
  std::set<std::string> uuids;
  const auto read_gpu = [&](const Json& g, const std::string& path) -> Status {
    if (report.gpus.size() >= kMaxProvenanceGpus) {
      return FieldError(path, fmt::format("more than {} GPUs", kMaxProvenanceGpus));
    }
    GPUFLEET_ASSIGN_OR_RETURN(const ObjectReader gr,
                              ObjectReader::Open(g, path, {"uuid", "serial", "vbios_version"}));
    ProvenanceGpu gpu;
    GPUFLEET_RETURN_IF_ERROR(gr.String("uuid", &gpu.uuid, /*required=*/true));
    if (gpu.uuid.empty() || gpu.uuid.size() > kMaxProvenanceFieldBytes) {
      return FieldError(gr.Path("uuid"),
                        fmt::format("must hold 1 to {} bytes", kMaxProvenanceFieldBytes));
    }
    if (!uuids.insert(gpu.uuid).second) {
      return FieldError(gr.Path("uuid"), fmt::format("duplicate GPU \"{}\"", gpu.uuid));
    }
    GPUFLEET_RETURN_IF_ERROR(BoundedString(gr, "serial", &gpu.serial));
    GPUFLEET_RETURN_IF_ERROR(BoundedString(gr, "vbios_version", &gpu.vbios_version));
    report.gpus.push_back(std::move(gpu));
    return Status::Ok();
  };
  GPUFLEET_RETURN_IF_ERROR(r.List("gpus", read_gpu));
  GPUFLEET_RETURN_IF_ERROR(r.Strings("command", &report.command));
  GPUFLEET_RETURN_IF_ERROR(r.Strings("env_names", &report.env_names));
  if (report.env_names.size() > kMaxProvenanceEnvNames) {
    return FieldError(
        r.Path("env_names"),
        fmt::format("{} names, more than {}", report.env_names.size(), kMaxProvenanceEnvNames));
  }
  std::set<std::string_view> names;
  for (size_t i = 0; i < report.env_names.size(); ++i) {
    const std::string& name = report.env_names[i];
    const std::string path = fmt::format("{}[{}]", r.Path("env_names"), i);
    if (name.size() > kMaxProvenanceFieldBytes || !IsEnvVarName(name)) {
      // The value is never echoed: a "NAME=VALUE" here may hold a secret.
      return FieldError(path,
                        "not an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at "
                        "most 256 bytes); provenance records names only, never values");
    }
    if (!names.insert(name).second) {
      return FieldError(path, fmt::format("duplicate name \"{}\"", name));
    }
  }
  std::sort(report.env_names.begin(), report.env_names.end());
  return report;
}

std::string TaskLogReportToJson(const TaskLogReport& report) {
  // A log is any bytes: each byte that is not part of well-formed UTF-8 (a binary write, a
  // character cut by the tail's start) is sent as '?', one byte for one, so that `size` and the
  // text's length still line up.
  std::string text = report.text;
  for (size_t from = 0; from < text.size();) {
    const size_t bad = InvalidUtf8Offset(std::string_view(text).substr(from));
    if (bad == std::string_view::npos) {
      break;
    }
    text[from + bad] = '?';
    from += bad + 1;
  }
  return Json{{"task_id", report.task_id},
              {"text", std::move(text)},
              {"size", report.size},
              {"final", report.final}}
      .dump();
}

Result<TaskLogReport> ParseTaskLogReport(std::string_view text) {
  // The tail, escaped at worst 6 bytes to 1 ("\u0001"), and the rest of the object.
  constexpr size_t kMaxBody = 6 * kMaxTaskLogTailBytes + 1024;
  if (text.size() > kMaxBody) {
    return InvalidArgumentError(
        fmt::format("body: {} bytes, more than the {} bytes a task log report may hold",
                    text.size(), kMaxBody));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ParseBody(text));
  GPUFLEET_ASSIGN_OR_RETURN(const ObjectReader r,
                            ObjectReader::Open(j, "", {"task_id", "text", "size", "final"}));
  TaskLogReport report;
  GPUFLEET_RETURN_IF_ERROR(r.String("task_id", &report.task_id, /*required=*/true));
  if (report.task_id.empty() || report.task_id.size() > kMaxTaskIdLength) {
    return FieldError(r.Path("task_id"),
                      fmt::format("must hold 1 to {} characters", kMaxTaskIdLength));
  }
  GPUFLEET_RETURN_IF_ERROR(r.String("text", &report.text));
  if (report.text.size() > kMaxTaskLogTailBytes) {
    return FieldError(r.Path("text"), fmt::format("{} bytes, more than the {} of a log's tail",
                                                  report.text.size(), kMaxTaskLogTailBytes));
  }
  GPUFLEET_RETURN_IF_ERROR(r.Integer("size", &report.size, 0, std::numeric_limits<int64_t>::max()));
  if (report.size < static_cast<int64_t>(report.text.size())) {
    return FieldError(r.Path("size"), fmt::format("{} is less than the {} bytes of the text",
                                                  report.size, report.text.size()));
  }
  if (const Json* final = r.Find("final")) {
    if (!final->is_boolean()) {
      return FieldError(r.Path("final"), "expected true or false, got " + ShownValue(*final));
    }
    report.final = final->get<bool>();
  }
  return report;
}

}  // namespace gpufleet::wire
