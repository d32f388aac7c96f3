// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpufleet/core/autoscaler_options.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"

// The deployment format of `POST /v1/deployments` (docs/api.md, "Deployments"): an inference
// job template run as replica jobs NAME-r<k>, whose count an autoscaler moves between min and max
// on the replicas' measured GPU utilization. JSON, or YAML with the same fields (the template a
// job spec in YAML), told apart as job specs are (a first non-blank '{' means JSON):
//
//   {"name": "chat", "queue": "default",
//    "template": {<a job spec as POST /v1/jobs takes, without metadata.name>},
//    "autoscaling": {"min_replicas": 1, "max_replicas": 4, "target_utilization_pct": 70, ...}}
//
// Every function here is thread-safe (no shared state) and never throws.
namespace gpufleet::wire {

// A deployment's name is a DNS label short enough that "NAME-r<k>" stays one for any k below
// 10^9.
inline constexpr size_t kMaxDeploymentNameChars = 52;
// Replica counts above this are refused: one spec must not flood the job list.
inline constexpr int kMaxDeploymentReplicas = 1000;
// The label each replica job carries, valued with the deployment's name.
inline constexpr std::string_view kDeploymentLabel = "deployment";

struct DeploymentSpec {
  std::string name;
  std::string queue;  // the template's metadata.queue when not given; "default" when neither
  // The template as given plus metadata.queue, for ReplicaJobSpec.
  nlohmann::json job_template;
  bool host_network = false;  // the template's task shares the node's network
  AutoscalerOptions autoscaling;
};

// Parses and checks a deployment. kInvalidArgument naming the field and the bad value: unknown
// fields ("autoscaling.max: unknown field"), wrong types, a name that is not a DNS label of at
// most kMaxDeploymentNameChars characters, a template that ParseJobSpec refuses (its message
// behind "template."), a template with metadata.name, a kind other than inference, more or
// fewer than one task group, a queue given in both places and differing, and autoscaling options
// out of range ("autoscaling.max_replicas: 1 (must be >= min_replicas 2)"). Malformed text is
// "deployment: not valid JSON: <where and what>" or "deployment: invalid YAML (line L, column C):
// <what>"; YAML with duplicate keys ("name: duplicate key (line 2, column 1)"), nesting deeper than
// 32 levels or over 100,000 values after expanding aliases is refused too.
Result<DeploymentSpec> ParseDeploymentSpec(std::string_view text, const GpuCatalog& catalog);

// The stored form: {"name", "queue", "template", "autoscaling": {..._pct, ..._seconds}};
// DeploymentSpecFromJson(DeploymentSpecToJson(spec)) gives `spec` back.
nlohmann::json DeploymentSpecToJson(const DeploymentSpec& spec);
Result<DeploymentSpec> DeploymentSpecFromJson(const nlohmann::json& stored,
                                              const GpuCatalog& catalog);

// The job spec (JSON text, as POST /v1/jobs takes) of replica `index`: the template named
// "NAME-r<index>", in the deployment's queue, labelled deployment=NAME.
std::string ReplicaJobSpec(const DeploymentSpec& spec, int64_t index);
std::string ReplicaJobName(std::string_view deployment, int64_t index);
// The k of "NAME-r<k>"; -1 when `job` is not named so.
int64_t ReplicaIndex(std::string_view deployment, std::string_view job);

}  // namespace gpufleet::wire
