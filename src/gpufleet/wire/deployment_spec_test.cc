// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/deployment_spec.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/wire/job_spec.h"

namespace gpufleet::wire {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

Json Template() {
  return Json::parse(R"({"apiVersion": "gpufleet.io/v1", "kind": "Job",
    "spec": {"kind": "inference", "tasks": [{"name": "server", "command": ["serve"],
      "resources": {"cpu": "2", "memory": "8Gi", "gpus": {"count": 1}}}]}})");
}

Json Deployment() {
  return {{"name", "chat"},
          {"template", Template()},
          {"autoscaling",
           {{"min_replicas", 1},
            {"max_replicas", 4},
            {"target_utilization_pct", 70},
            {"scale_up_cooldown_seconds", 60},
            {"scale_down_cooldown_seconds", 300}}}};
}

class DeploymentSpecTest : public ::testing::Test {
 protected:
  Result<DeploymentSpec> Parse(const Json& j) { return ParseDeploymentSpec(j.dump(), catalog_); }

  const GpuCatalog catalog_ = GpuCatalog::Default();
};

TEST_F(DeploymentSpecTest, ParsesAndMapsAutoscalingOntoTheAutoscalerOptions) {
  const Result<DeploymentSpec> spec = Parse(Deployment());
  ASSERT_OK(spec);
  EXPECT_EQ(spec->name, "chat");
  EXPECT_EQ(spec->queue, "default");
  EXPECT_EQ(spec->autoscaling.min_replicas, 1);
  EXPECT_EQ(spec->autoscaling.max_replicas, 4);
  EXPECT_EQ(spec->autoscaling.target_utilization_milli, 700);
  EXPECT_EQ(spec->autoscaling.scale_up_cooldown_seconds, 60);
  EXPECT_EQ(spec->autoscaling.scale_down_cooldown_seconds, 300);
  // Unset options keep the autoscaler's defaults.
  EXPECT_EQ(spec->autoscaling.tolerance_milli, AutoscalerOptions{}.tolerance_milli);
  EXPECT_EQ(spec->autoscaling.scale_down_stabilization_seconds,
            AutoscalerOptions{}.scale_down_stabilization_seconds);
}

TEST_F(DeploymentSpecTest, StoredFormRoundTrips) {
  Json j = Deployment();
  j["queue"] = "default";
  j["autoscaling"]["tolerance_pct"] = 5;
  const Result<DeploymentSpec> spec = Parse(j);
  ASSERT_OK(spec);
  const Json stored = DeploymentSpecToJson(*spec);
  const Result<DeploymentSpec> back = DeploymentSpecFromJson(stored, catalog_);
  ASSERT_OK(back);
  EXPECT_EQ(DeploymentSpecToJson(*back), stored);
  EXPECT_EQ(back->autoscaling.tolerance_milli, 50);
}

TEST_F(DeploymentSpecTest, ReplicaJobSpecIsTheTemplateNamedLabelledAndQueued) {
  const Result<DeploymentSpec> spec = Parse(Deployment());
  ASSERT_OK(spec);
  const Result<Job> job = ParseJobSpec(ReplicaJobSpec(*spec, 7), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->id.value(), "chat-r7");
  EXPECT_EQ(job->queue.value(), "default");
  EXPECT_EQ(job->labels.at("deployment"), "chat");
  EXPECT_EQ(job->kind, JobKind::kInference);
}

TEST_F(DeploymentSpecTest, ReplicaIndexReadsOnlyNamesTheDeploymentGives) {
  EXPECT_EQ(ReplicaIndex("chat", "chat-r0"), 0);
  EXPECT_EQ(ReplicaIndex("chat", "chat-r12"), 12);
  EXPECT_EQ(ReplicaIndex("chat", ReplicaJobName("chat", 3)), 3);
  for (const char* other :
       {"chat", "chat-r", "chat-rx", "chat-r01", "chat-r1x", "chatty-r1", "chat-r-1", "cha-r1"}) {
    SCOPED_TRACE(other);
    EXPECT_EQ(ReplicaIndex("chat", other), -1);
  }
}

TEST_F(DeploymentSpecTest, BadSpecsNameTheFieldAndValue) {
  struct Case {
    const char* what;
    Json spec;
    const char* message;
  };
  auto with = [](const std::string& pointer, Json value) {
    Json j = Deployment();
    j[Json::json_pointer(pointer)] = std::move(value);
    return j;
  };
  Json two_groups = Deployment();
  two_groups["template"]["spec"]["tasks"].push_back(two_groups["template"]["spec"]["tasks"][0]);
  two_groups["template"]["spec"]["tasks"][1]["name"] = "sidecar";
  Json no_template = Deployment();
  no_template.erase("template");
  Json nothing_to_run = Deployment();
  nothing_to_run["template"]["spec"]["tasks"][0].erase("command");
  const Case cases[] = {
      {"min over max", with("/autoscaling/min_replicas", 5),
       "autoscaling.max_replicas: 4 (must be >= min_replicas 5)"},
      {"target 0", with("/autoscaling/target_utilization_pct", 0),
       "autoscaling.target_utilization_pct: 0 (must be in 1..100)"},
      {"target over 100", with("/autoscaling/target_utilization_pct", 150),
       "autoscaling.target_utilization_pct: 150 (must be in 1..100)"},
      {"min 0", with("/autoscaling/min_replicas", 0),
       "autoscaling.min_replicas: 0 (must be in 1..1000)"},
      {"negative cooldown", with("/autoscaling/scale_down_cooldown_seconds", -1),
       "autoscaling.scale_down_cooldown_seconds: -1 (must be in 0..86400)"},
      {"not an integer", with("/autoscaling/max_replicas", "4"),
       "autoscaling.max_replicas: \"4\" (must be an integer)"},
      {"unknown autoscaling field", with("/autoscaling/target", 70),
       "autoscaling.target: unknown field"},
      {"unknown field", with("/replicas", 3), "replicas: unknown field"},
      {"two groups", two_groups, "template.spec.tasks: 2 task groups (a replica is exactly one)"},
      {"batch template", with("/template/spec/kind", "batch"),
       "template.spec.kind: batch (a deployment runs inference jobs"},
      {"named template", with("/template/metadata/name", "x"),
       "template.metadata.name: \"x\" (replicas are named chat-r<k>"},
      {"template field", with("/template/spec/tasks/0/resources/gpus/count", -1),
       "template.spec.tasks[0].resources.gpus.count"},
      {"template label", with("/template/metadata/labels/deployment", "other"),
       "template.metadata.labels.deployment: set by the deployment"},
      {"queue twice", with("/template/metadata/queue", "other"),
       "template.metadata.queue: \"other\""},
      {"bad name", with("/name", "Chat_1"), "name: \"Chat_1\" (must be lower-case"},
      {"long name", with("/name", std::string(53, 'a')), "at most 52 characters"},
      {"no template", no_template, "template: required"},
      {"nothing to run", nothing_to_run,
       "template.spec.tasks[0].command: task \"server\" has neither a command nor an image"},
      {"bad queue", with("/queue", "Bad Queue"), "queue"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Json spec = c.spec;
    if (std::string(c.what) == "queue twice") {
      spec["queue"] = "default";
    }
    const Result<DeploymentSpec> parsed = Parse(spec);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message));
  }
  const Result<DeploymentSpec> not_json = ParseDeploymentSpec(R"({"name": "chat",)", catalog_);
  ASSERT_FALSE(not_json.ok());
  EXPECT_THAT(not_json.status().message(),
              HasSubstr("deployment: invalid JSON: parse error at line 1, column 17"));
}

TEST_F(DeploymentSpecTest, YamlGivesTheSameSpecAsJson) {
  const std::string yaml = R"(# the same deployment as Deployment()
name: chat
template:
  apiVersion: gpufleet.io/v1
  kind: Job
  spec:
    kind: inference
    tasks:
      - name: server
        command: [serve]
        resources: {cpu: "2", memory: 8Gi, gpus: {count: 1}}
autoscaling:
  min_replicas: 1
  max_replicas: 4
  target_utilization_pct: 70
  scale_up_cooldown_seconds: 60
  scale_down_cooldown_seconds: 300
)";
  const Result<DeploymentSpec> from_yaml = ParseDeploymentSpec(yaml, catalog_);
  ASSERT_OK(from_yaml);
  const Result<DeploymentSpec> from_json = Parse(Deployment());
  ASSERT_OK(from_json);
  EXPECT_EQ(DeploymentSpecToJson(*from_yaml), DeploymentSpecToJson(*from_json));
}

TEST_F(DeploymentSpecTest, BadYamlIsRefusedNamingTheProblem) {
  const std::pair<std::string, std::string> cases[] = {
      {"name: chat\ntemplate: {kind: [\n", "deployment: invalid YAML at line 3"},
      {"name: chat\nname: chat2\n", "name: duplicate key (line 2, column 1)"},
      {"- name: chat\n", "deployment: must be an object"},
      {"", "deployment: spec is empty"},
      // A quoted number stays a string, as in JSON.
      {"name: chat\ntemplate: {apiVersion: gpufleet.io/v1, kind: Job, spec: {kind: inference, "
       "tasks: [{name: s, command: [serve], resources: {cpu: 2, memory: 8Gi, gpus: {count: 1}}}]}}"
       "\nautoscaling: {min_replicas: \"2\"}\n",
       "autoscaling.min_replicas: \"2\" (must be an integer)"},
      // Aliases that expand a few lines into billions of values.
      {"a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
       "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\n"
       "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e]\n",
       "more than 100000 values"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    const Result<DeploymentSpec> spec = ParseDeploymentSpec(text, catalog_);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr(message));
  }
}

}  // namespace
}  // namespace gpufleet::wire
