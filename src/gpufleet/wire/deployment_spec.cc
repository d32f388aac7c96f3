// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/deployment_spec.h"

#include <cctype>
#include <charconv>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_fields.h"
#include "gpufleet/wire/spec_tree.h"

namespace gpufleet::wire {
namespace {

using Json = nlohmann::json;

constexpr int64_t kMilliPerPercent = 10;

// JSON or YAML through the job spec's reader (spec_tree.h), with its limits and positions.
Result<Json> ParseDocumentText(std::string_view text) {
  Result<SpecNode> tree = ParseSpecTree(text);
  if (!tree.ok()) {
    return InvalidArgumentError(fmt::format("deployment: {}", tree.status().message()));
  }
  return SpecTreeToJson(*tree);
}

bool IsDeploymentLabel(std::string_view s) {
  if (s.empty() || s.size() > kMaxDeploymentNameChars) {
    return false;
  }
  auto lower_alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  for (const char c : s) {
    if (!lower_alnum(c) && c != '-') {
      return false;
    }
  }
  return lower_alnum(s.front()) && lower_alnum(s.back());
}

Status UnknownFields(const Json& object, std::string_view prefix,
                     const std::set<std::string_view>& known) {
  for (const auto& [key, value] : object.items()) {
    if (known.count(key) == 0) {
      return InvalidArgumentError(
          fmt::format("{}{}: unknown field (valid: {})", prefix, key, fmt::join(known, ", ")));
    }
  }
  return Status::Ok();
}

// An integer field of `object` in [low, high]; `fallback` when absent.
Result<int64_t> IntField(const Json& object, std::string_view prefix, std::string_view key,
                         int64_t low, int64_t high, int64_t fallback) {
  const auto it = object.find(key);
  if (it == object.end()) {
    return fallback;
  }
  if (!it->is_number_integer()) {
    return InvalidArgumentError(
        fmt::format("{}{}: {} (must be an integer)", prefix, key, it->dump()));
  }
  const int64_t value = it->get<int64_t>();
  if (value < low || value > high) {
    return InvalidArgumentError(
        fmt::format("{}{}: {} (must be in {}..{})", prefix, key, value, low, high));
  }
  return value;
}

Result<AutoscalerOptions> ParseAutoscaling(const Json& j) {
  constexpr std::string_view kPrefix = "autoscaling.";
  if (!j.is_object()) {
    return InvalidArgumentError(fmt::format("autoscaling: {} (must be an object)", j.dump()));
  }
  GPUFLEET_RETURN_IF_ERROR(
      UnknownFields(j, kPrefix,
                    {"min_replicas", "max_replicas", "target_utilization_pct", "tolerance_pct",
                     "scale_up_stabilization_seconds", "scale_down_stabilization_seconds",
                     "scale_up_cooldown_seconds", "scale_down_cooldown_seconds"}));
  constexpr int64_t kDay = 24 * 3600;
  AutoscalerOptions options;
  GPUFLEET_ASSIGN_OR_RETURN(
      const int64_t min_replicas,
      IntField(j, kPrefix, "min_replicas", 1, kMaxDeploymentReplicas, options.min_replicas));
  GPUFLEET_ASSIGN_OR_RETURN(
      const int64_t max_replicas,
      IntField(j, kPrefix, "max_replicas", 1, kMaxDeploymentReplicas, options.max_replicas));
  options.min_replicas = static_cast<int>(min_replicas);
  options.max_replicas = static_cast<int>(max_replicas);
  GPUFLEET_ASSIGN_OR_RETURN(const int64_t target_pct,
                            IntField(j, kPrefix, "target_utilization_pct", 1, 100,
                                     options.target_utilization_milli / kMilliPerPercent));
  options.target_utilization_milli = target_pct * kMilliPerPercent;
  GPUFLEET_ASSIGN_OR_RETURN(
      const int64_t tolerance_pct,
      IntField(j, kPrefix, "tolerance_pct", 0, 99, options.tolerance_milli / kMilliPerPercent));
  options.tolerance_milli = tolerance_pct * kMilliPerPercent;
  GPUFLEET_ASSIGN_OR_RETURN(options.scale_up_stabilization_seconds,
                            IntField(j, kPrefix, "scale_up_stabilization_seconds", 0, kDay,
                                     options.scale_up_stabilization_seconds));
  GPUFLEET_ASSIGN_OR_RETURN(options.scale_down_stabilization_seconds,
                            IntField(j, kPrefix, "scale_down_stabilization_seconds", 0, kDay,
                                     options.scale_down_stabilization_seconds));
  GPUFLEET_ASSIGN_OR_RETURN(options.scale_up_cooldown_seconds,
                            IntField(j, kPrefix, "scale_up_cooldown_seconds", 0, kDay,
                                     options.scale_up_cooldown_seconds));
  GPUFLEET_ASSIGN_OR_RETURN(options.scale_down_cooldown_seconds,
                            IntField(j, kPrefix, "scale_down_cooldown_seconds", 0, kDay,
                                     options.scale_down_cooldown_seconds));
  // The remaining cross-field rules (max >= min) are the autoscaler's own.
  if (const Status status = options.Validate(); !status.ok()) {
    return InvalidArgumentError(fmt::format("{}{}", kPrefix, status.message()));
  }
  return options;
}

// ParseJobSpec's messages start with the field path; the template's fields sit under
// "template.".
Status InTemplate(const Status& status) {
  const std::string& message = status.message();
  const bool starts_with_field = !message.empty() && std::islower(message.front()) != 0 &&
                                 message.find(':') != std::string::npos &&
                                 message.find(' ') > message.find(':');
  return Status(status.code(), starts_with_field ? fmt::format("template.{}", message)
                                                 : fmt::format("template: {}", message));
}

// Checks the template as replica 0 and returns it with its queue set; `host_network` tells
// whether its task shares the node's network.
Result<Json> CheckTemplate(Json job_template, const std::string& name, std::string& queue,
                           bool& host_network, const GpuCatalog& catalog) {
  if (!job_template.is_object()) {
    return InvalidArgumentError(
        fmt::format("template: {} (must be a job spec object)", job_template.dump()));
  }
  Json& metadata = job_template["metadata"];
  if (metadata.is_null()) {
    metadata = Json::object();
  }
  if (!metadata.is_object()) {
    return InvalidArgumentError(
        fmt::format("template.metadata: {} (must be an object)", metadata.dump()));
  }
  if (metadata.contains("name")) {
    return InvalidArgumentError(
        fmt::format("template.metadata.name: {} (replicas are named {}-r<k>; leave it out)",
                    metadata["name"].dump(), name));
  }
  if (const auto it = metadata.find("queue"); it != metadata.end() && it->is_string()) {
    if (!queue.empty() && *it != queue) {
      return InvalidArgumentError(
          fmt::format("template.metadata.queue: \"{}\" (differs from queue \"{}\"; give it once)",
                      it->get<std::string>(), queue));
    }
    queue = it->get<std::string>();
  }
  if (queue.empty()) {
    queue = "default";
  }
  metadata["queue"] = queue;
  Json replica = job_template;
  replica["metadata"]["name"] = ReplicaJobName(name, 0);
  Result<Job> job = ParseJobSpec(replica.dump(), catalog);
  if (!job.ok()) {
    return InTemplate(job.status());
  }
  if (const Status runnable = CheckTasksRunnable(*job); !runnable.ok()) {
    return InTemplate(runnable);
  }
  if (job->kind != JobKind::kInference) {
    return InvalidArgumentError(fmt::format(
        "template.spec.kind: {} (a deployment runs inference jobs; set kind: inference)",
        JobKindName(job->kind)));
  }
  if (job->groups.size() != 1) {
    return InvalidArgumentError(fmt::format(
        "template.spec.tasks: {} task groups (a replica is exactly one)", job->groups.size()));
  }
  if (job->labels.count(std::string(kDeploymentLabel)) > 0) {
    return InvalidArgumentError(fmt::format(
        "template.metadata.labels.{}: set by the deployment; leave it out", kDeploymentLabel));
  }
  host_network = job->groups.front().host_network;
  return job_template;
}

Result<DeploymentSpec> FromJson(const Json& j, const GpuCatalog& catalog) {
  if (!j.is_object()) {
    return InvalidArgumentError("deployment: must be an object (a JSON object or a YAML map)");
  }
  GPUFLEET_RETURN_IF_ERROR(UnknownFields(j, "", {"name", "queue", "template", "autoscaling"}));
  DeploymentSpec spec;
  const auto name = j.find("name");
  if (name == j.end()) {
    return InvalidArgumentError("name: required");
  }
  if (!name->is_string() || !IsDeploymentLabel(name->get<std::string>())) {
    return InvalidArgumentError(
        fmt::format("name: {} (must be lower-case letters, digits and '-', starting and ending "
                    "with a letter or digit, at most {} characters)",
                    name->dump(), kMaxDeploymentNameChars));
  }
  spec.name = name->get<std::string>();
  if (const auto queue = j.find("queue"); queue != j.end()) {
    if (!queue->is_string()) {
      return InvalidArgumentError(fmt::format("queue: {} (must be a string)", queue->dump()));
    }
    GPUFLEET_RETURN_IF_ERROR(ValidateQueueName("queue", queue->get<std::string>()));
    spec.queue = queue->get<std::string>();
  }
  const auto job_template = j.find("template");
  if (job_template == j.end()) {
    return InvalidArgumentError("template: required (a job spec of kind inference)");
  }
  GPUFLEET_ASSIGN_OR_RETURN(spec.job_template, CheckTemplate(*job_template, spec.name, spec.queue,
                                                             spec.host_network, catalog));
  if (const auto autoscaling = j.find("autoscaling"); autoscaling != j.end()) {
    GPUFLEET_ASSIGN_OR_RETURN(spec.autoscaling, ParseAutoscaling(*autoscaling));
  }
  return spec;
}

}  // namespace

Result<DeploymentSpec> ParseDeploymentSpec(std::string_view text, const GpuCatalog& catalog) {
  if (text.size() > kMaxJobSpecBytes) {
    return InvalidArgumentError(fmt::format("deployment: over {} bytes", kMaxJobSpecBytes));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ParseDocumentText(text));
  return FromJson(j, catalog);
}

Json DeploymentSpecToJson(const DeploymentSpec& spec) {
  const AutoscalerOptions& a = spec.autoscaling;
  return {{"name", spec.name},
          {"queue", spec.queue},
          {"template", spec.job_template},
          {"autoscaling",
           {{"min_replicas", a.min_replicas},
            {"max_replicas", a.max_replicas},
            {"target_utilization_pct", a.target_utilization_milli / kMilliPerPercent},
            {"tolerance_pct", a.tolerance_milli / kMilliPerPercent},
            {"scale_up_stabilization_seconds", a.scale_up_stabilization_seconds},
            {"scale_down_stabilization_seconds", a.scale_down_stabilization_seconds},
            {"scale_up_cooldown_seconds", a.scale_up_cooldown_seconds},
            {"scale_down_cooldown_seconds", a.scale_down_cooldown_seconds}}}};
}

Result<DeploymentSpec> DeploymentSpecFromJson(const Json& stored, const GpuCatalog& catalog) {
  Json spec = Json::object();
  for (const char* key : {"name", "queue", "template", "autoscaling"}) {
    if (stored.is_object() && stored.contains(key)) {
      spec[key] = stored[key];
    }
  }
  return FromJson(spec, catalog);
}

std::string ReplicaJobSpec(const DeploymentSpec& spec, int64_t index) {
  Json job = spec.job_template;
  job["metadata"]["name"] = ReplicaJobName(spec.name, index);
  job["metadata"]["labels"][std::string(kDeploymentLabel)] = spec.name;
  return job.dump();
}

std::string ReplicaJobName(std::string_view deployment, int64_t index) {
  return fmt::format("{}-r{}", deployment, index);
}

int64_t ReplicaIndex(std::string_view deployment, std::string_view job) {
  if (job.size() <= deployment.size() + 2 || job.substr(0, deployment.size()) != deployment ||
      job.substr(deployment.size(), 2) != "-r") {
    return -1;
  }
  const std::string_view digits = job.substr(deployment.size() + 2);
  if (digits.size() > 1 && digits.front() == '0') {
    return -1;  // "r01" is not a name this module gives
  }
  int64_t index = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (error != std::errc() || end != digits.data() + digits.size() || index < 0) {
    return -1;
  }
  return index;
}

}  // namespace gpufleet::wire
