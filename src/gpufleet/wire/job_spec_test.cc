// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/job_spec.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet {
// Shows a failed result as its status rather than as bytes.
static void PrintTo(const Result<Job>& result, std::ostream* os) {
  *os << (result.ok() ? "a job" : result.status().ToString());
}
}  // namespace gpufleet

namespace gpufleet::wire {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string ReadExample(const std::string& name) {
  std::ifstream in(std::filesystem::path(GPUFLEET_EXAMPLES_DIR) / name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every field of Job, one by one (Job has no operator==).
void ExpectSameJob(const Job& actual, const Job& expected) {
  EXPECT_EQ(actual.id, expected.id);
  ASSERT_EQ(actual.groups.size(), expected.groups.size());
  for (size_t i = 0; i < expected.groups.size(); ++i) {
    SCOPED_TRACE(expected.groups[i].name);
    EXPECT_EQ(actual.groups[i].name, expected.groups[i].name);
    EXPECT_EQ(actual.groups[i].replicas, expected.groups[i].replicas);
    EXPECT_EQ(actual.groups[i].min_replicas, expected.groups[i].min_replicas);
    EXPECT_EQ(actual.groups[i].request.host, expected.groups[i].request.host);
    EXPECT_TRUE(actual.groups[i].request.gpus == expected.groups[i].request.gpus)
        << GpuRequestToString(actual.groups[i].request.gpus) << " vs "
        << GpuRequestToString(expected.groups[i].request.gpus);
    EXPECT_EQ(actual.groups[i].command, expected.groups[i].command);
    EXPECT_EQ(actual.groups[i].env, expected.groups[i].env);
    EXPECT_EQ(actual.groups[i].image, expected.groups[i].image);
    EXPECT_EQ(actual.groups[i].image_pull_policy, expected.groups[i].image_pull_policy);
    EXPECT_EQ(actual.groups[i].host_network, expected.groups[i].host_network);
  }
  EXPECT_EQ(actual.provenance, expected.provenance);
  EXPECT_EQ(actual.allowed_gpu_models, expected.allowed_gpu_models);
  EXPECT_EQ(actual.min_gpu_memory_mib, expected.min_gpu_memory_mib);
  EXPECT_EQ(actual.node_selector, expected.node_selector);
  EXPECT_EQ(actual.topology.required_level, expected.topology.required_level);
  EXPECT_EQ(actual.topology.preferred_level, expected.topology.preferred_level);
  EXPECT_EQ(actual.spread.fault_domain, expected.spread.fault_domain);
  EXPECT_EQ(actual.spread.max_skew, expected.spread.max_skew);
  EXPECT_EQ(actual.identical_stack_labels, expected.identical_stack_labels);
  EXPECT_EQ(actual.identical_image_digest, expected.identical_image_digest);
  EXPECT_EQ(actual.labels, expected.labels);
  EXPECT_EQ(actual.priority, expected.priority);
  EXPECT_EQ(actual.queue, expected.queue);
  EXPECT_EQ(actual.preemptible, expected.preemptible);
  EXPECT_EQ(actual.kind, expected.kind);
  EXPECT_EQ(actual.runtime_estimate, expected.runtime_estimate);
  EXPECT_EQ(actual.on_node_failure, expected.on_node_failure);
}

class JobSpecTest : public ::testing::Test {
 protected:
  const GpuCatalog catalog_ = GpuCatalog::Default();
};

TEST_F(JobSpecTest, EveryExampleParsesAndRoundTrips) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(GPUFLEET_EXAMPLES_DIR)) {
    if (entry.path().extension() != ".yaml") {
      continue;
    }
    SCOPED_TRACE(entry.path().filename().string());
    ++count;
    const Result<Job> job = ParseJobSpec(ReadExample(entry.path().filename()), catalog_);
    ASSERT_OK(job);
    const Result<Job> from_yaml = ParseJobSpec(JobSpecToYaml(*job), catalog_);
    ASSERT_OK(from_yaml);
    ExpectSameJob(*from_yaml, *job);
    const Result<Job> from_json = ParseJobSpec(JobSpecToJson(*job).dump(2), catalog_);
    ASSERT_OK(from_json);
    ExpectSameJob(*from_json, *job);
    // As the scheduler reads a stored job: the spec member of a parsed document.
    const nlohmann::json stored = {{"state", "Pending"}, {"spec", JobSpecToJson(*job)}};
    const Result<Job> from_value =
        JobSpecFromJson(nlohmann::json::parse(stored.dump())["spec"], catalog_);
    ASSERT_OK(from_value);
    ExpectSameJob(*from_value, *job);
    EXPECT_OK(CheckTasksRunnable(*job));  // every example has something to run
  }
  EXPECT_GE(count, 6);
}

// A task with neither a command nor an image would run nothing: refused at submit, naming it.
// The parser itself reads it (a stored job is read as it was).
TEST_F(JobSpecTest, ATaskWithNeitherCommandNorImageIsNotRunnable) {
  const Result<Job> job = ParseJobSpec(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: j}
spec:
  tasks:
    - {name: prep, command: [python, prep.py]}
    - {name: serve, image: "nvcr.io/nvidia/tritonserver:24.05-py3"}
    - {name: eval}
)",
                                       catalog_);
  ASSERT_OK(job);
  EXPECT_THAT(CheckTasksRunnable(*job),
              StatusIs(StatusCode::kInvalidArgument,
                       "spec.tasks[2].command: task \"eval\" has neither a command nor an "
                       "image; give it one or both"));
  Job runnable = *job;
  runnable.groups[2].command = {"python", "eval.py"};
  EXPECT_OK(CheckTasksRunnable(runnable));
}

TEST_F(JobSpecTest, SingleGpuExample) {
  const Result<Job> job = ParseJobSpec(ReadExample("single-gpu.yaml"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->id, JobId("single-gpu"));
  EXPECT_EQ(job->queue, QueueId("default"));
  EXPECT_EQ(job->kind, JobKind::kBatch);
  EXPECT_TRUE(job->preemptible);
  EXPECT_EQ(job->runtime_estimate, std::chrono::minutes(30));
  ASSERT_EQ(job->groups.size(), 1u);
  EXPECT_EQ(job->groups[0].replicas, 1);
  EXPECT_EQ(job->groups[0].request.host, (HostResources{8000, 64 * 1024}));
  EXPECT_TRUE(job->groups[0].request.gpus == GpuRequest(WholeGpus{1}));
  EXPECT_EQ(job->allowed_gpu_models, std::vector<std::string>{"H100-80GB"});
}

TEST_F(JobSpecTest, FractionalExample) {
  const Result<Job> job = ParseJobSpec(ReadExample("fractional.yaml"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->queue, QueueId("research/cv"));
  EXPECT_EQ(job->priority, 10);
  EXPECT_EQ(job->groups[0].request.host, (HostResources{500, 4096}));
  EXPECT_TRUE(job->groups[0].request.gpus == GpuRequest(FractionalGpu{250, 10 * 1024}));
}

TEST_F(JobSpecTest, MigExample) {
  const Result<Job> job = ParseJobSpec(ReadExample("mig.yaml"), catalog_);
  ASSERT_OK(job);
  EXPECT_TRUE(job->groups[0].request.gpus == GpuRequest(MigGpus{"3g.40gb", 2}));
  EXPECT_EQ(job->runtime_estimate, std::chrono::minutes(90));
}

TEST_F(JobSpecTest, GangExample) {
  const Result<Job> job = ParseJobSpec(ReadExample("gang-128-leaf.yaml"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->id, JobId("bert-pretrain"));
  EXPECT_EQ(job->TaskCount(), 128);
  EXPECT_EQ(job->RequestedGpuMilliTotal(), 1024 * 1000);
  EXPECT_TRUE(job->groups[0].request.gpus == GpuRequest(WholeGpus{8}));
  EXPECT_EQ(job->groups[0].request.host.memory_mib, 1024 * 1024);
  EXPECT_EQ(job->topology.required_level, "leaf");
  EXPECT_EQ(job->topology.preferred_level, "nvlink-domain");
  EXPECT_EQ(job->identical_stack_labels,
            (std::vector<std::string>{"gpufleet.io/driver-version", "gpufleet.io/cuda-version"}));
  EXPECT_EQ(job->min_gpu_memory_mib, 80 * 1024);
  EXPECT_FALSE(job->preemptible);
  EXPECT_EQ(job->priority, 100);
}

TEST_F(JobSpecTest, NotebookExample) {
  const Result<Job> job = ParseJobSpec(ReadExample("notebook.yaml"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->kind, JobKind::kInteractive);
  EXPECT_TRUE(job->groups[0].request.gpus == GpuRequest(FractionalGpu{500, 0}));
  EXPECT_EQ(job->node_selector, (std::map<std::string, std::string>{{"zone", "east"}}));
}

TEST_F(JobSpecTest, InferenceExample) {
  const Result<Job> job = ParseJobSpec(ReadExample("inference.yaml"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->kind, JobKind::kInference);
  EXPECT_EQ(job->groups[0].replicas, 4);
  EXPECT_EQ(job->groups[0].request.host.cpu_milli, 1500);
  EXPECT_TRUE(job->groups[0].request.gpus == GpuRequest(MigGpus{"1g.10gb", 1}));
  EXPECT_EQ(job->spread.fault_domain, "rack");
  EXPECT_EQ(job->spread.max_skew, 1);
}

// A job with every field away from its default, and every form of GPU request.
Job FullJob() {
  Job job;
  job.id = JobId("full");
  job.queue = QueueId("team-a/sub");
  job.kind = JobKind::kInference;
  job.priority = -7;
  job.preemptible = false;
  job.runtime_estimate = std::chrono::hours(1) + std::chrono::seconds(61);
  job.groups.push_back({"whole", 3, {{32000, 256 * 1024}, WholeGpus{8}}});
  job.groups.push_back({"share", 1, {{500, 1500}, FractionalGpu{333, 10 * 1024 + 1}}});
  job.groups.push_back({"share-no-memory", 2, {{1, 1}, FractionalGpu{1, 0}}});
  job.groups.push_back({"mig", 2, {{1234, 3 * 1024 * 1024}, MigGpus{"3g.40gb", 2}}});
  job.groups.push_back({"cpu-only", 1, {{2000, 0}, NoGpu{}}});
  job.groups.push_back({"nothing", 1, {}});
  job.groups[0].command = {"python", "train.py", "--lr", "1e-4", "--lr", "", "yes", "a: b # c"};
  job.groups[0].env = {{"NCCL_DEBUG", "INFO"}, {"EMPTY", ""}, {"_X1", "true"}, {"N", "007"}};
  job.on_node_failure = NodeFailurePolicy::kFail;
  job.allowed_gpu_models = {"H100-80GB", "A100-SXM4-80GB"};
  job.min_gpu_memory_mib = 40 * 1024;
  job.node_selector = {{"zone", "east"}, {"gpufleet.io/pool", "1.10"}, {"empty", ""}};
  job.topology = {"leaf", "nvlink-domain"};
  job.spread = {"rack", 2};
  job.identical_stack_labels = {"gpufleet.io/driver-version", "true"};
  job.labels = {{"team", "nlp"}, {"gpufleet.io/experiment", "lr-sweep.3"}, {"stage", ""}};
  job.groups[0].image = "nvcr.io/nvidia/pytorch:24.05-py3";
  job.groups[0].image_pull_policy = ImagePullPolicy::kAlways;
  job.groups[0].host_network = true;
  job.groups[1].image = "127.0.0.1:15000/tiny@sha256:" + std::string(64, 'e');
  job.groups[1].image_pull_policy = ImagePullPolicy::kNever;
  job.groups[2].image = "localhost/tiny:1";
  job.provenance = {{"git.commit", "3f2c1e0"},
                    {"dataset", "sha256:ab12"},
                    {"lr", "1e-4"},
                    {"notes", "two words: yes\nand a second line"},
                    {"empty", ""}};
  return job;
}

TEST_F(JobSpecTest, RoundTripKeepsEveryField) {
  const Job job = FullJob();
  ASSERT_OK(job.Validate(catalog_));
  const std::string yaml = JobSpecToYaml(job);
  const Result<Job> from_yaml = ParseJobSpec(yaml, catalog_);
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status().ToString() << "\n" << yaml;
  ExpectSameJob(*from_yaml, job);
  const std::string json = JobSpecToJson(job).dump();
  const Result<Job> from_json = ParseJobSpec(json, catalog_);
  ASSERT_TRUE(from_json.ok()) << from_json.status().ToString() << "\n" << json;
  ExpectSameJob(*from_json, job);
  // Strings that YAML would read as numbers or booleans are quoted.
  EXPECT_THAT(yaml, HasSubstr("\"1.10\""));
  EXPECT_THAT(yaml, HasSubstr("\"true\""));
}

TEST_F(JobSpecTest, WritesTheDocumentedSchema) {
  const Result<Job> job = ParseJobSpec(ReadExample("gang-128-leaf.yaml"), catalog_);
  ASSERT_OK(job);
  const nlohmann::json json = JobSpecToJson(*job);
  EXPECT_EQ(json["apiVersion"], "gpufleet.io/v1");
  EXPECT_EQ(json["kind"], "Job");
  EXPECT_EQ(json["metadata"]["name"], "bert-pretrain");
  EXPECT_EQ(json["metadata"]["labels"]["gpufleet.io/project"], "bert");
  EXPECT_EQ(job->labels.at("team"), "nlp");
  EXPECT_EQ(json["spec"]["runtimeEstimate"], "48h");
  EXPECT_EQ(json["spec"]["tasks"][0]["resources"]["cpu"], "96");
  EXPECT_EQ(json["spec"]["tasks"][0]["resources"]["memory"], "1Ti");
  EXPECT_EQ(json["spec"]["tasks"][0]["resources"]["gpus"]["count"], 8);
  EXPECT_EQ(json["spec"]["topology"]["required"], "leaf");
  const std::string yaml = JobSpecToYaml(*job);
  EXPECT_THAT(yaml, StartsWith("apiVersion: gpufleet.io/v1\nkind: Job\n"));
  EXPECT_THAT(yaml, HasSubstr("cpu: \"96\""));
  EXPECT_THAT(yaml, HasSubstr("gpus: {count: 8}"));
}

TEST_F(JobSpecTest, ContainerFieldsAndProvenance) {
  const Result<Job> job = ParseJobSpec(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: j}
spec:
  provenance: {git.commit: 3f2c1e0, lr: "1e-4"}
  tasks:
  - {name: a, command: [sh], image: localhost/tiny:1}
  - {name: b, command: [sh], image: "127.0.0.1:15000/tiny:1", imagePullPolicy: Never,
     hostNetwork: true}
  - {name: c, command: [sh]}
)",
                                       catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->groups[0].image, "localhost/tiny:1");
  EXPECT_EQ(job->groups[0].image_pull_policy, ImagePullPolicy::kIfNotPresent);
  EXPECT_FALSE(job->groups[0].host_network);
  EXPECT_EQ(job->groups[1].image_pull_policy, ImagePullPolicy::kNever);
  EXPECT_TRUE(job->groups[1].host_network);
  EXPECT_EQ(job->groups[2].image, "");
  EXPECT_EQ(job->provenance,
            (std::map<std::string, std::string>{{"git.commit", "3f2c1e0"}, {"lr", "1e-4"}}));
  const nlohmann::json json = JobSpecToJson(*job);
  EXPECT_EQ(json["spec"]["tasks"][1]["imagePullPolicy"], "Never");
  EXPECT_FALSE(json["spec"]["tasks"][0].contains("imagePullPolicy"));  // the default
  EXPECT_EQ(json["spec"]["provenance"]["lr"], "1e-4");
}

TEST_F(JobSpecTest, ValidateRefusesABadImageOrProvenanceOfAJobBuiltInCode) {
  Job job = FullJob();
  job.groups[0].image = "-v/:/host";
  EXPECT_THAT(job.Validate(catalog_),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("groups[0].image: ")));
  job = FullJob();
  for (int i = 0; i < 65; ++i) {
    job.provenance[fmt::format("k{}", i)] = "v";
  }
  EXPECT_THAT(job.Validate(catalog_),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("provenance: 70 entries")));
}

TEST_F(JobSpecTest, AcceptsJson) {
  const Result<Job> job = ParseJobSpec(R"( {"apiVersion": "gpufleet.io/v1", "kind": "Job",
      "metadata": {"name": "j"},
      "spec": {"priority": 3, "tasks": [{"name": "t", "replicas": 2,
               "resources": {"cpu": 0.5, "memory": "1Gi", "gpus": {"fraction": 0.5}}}]}})",
                                       catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->priority, 3);
  EXPECT_EQ(job->groups[0].replicas, 2);
  EXPECT_EQ(job->groups[0].request.host, (HostResources{500, 1024}));
  EXPECT_TRUE(job->groups[0].request.gpus == GpuRequest(FractionalGpu{500, 0}));
}

TEST_F(JobSpecTest, SharingOfAShareIsReadAndWrittenBack) {
  const Result<Job> job = ParseJobSpec(R"( {"apiVersion": "gpufleet.io/v1", "kind": "Job",
      "metadata": {"name": "j"},
      "spec": {"tasks": [
        {"name": "a", "resources": {"gpus": {"milli": 250, "memory": "8Gi", "sharing": "mps"}}},
        {"name": "b", "resources": {"gpus": {"fraction": 0.5, "sharing": "time-slicing"}}},
        {"name": "c", "resources": {"gpus": {"fraction": 0.5}}}]}})",
                                       catalog_);
  ASSERT_OK(job);
  EXPECT_TRUE(job->groups[0].request.gpus ==
              GpuRequest(FractionalGpu{250, 8192, GpuSharing::kMps}));
  EXPECT_TRUE(job->groups[1].request.gpus ==
              GpuRequest(FractionalGpu{500, 0, GpuSharing::kTimeSlicing}));
  EXPECT_TRUE(job->groups[2].request.gpus ==
              GpuRequest(FractionalGpu{500, 0, GpuSharing::kNodeDefault}));
  const std::string yaml = JobSpecToYaml(*job);
  EXPECT_THAT(yaml, HasSubstr("sharing: mps"));
  const Result<Job> again = ParseJobSpec(yaml, catalog_);
  ASSERT_OK(again);
  for (size_t i = 0; i < job->groups.size(); ++i) {
    EXPECT_TRUE(again->groups[i].request.gpus == job->groups[i].request.gpus) << i;
  }
}

TEST_F(JobSpecTest, YamlAnchorsAndAliasesAreExpanded) {
  const Result<Job> job = ParseJobSpec(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: j}
spec:
  tasks:
    - name: a
      resources: &res {cpu: "1", gpus: {count: 1}}
    - name: b
      resources: *res
)",
                                       catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->groups[1].request.host.cpu_milli, 1000);
  EXPECT_TRUE(job->groups[1].request.gpus == GpuRequest(WholeGpus{1}));
}

TEST_F(JobSpecTest, RefusesOversizedSpec) {
  const std::string text = "# " + std::string(kMaxJobSpecBytes, 'x');
  EXPECT_THAT(ParseJobSpec(text, catalog_),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("spec too large: 1048578 bytes, limit 1048576")));
}

TEST_F(JobSpecTest, RefusesInvalidUtf8) {
  EXPECT_THAT(ParseJobSpec("apiVersion: gpufleet.io/v1\nkind: \xC3\x28", catalog_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("byte offset 33")));
  EXPECT_THAT(ParseJobSpec("a: \xED\xA0\x80", catalog_),  // a UTF-16 surrogate
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("byte offset 3")));
  EXPECT_THAT(ParseJobSpec("a: \xC0\xAF", catalog_),  // overlong '/'
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("byte offset 3")));
  EXPECT_THAT(ParseJobSpec("a: \xF0\x9F\x98", catalog_),  // cut short
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("byte offset 3")));
}

TEST_F(JobSpecTest, RefusesAliasBombs) {
  std::string text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'k'; ++c) {
    text += fmt::format("{}: &{} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n", c,
                        c, fmt::arg("p", static_cast<char>(c - 1)));
  }
  EXPECT_THAT(ParseJobSpec(text, catalog_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("spec too complex")));
}

TEST_F(JobSpecTest, RefusesDeepNesting) {
  // Deeper than yaml-cpp's own guard (500 levels) too, in YAML and JSON.
  for (const std::string prefix : {"", "{\"a\":"}) {
    const std::string text =
        prefix + std::string(100000, '[') + std::string(100000, ']') + (prefix.empty() ? "" : "}");
    EXPECT_THAT(ParseJobSpec(text, catalog_),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("nesting deeper than 32 levels")));
  }
  EXPECT_THAT(ParseJobSpec(std::string(100, '[') + std::string(100, ']'), catalog_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("nesting deeper than 32 levels")));
  EXPECT_THAT(
      ParseJobSpec("{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", catalog_),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("nesting deeper than 32 levels")));
  // Each part is 20 deep: fine alone, too deep together.
  const std::string aliases = "a: &a " + std::string(20, '[') + "x" + std::string(20, ']') +
                              "\nb: " + std::string(20, '[') + "*a" + std::string(20, ']') + "\n";
  EXPECT_THAT(ParseJobSpec(aliases, catalog_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("nesting deeper than 32 levels")));
}

// A parsed JSON value gets the checks and messages of its text, less the position.
TEST_F(JobSpecTest, ParsedJsonValueGetsTheTextsMessages) {
  const std::string deep = std::string(40, '[') + std::string(40, ']');
  for (const std::string& text : std::vector<std::string>{
           R"({"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"tasks": [{"name": "t", "resources": {"cpu": "0.0001"}}]}})",
           R"({"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"tasks": [{"name": "t", "replicas": -1}]}})",
           R"({"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"tasks": [{"name": "t", "gpus": 1}]}})",
           R"({"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"priority": "high", "tasks": [{"name": "t"}]}})",
           R"({"apiVersion": "gpufleet.io/v2", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"tasks": [{"name": "t"}]}})",
           R"({"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"tasks": [{"name": "t", "resources": {"gpus": {"count": 1.5}}}]}})",
           R"({"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": {"tasks": [{"name": "t", "command": )" +
               deep + "}]}}",
       }) {
    SCOPED_TRACE(text);
    const Result<Job> from_text = ParseJobSpec(text, catalog_);
    ASSERT_FALSE(from_text.ok());
    const std::string message = std::regex_replace(from_text.status().message(),
                                                   std::regex(R"( \(line \d+, column \d+\))"), "");
    EXPECT_THAT(JobSpecFromJson(nlohmann::json::parse(text), catalog_),
                StatusIs(StatusCode::kInvalidArgument, message));
  }
  EXPECT_THAT(JobSpecFromJson(nlohmann::json(), catalog_),
              StatusIs(StatusCode::kInvalidArgument, "spec is empty"));
  nlohmann::json wide = nlohmann::json::array();
  for (int i = 0; i < 100001; ++i) {
    wide.push_back(i);
  }
  EXPECT_THAT(JobSpecFromJson({{"spec", {{"tasks", wide}}}}, catalog_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("spec too complex")));
}

TEST_F(JobSpecTest, QuantitiesAndDurations) {
  EXPECT_EQ(*ParseCpuQuantity("500m"), 500);
  EXPECT_EQ(*ParseCpuQuantity("2"), 2000);
  EXPECT_EQ(*ParseCpuQuantity("0.5"), 500);
  EXPECT_EQ(*ParseCpuQuantity("1.25"), 1250);
  EXPECT_EQ(*ParseCpuQuantity("0.1000"), 100);
  EXPECT_EQ(*ParseCpuQuantity("32"), 32000);
  EXPECT_THAT(ParseCpuQuantity("0.0001"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"0.0001\" is too precise")));
  EXPECT_THAT(ParseCpuQuantity("0.5m"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseCpuQuantity("0"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseCpuQuantity("-1"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseCpuQuantity("2 cores"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseCpuQuantity("99999999999999999999"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("too large")));

  EXPECT_EQ(*ParseMemoryQuantity("1Gi"), 1024);
  EXPECT_EQ(*ParseMemoryQuantity("1G"), 954);  // 10^9 bytes = 953.67 MiB, rounded up
  EXPECT_EQ(*ParseMemoryQuantity("100Ki"), 1);
  EXPECT_EQ(*ParseMemoryQuantity("256Gi"), 256 * 1024);
  EXPECT_EQ(*ParseMemoryQuantity("1.5Gi"), 1536);
  EXPECT_EQ(*ParseMemoryQuantity("2Ti"), 2 * 1024 * 1024);
  EXPECT_EQ(*ParseMemoryQuantity("512Mi"), 512);
  EXPECT_EQ(*ParseMemoryQuantity("1048576"), 1);
  EXPECT_EQ(*ParseMemoryQuantity("1048577"), 2);
  EXPECT_EQ(*ParseMemoryQuantity("1M"), 1);
  EXPECT_EQ(*ParseMemoryQuantity("8Pi"), int64_t{8} << 30);
  EXPECT_THAT(ParseMemoryQuantity("12GB"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseMemoryQuantity("0Gi"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseMemoryQuantity("99999999999999999999Pi"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("too large")));
  EXPECT_THAT(ParseMemoryQuantity("9000000000000000000Ti"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("too large")));

  EXPECT_EQ(*ParseSpecDuration("90s"), std::chrono::seconds(90));
  EXPECT_EQ(*ParseSpecDuration("30m"), std::chrono::minutes(30));
  EXPECT_EQ(*ParseSpecDuration("2h"), std::chrono::hours(2));
  EXPECT_EQ(*ParseSpecDuration("1h30m"), std::chrono::minutes(90));
  EXPECT_EQ(*ParseSpecDuration("3600"), std::chrono::hours(1));
  EXPECT_EQ(*ParseSpecDuration("0"), Duration(0));
  EXPECT_EQ(*ParseSpecDuration("1500ms"), std::chrono::milliseconds(1500));
  EXPECT_THAT(ParseSpecDuration("1.5h"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"1.5h\" is not a duration")));
  EXPECT_THAT(ParseSpecDuration("-5m"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseSpecDuration("2d"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseSpecDuration(""), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseSpecDuration("3000000h"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("too long")));

  EXPECT_EQ(FormatCpuQuantity(2000), "2");
  EXPECT_EQ(FormatCpuQuantity(1500), "1500m");
  EXPECT_EQ(FormatMemoryQuantity(1024), "1Gi");
  EXPECT_EQ(FormatMemoryQuantity(1024 * 1024), "1Ti");
  EXPECT_EQ(FormatMemoryQuantity(1500), "1500Mi");
  EXPECT_EQ(FormatSpecDuration(std::chrono::minutes(90)), "1h30m");
  EXPECT_EQ(FormatSpecDuration(std::chrono::seconds(90)), "1m30s");
  EXPECT_EQ(FormatSpecDuration(Duration(0)), "0s");
  EXPECT_EQ(FormatSpecDuration(std::chrono::milliseconds(1500)), "1s500ms");
}

// A bad spec and a substring its error must contain.
struct BadSpec {
  const char* name;
  std::string text;
  std::string error;
};

std::string Header() {
  return "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata: {name: j}\n";
}
// A spec whose only task group has `resources`.
std::string WithResources(const std::string& resources) {
  return Header() + "spec:\n  tasks:\n    - name: t\n      resources: " + resources + "\n";
}
// A spec with one plain task group plus `extra` lines under spec.
std::string WithSpec(const std::string& extra) {
  std::string out = Header() + "spec:\n  tasks: [{name: t}]\n";
  std::istringstream lines(extra);
  for (std::string line; std::getline(lines, line);) {
    out += "  " + line + "\n";
  }
  return out;
}

// Issue 37: the job's minimum runtime before preemption, absent unless given.
TEST_F(JobSpecTest, PreemptionMinRuntimeRoundTrips) {
  Result<Job> job = ParseJobSpec(WithSpec("preemption: {minRuntime: 1h30m}\n"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->min_runtime, std::optional<Duration>(std::chrono::minutes(90)));
  const nlohmann::json json = JobSpecToJson(*job);
  EXPECT_EQ(json["spec"]["preemption"]["minRuntime"], "1h30m");
  const Result<Job> again = JobSpecFromJson(json, catalog_);
  ASSERT_OK(again);
  EXPECT_EQ(again->min_runtime, job->min_runtime);

  job = ParseJobSpec(WithSpec("preemption: {minRuntime: 0s}\n"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->min_runtime, std::optional<Duration>(Duration{0}));
  job = ParseJobSpec(WithSpec("priority: 1\n"), catalog_);
  ASSERT_OK(job);
  EXPECT_FALSE(job->min_runtime.has_value());
  EXPECT_FALSE(JobSpecToJson(*job)["spec"].contains("preemption"));
}

// Issue 37 item 4: a notice's grace and signal, the default signal written as nothing.
TEST_F(JobSpecTest, PreemptionNoticeRoundTrips) {
  Result<Job> job = ParseJobSpec(
      WithSpec("preemption: {checkpointGraceSeconds: 120, noticeSignal: USR2}\n"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->checkpoint_grace_seconds, 120);
  EXPECT_EQ(job->notice_signal, "SIGUSR2");
  const nlohmann::json json = JobSpecToJson(*job);
  EXPECT_EQ(json["spec"]["preemption"]["checkpointGraceSeconds"], 120);
  EXPECT_EQ(json["spec"]["preemption"]["noticeSignal"], "SIGUSR2");
  const Result<Job> again = JobSpecFromJson(json, catalog_);
  ASSERT_OK(again);
  EXPECT_EQ(again->checkpoint_grace_seconds, 120);
  EXPECT_EQ(again->notice_signal, "SIGUSR2");

  job = ParseJobSpec(WithSpec("preemption: {checkpointGraceSeconds: 30}\n"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->notice_signal, "SIGUSR1");
  EXPECT_FALSE(JobSpecToJson(*job)["spec"]["preemption"].contains("noticeSignal"));
  job = ParseJobSpec(WithSpec("priority: 1\n"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->checkpoint_grace_seconds, 0);
}

// Issue 37 item 6: an elastic group's range, written back as a range; bad bounds name the field
// and the value.
TEST_F(JobSpecTest, ElasticReplicasRoundTripAndBadBoundsAreNamed) {
  const auto with_replicas = [](const std::string& replicas, const std::string& more = "") {
    return Header() + "spec:\n  tasks:\n    - {name: w, replicas: " + replicas + "}\n" + more;
  };
  Result<Job> job = ParseJobSpec(with_replicas("{min: 2, max: 8}"), catalog_);
  ASSERT_OK(job);
  EXPECT_TRUE(job->IsElastic());
  EXPECT_EQ(job->groups[0].min_replicas, 2);
  EXPECT_EQ(job->groups[0].replicas, 8);
  EXPECT_EQ(job->AtSize(5).groups[0].replicas, 5);
  const nlohmann::json json = JobSpecToJson(*job);
  EXPECT_EQ(json["spec"]["tasks"][0]["replicas"], nlohmann::json({{"min", 2}, {"max", 8}}));
  const Result<Job> again = JobSpecFromJson(json, catalog_);
  ASSERT_OK(again);
  ExpectSameJob(*again, *job);
  job = ParseJobSpec(with_replicas("4"), catalog_);
  ASSERT_OK(job);
  EXPECT_FALSE(job->IsElastic());
  EXPECT_EQ(JobSpecToJson(*job)["spec"]["tasks"][0]["replicas"], 4);

  EXPECT_THAT(ParseJobSpec(with_replicas("{min: 9, max: 8}"), catalog_),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("spec.tasks[0].replicas.min: 9 is above max 8")));
  EXPECT_THAT(ParseJobSpec(with_replicas("{min: 0, max: 8}"), catalog_),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("spec.tasks[0].replicas.min: 0 (must be at least 1)")));
  EXPECT_THAT(ParseJobSpec(with_replicas("{min: 2, max: 2000000}"), catalog_),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("spec.tasks[0].replicas.max: 2000000 is too large")));
  EXPECT_THAT(ParseJobSpec(with_replicas("{max: 8}"), catalog_),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("spec.tasks[0].replicas.min: required field missing")));
  EXPECT_THAT(ParseJobSpec(with_replicas("{min: 2, max: 8, step: 2}"), catalog_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("spec.tasks[0].replicas.step")));
  EXPECT_THAT(
      ParseJobSpec(with_replicas("{min: 2, max: 8}", "    - {name: launcher}\n"), catalog_),
      StatusIs(StatusCode::kInvalidArgument,
               HasSubstr("spec.tasks[0].replicas: a range {min, max} needs a job of one task "
                         "group")));
}

TEST_F(JobSpecTest, IdenticalStackTrueOrAPinnedImageDigest) {
  const std::vector<std::string> defaults = {
      "gpufleet.io/driver-version", "gpufleet.io/cuda-version", "gpufleet.io/image-digest"};
  Result<Job> job = ParseJobSpec(WithSpec("identicalStack: true\n"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->identical_stack_labels, defaults);
  EXPECT_EQ(job->identical_image_digest, "");
  job = ParseJobSpec(WithSpec("identicalStack: false\n"), catalog_);
  ASSERT_OK(job);
  EXPECT_TRUE(job->identical_stack_labels.empty());

  const std::string digest = "sha256:" + std::string(64, 'c');
  job = ParseJobSpec(WithSpec("identicalStack: {imageDigest: \"" + digest + "\"}\n"), catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->identical_stack_labels, defaults);
  EXPECT_EQ(job->identical_image_digest, digest);
  job = ParseJobSpec(WithSpec("identicalStack: {labels: [a/b], imageDigest: \"" + digest + "\"}\n"),
                     catalog_);
  ASSERT_OK(job);
  EXPECT_EQ(job->identical_stack_labels,
            (std::vector<std::string>{"a/b", "gpufleet.io/image-digest"}));
  // Written back as it was read.
  const Result<Job> again = ParseJobSpec(JobSpecToJson(*job).dump(), catalog_);
  ASSERT_OK(again);
  EXPECT_EQ(again->identical_image_digest, digest);
  EXPECT_EQ(again->identical_stack_labels, job->identical_stack_labels);

  const Result<Job> bad =
      ParseJobSpec(WithSpec("identicalStack: {imageDigest: md5:x}\n"), catalog_);
  EXPECT_THAT(bad.status().message(), HasSubstr("spec.identicalStack.imageDigest:"));
  const Result<Job> word = ParseJobSpec(WithSpec("identicalStack: yes-please\n"), catalog_);
  EXPECT_THAT(word.status().message(), HasSubstr("spec.identicalStack: expected true or false"));
}

std::vector<BadSpec> BadSpecs() {
  return {
      {"UnknownFieldSuggests", WithResources("{gpu: {count: 1}}"),
       "spec.tasks[0].resources.gpu: unknown field (did you mean \"gpus\"?) (line 7, column 19)"},
      {"UnknownFieldListsKnown", WithSpec("flavour: x\n"),
       "spec.flavour: unknown field (known: kind, priority, preemptible"},
      {"UnknownTopLevelField", Header() + "specs: {}\n",
       "specs: unknown field (did you mean \"spec\"?)"},
      {"ReplicasNotInteger", Header() + "spec:\n  tasks:\n    - {name: t, replicas: \"two\"}\n",
       "spec.tasks[0].replicas: expected an integer, got string \"two\""},
      {"ReplicasQuotedNumber", Header() + "spec: {tasks: [{name: t, replicas: \"2\"}]}\n",
       "spec.tasks[0].replicas: expected an integer, got string \"2\""},
      {"ReplicasNegative", Header() + "spec: {tasks: [{name: t, replicas: -3}]}\n",
       "spec.tasks[0].replicas: -3 (must be at least 1)"},
      {"CountOverflows", WithResources("{gpus: {count: 99999999999999999999}}"),
       "spec.tasks[0].resources.gpus.count: 99999999999999999999 is too large (at most 1024)"},
      {"CountZero", WithResources("{gpus: {count: 0}}"),
       "spec.tasks[0].resources.gpus.count: 0 (must be at least 1)"},
      {"CpuZero", WithResources("{cpu: \"0\"}"),
       "spec.tasks[0].resources.cpu: \"0\" must be positive"},
      {"CpuNegative", WithResources("{cpu: -2}"),
       "spec.tasks[0].resources.cpu: \"-2\" must be positive"},
      {"CpuTooPrecise", WithResources("{cpu: \"0.0001\"}"),
       "spec.tasks[0].resources.cpu: \"0.0001\" is too precise"},
      {"CpuOverflows", WithResources("{cpu: 99999999999999999999}"),
       "spec.tasks[0].resources.cpu: \"99999999999999999999\" is too large"},
      {"MemoryUnknownUnit", WithResources("{memory: 12GB}"),
       "spec.tasks[0].resources.memory: \"12GB\" is not a memory quantity"},
      {"MemoryAsList", WithResources("{memory: [1]}"),
       "spec.tasks[0].resources.memory: expected a string or a number, got a list"},
      {"GpusEmpty", WithResources("{gpus: {}}"),
       "spec.tasks[0].resources.gpus: one of count, fraction, milli or migProfile is required"},
      {"FractionIsWhole", WithResources("{gpus: {fraction: 1.5}}"),
       "spec.tasks[0].resources.gpus.fraction: 1.5 (a share is 0.001..0.999"},
      {"FractionAndMilli", WithResources("{gpus: {fraction: 0.5, milli: 500}}"),
       "spec.tasks[0].resources.gpus: give fraction or milli, not both"},
      {"MilliTooLarge", WithResources("{gpus: {milli: 1000}}"),
       "spec.tasks[0].resources.gpus.milli: 1000 is too large (at most 999)"},
      {"FractionWithCount", WithResources("{gpus: {fraction: 0.5, count: 2}}"),
       "spec.tasks[0].resources.gpus.count: a fractional GPU is a share of one GPU"},
      {"MigWithMilli", WithResources("{gpus: {migProfile: 1g.10gb, milli: 5}}"),
       "spec.tasks[0].resources.gpus: migProfile cannot be combined with fraction or milli"},
      {"UnknownSharing", WithResources("{gpus: {fraction: 0.5, sharing: mig}}"),
       "spec.tasks[0].resources.gpus.sharing: \"mig\" is not a GPU sharing mode (time-slicing "
       "or mps)"},
      {"SharingOfWholeGpus", WithResources("{gpus: {count: 1, sharing: mps}}"),
       "spec.tasks[0].resources.gpus.sharing: only a fractional GPU (fraction or milli) is "
       "shared"},
      {"WholeGpusWithMemory", WithResources("{gpus: {count: 1, memory: 10Gi}}"),
       "spec.tasks[0].resources.gpus.memory: only a fractional GPU (fraction or milli) takes "
       "memory"},
      {"UnknownMigProfile",
       Header() + "spec:\n  gpuModels: [H100-80GB]\n  tasks:\n    - name: a\n    - name: b\n"
                  "      resources: {gpus: {migProfile: 3g.45gb}}\n",
       "spec.tasks[1].resources.gpus.migProfile: unknown profile \"3g.45gb\" for H100-80GB "
       "(valid: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"},
      {"UnknownGpuModel", WithSpec("gpuModels: [H100-80GB, H300]\n"),
       "spec.gpuModels[1]: unknown GPU model \"H300\" (known: "},
      {"DuplicateGpuModel", WithSpec("gpuModels: [T4, T4]\n"),
       "spec.gpuModels[1]: duplicate \"T4\""},
      {"MissingName", "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata: {queue: q}\nspec: {}\n",
       "metadata.name: required field missing (line 3, column 11)"},
      {"BadName", "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata: {name: Bert_Pretrain}\n",
       "metadata.name: \"Bert_Pretrain\" is not valid (lower-case letters, digits and '-'"},
      {"NameTooLong",
       "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata: {name: " + std::string(64, 'a') + "}\n",
       "metadata.name: \"aaaa"},
      {"BadQueue", "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata: {name: j, queue: a//b}\n",
       "metadata.queue: \"a//b\" is not valid"},
      {"BadLabelKey",
       "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata: {name: j, labels: {\"bad key\": x}}\n",
       "metadata.labels.\"bad key\": invalid key"},
      {"MissingTasks", Header() + "spec: {priority: 1}\n", "spec.tasks: required field missing"},
      {"EmptyTasks", Header() + "spec: {tasks: []}\n",
       "spec.tasks: at least one task group is required"},
      {"TasksAsMap", Header() + "spec: {tasks: {name: t}}\n",
       "spec.tasks: expected a list, got a map"},
      {"DuplicateTaskName", Header() + "spec: {tasks: [{name: t}, {name: t}]}\n",
       "spec.tasks[1].name: duplicate task group name \"t\""},
      {"WrongApiVersion", "apiVersion: gpufleet.io/v2\nkind: Job\n",
       "apiVersion: \"gpufleet.io/v2\" is not supported (expected \"gpufleet.io/v1\")"},
      {"WrongKind", "apiVersion: gpufleet.io/v1\nkind: Pod\n",
       "kind: \"Pod\" is not supported (expected \"Job\")"},
      {"MissingApiVersion", "kind: Job\n", "apiVersion: required field missing"},
      {"DuplicateKey", WithSpec("priority: 1\npriority: 2\n"),
       "spec.priority: duplicate key (line 7, column 3)"},
      {"BadJobKind", WithSpec("kind: training\n"),
       "spec.kind: \"training\" is not one of batch, interactive, inference"},
      {"PriorityOverflows", WithSpec("priority: 3000000000\n"),
       "spec.priority: 3000000000 is too large (at most 2147483647)"},
      {"PreemptibleNotBool", WithSpec("preemptible: yes\n"),
       "spec.preemptible: expected true or false, got \"yes\""},
      {"BadDuration", WithSpec("runtimeEstimate: 1.5h\n"),
       "spec.runtimeEstimate: \"1.5h\" is not a duration"},
      {"NegativeDuration", WithSpec("runtimeEstimate: -5m\n"),
       "spec.runtimeEstimate: \"-5m\" must be zero or positive"},
      {"BadMinRuntime", WithSpec("preemption: {minRuntime: ten}\n"),
       "spec.preemption.minRuntime: \"ten\" is not a duration"},
      {"NegativeMinRuntime", WithSpec("preemption: {minRuntime: -5m}\n"),
       "spec.preemption.minRuntime: \"-5m\" must be zero or positive"},
      {"NoticeSignalKill", WithSpec("preemption: {noticeSignal: SIGKILL}\n"),
       "spec.preemption.noticeSignal: \"SIGKILL\" is not a signal a task can take as its notice"},
      {"NoticeSignalStop", WithSpec("preemption: {noticeSignal: STOP}\n"),
       "spec.preemption.noticeSignal: \"STOP\" is not a signal"},
      {"NoticeSignalNumber", WithSpec("preemption: {noticeSignal: \"10\"}\n"),
       "spec.preemption.noticeSignal: \"10\" is not a signal"},
      {"CheckpointGraceTooLong", WithSpec("preemption: {checkpointGraceSeconds: 3601}\n"),
       "spec.preemption.checkpointGraceSeconds: 3601"},
      {"CheckpointGraceNegative", WithSpec("preemption: {checkpointGraceSeconds: -1}\n"),
       "spec.preemption.checkpointGraceSeconds: -1"},
      {"UnknownPreemptionField", WithSpec("preemption: {minRuntme: 5m}\n"),
       "spec.preemption.minRuntme"},
      {"NegativeMinGpuMemory", WithSpec("minGpuMemory: -1Gi\n"),
       "spec.minGpuMemory: \"-1Gi\" must be positive"},
      {"NodeSelectorValueList", WithSpec("nodeSelector: {zone: [a]}\n"),
       "spec.nodeSelector.zone: expected a string, got a list"},
      {"SpreadWithoutDomain", WithSpec("spread: {maxSkew: 2}\n"),
       "spec.spread.faultDomain: required field missing"},
      {"SpreadSkewZero", WithSpec("spread: {faultDomain: rack, maxSkew: 0}\n"),
       "spec.spread.maxSkew: 0 (must be at least 1)"},
      {"TopologyUnknownField", WithSpec("topology: {require: leaf}\n"),
       "spec.topology.require: unknown field (did you mean \"required\"?)"},
      {"IdenticalStackDuplicate", WithSpec("identicalStack: [a/b, a/b]\n"),
       "spec.identicalStack[1]: duplicate \"a/b\""},
      {"DocumentIsList", "- a\n- b\n", "document: expected a map, got a list"},
      {"EmptyDocument", "# nothing\n", "spec is empty"},
      {"YamlSyntax", "apiVersion: gpufleet.io/v1\nkind: [Job\n",
       "invalid YAML at line 3, column 1"},
      {"TwoDocuments", Header() + "---\napiVersion: gpufleet.io/v1\n",
       "more than one YAML document"},
      // yaml-cpp 0.7 loops on these unless the caller stops asking for documents.
      {"LoneComma", ",\n", "spec is empty"},
      {"CommaInSecondDocument", "a: 1\n---\n,\n", "more than one YAML document"},
      {"NonStringKey", "? [a]\n: b\n", "a map key must be a string"},
      {"JsonSyntax", "{\"apiVersion\": \"gpufleet.io/v1\",\n \"kind\": }",
       "invalid JSON: parse error at line 2, column 10"},
      {"JsonWrongType",
       R"({"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"tasks": [{"name": "t", "replicas": "two"}]}})",
       "spec.tasks[0].replicas: expected an integer, got string \"two\""},
      {"JsonCountOverflows",
       R"({"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"tasks": [{"name": "t", "resources": {"gpus": {"count": 99999999999999999999}}}]}})",
       "spec.tasks[0].resources.gpus.count: 99999999999999999999 is too large"},
      {"CommandNotAList", Header() + "spec:\n  tasks: [{name: t, command: python}]\n",
       "spec.tasks[0].command: expected a list of strings, got \"python\""},
      {"CommandEmptyProgram", Header() + "spec:\n  tasks: [{name: t, command: ['', x]}]\n",
       "spec.tasks[0].command[0]: the program name is empty"},
      {"CommandNestedList", Header() + "spec:\n  tasks: [{name: t, command: [[a]]}]\n",
       "spec.tasks[0].command[0]: expected a string"},
      {"EnvBadName", Header() + "spec:\n  tasks: [{name: t, env: {9LIVES: x}}]\n",
       "spec.tasks[0].env.9LIVES: invalid name"},
      {"EnvNotAMap", Header() + "spec:\n  tasks: [{name: t, env: [A]}]\n",
       "spec.tasks[0].env: expected a map"},
      {"ControlBytesInPlainScalar",
       Header() +
           std::string("spec:\n  tasks: [{name: t, command: [a], env: {A: WAR\x02\x00N}}]\n", 59),
       "spec.tasks[0].env.A"},
      {"EscapeMakesNulInCommand", Header() + "spec:\n  tasks: [{name: t, command: [\"a\\0b\"]}]\n",
       "spec.tasks[0].command[0]: contains a NUL character"},
      {"OnNodeFailureUnknown", WithSpec("onNodeFailure: retry"),
       "spec.onNodeFailure: \"retry\" is not one of requeue, fail"},
      {"ImageUpperCase", Header() + "spec:\n  tasks: [{name: t, image: Tiny:1}]\n",
       "spec.tasks[0].image: \"Tiny:1\": name component \"Tiny\" is not valid"},
      {"ImageLooksLikeAFlag", Header() + "spec:\n  tasks: [{name: t, image: --privileged}]\n",
       "spec.tasks[0].image: \"--privileged\": name component"},
      {"ImageBadDigest", Header() + "spec:\n  tasks: [{name: t, image: \"a@sha256:12\"}]\n",
       "spec.tasks[0].image: \"a@sha256:12\": digest"},
      {"ImageEmpty", Header() + "spec:\n  tasks: [{name: t, image: \"\"}]\n",
       "spec.tasks[0].image: \"\": an image reference cannot be empty"},
      {"ImageNotAString", Header() + "spec:\n  tasks: [{name: t, image: [a]}]\n",
       "spec.tasks[0].image: expected a string"},
      {"PullPolicyUnknown",
       Header() + "spec:\n  tasks: [{name: t, image: a, imagePullPolicy: always}]\n",
       "spec.tasks[0].imagePullPolicy: \"always\" is not one of IfNotPresent, Always, Never"},
      {"PullPolicyWithoutImage", Header() + "spec:\n  tasks: [{name: t, imagePullPolicy: Never}]\n",
       "spec.tasks[0].imagePullPolicy: applies to container tasks only"},
      {"HostNetworkWithoutImage", Header() + "spec:\n  tasks: [{name: t, hostNetwork: true}]\n",
       "spec.tasks[0].hostNetwork: applies to container tasks only"},
      {"ProvenanceNotAMap", WithSpec("provenance: [a]\n"),
       "spec.provenance: expected a map, got a list"},
      {"ProvenanceValueNotAString", WithSpec("provenance: {a: {b: c}}\n"),
       "spec.provenance.a: expected a string"},
      {"ProvenanceKeyWithControlBytes", WithSpec("provenance: {\"git\\x0e\": v}\n"),
       "spec.provenance.\"git\\x0e\": invalid key (an optional DNS prefix"},
      // Found by the fuzzer: a key of 400 raw control bytes was accepted, and the YAML written
      // back (each byte escaped as \x0e) was refused: YAML limits an implicit key to 1,024
      // characters.
      {"ProvenanceKeyOfControlBytes",
       WithSpec("provenance:\n  k" + std::string(400, '\x0e') + ": v\n"),
       "spec.provenance.\"k\\x0e\\x0e"},
      {"ProvenanceTooManyEntries",
       WithSpec("provenance: {" +
                [] {
                  std::string entries;
                  for (int i = 0; i < 65; ++i) {
                    entries += fmt::format("k{}: v, ", i);
                  }
                  return entries;
                }() +
                "}\n"),
       "spec.provenance: 65 entries, more than the limit of 64"},
      {"ProvenanceTooLarge", WithSpec("provenance: {a: " + std::string(17000, 'x') + "}\n"),
       "spec.provenance.a: keys and values exceed the limit of 16384 bytes"},
      {"JsonDuplicateKey", R"({"apiVersion": "gpufleet.io/v1", "apiVersion": "gpufleet.io/v1"})",
       "apiVersion: duplicate key"},
  };
}

void PrintTo(const BadSpec& spec, std::ostream* os) {
  *os << spec.name;
}

class BadSpecTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(BadSpecTest, FailsNamingFieldAndValue) {
  const Result<Job> job = ParseJobSpec(GetParam().text, GpuCatalog::Default());
  EXPECT_THAT(job, StatusIs(StatusCode::kInvalidArgument, HasSubstr(GetParam().error)))
      << GetParam().text;
}

INSTANTIATE_TEST_SUITE_P(JobSpec, BadSpecTest, ::testing::ValuesIn(BadSpecs()),
                         [](const ::testing::TestParamInfo<BadSpec>& param_info) {
                           return std::string(param_info.param.name);
                         });

}  // namespace
}  // namespace gpufleet::wire
