// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/slurm_history.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <streambuf>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/slurm.h"
#include "gpufleet/sim/replay.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

const std::string kSacctDataDir = GPUFLEET_TEST_DATA_DIR;
const std::string kShortHeader =
    "JobID|Submit|Start|End|State|Partition|Account|User|NNodes|AllocTRES\n";
const std::string kLongHeader =
    "JobID|JobIDRaw|Submit|Eligible|Start|End|Elapsed|Timelimit|State|ExitCode|NNodes|NodeList|"
    "ReqTRES|AllocTRES\n";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<SacctHistory> ReadSacctText(const std::string& text, GpuCatalog& catalog,
                                   const SacctOptions& options = {}) {
  std::istringstream in(text);
  return ReadSacctHistory(in, "sacct.txt", options, catalog);
}

const TraceJob* FindJob(const Trace& trace, std::string_view id) {
  for (const TraceJob& job : trace.jobs) {
    if (job.job.id.value() == id) {
      return &job;
    }
  }
  return nullptr;
}

int WholeGpusOf(const TaskGroup& group) {
  return std::get<WholeGpus>(group.request.gpus).count;
}

TEST(SacctHistory, ReplaysTheSiteFixtureAsItIs) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto history = LoadSacctHistory(kSacctDataDir + "/examples/sacct_slurm_site.txt", {}, catalog);
  ASSERT_OK(history);
  std::vector<std::string> ids;
  for (const TraceJob& job : history->trace.jobs) {
    ids.push_back(job.job.id.value());
  }
  // In arrival order (Eligible, else Submit); 107 became eligible at 10:00:02.
  EXPECT_THAT(ids, ElementsAre("101", "102", "103", "104", "107", "110_1", "110_2", "110_3", "120",
                               "131", "132", "133"));
  const SacctSkipCounts& skipped = history->skipped;
  EXPECT_EQ(skipped.steps, 2);                   // 101.0, 102.0
  EXPECT_EQ(skipped.batch_extern, 14);           // .batch, .extern and .interactive
  EXPECT_EQ(skipped.cpu_only, 1);                // 105
  EXPECT_EQ(skipped.cancelled_before_start, 1);  // 106
  EXPECT_EQ(skipped.not_ended, 2);               // 110_[4-5%2] pending, 134 running
  EXPECT_EQ(skipped.zero_length, 1);             // 130
  EXPECT_EQ(skipped.het_components_folded, 2);   // 120+1, 120+2
  EXPECT_EQ(skipped.array_tasks, 3);
  EXPECT_EQ(history->rows, 35);
  EXPECT_TRUE(history->unmapped_gpu_types.empty());

  const TraceJob* first = FindJob(history->trace, "101");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->submit_seconds, 0);
  EXPECT_EQ(first->duration_seconds, 7200);
  EXPECT_EQ(first->job.runtime_estimate, std::chrono::hours(4));  // Timelimit
  EXPECT_THAT(first->job.allowed_gpu_models, ElementsAre("A100-40GB"));
  EXPECT_EQ(first->job.queue.value(), "gpu");
  const TraceJob* gang = FindJob(history->trace, "102");
  ASSERT_NE(gang, nullptr);
  ASSERT_EQ(gang->job.groups.size(), 1U);
  EXPECT_EQ(gang->job.groups[0].replicas, 2);
  EXPECT_EQ(WholeGpusOf(gang->job.groups[0]), 4);
  EXPECT_EQ(gang->job.groups[0].request.host.cpu_milli, 32000);
  const TraceJob* late = FindJob(history->trace, "107");
  ASSERT_NE(late, nullptr);
  EXPECT_EQ(late->submit_seconds, 2 * 3600 + 2);  // Eligible, not Submit (09:10)
  const TraceJob* het = FindJob(history->trace, "120");
  ASSERT_NE(het, nullptr);
  ASSERT_EQ(het->job.groups.size(), 3U);  // one gang of three components
  EXPECT_EQ(WholeGpusOf(het->job.groups[0]), 4);
  EXPECT_EQ(WholeGpusOf(het->job.groups[1]), 2);
  EXPECT_TRUE(std::holds_alternative<NoGpu>(het->job.groups[2].request.gpus));
  const TraceJob* unlimited = FindJob(history->trace, "132");
  ASSERT_NE(unlimited, nullptr);
  EXPECT_EQ(unlimited->job.runtime_estimate, std::chrono::hours(2));  // UNLIMITED: its run time
  EXPECT_TRUE(unlimited->job.allowed_gpu_models.empty());             // untyped gres/gpu=2

  ASSERT_TRUE(history->nodes_named);
  std::vector<std::pair<std::string, size_t>> nodes;
  for (const SlurmNodeShape& node : history->nodes) {
    nodes.emplace_back(node.name, node.gpu_models.size());
  }
  // The most GPUs held at once on each node; gpu04 never had more than 3 busy.
  EXPECT_THAT(nodes, ElementsAre(Pair("cpu01", 0), Pair("gpu01", 4), Pair("gpu02", 4),
                                 Pair("gpu03", 4), Pair("gpu04", 3)));
  EXPECT_EQ(history->nodes[1].gpu_models[0], "A100-40GB");
  EXPECT_EQ(history->nodes[2].cpu_milli, 32000);
  EXPECT_EQ(history->nodes[2].memory_mib, 250 * 1024);
}

TEST(SacctHistory, EveryJobOfTheFixtureRunsOnTheInferredCluster) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto history = LoadSacctHistory(kSacctDataDir + "/examples/sacct_slurm_site.txt", {}, catalog);
  ASSERT_OK(history);
  auto cluster = BuildSlurmCluster(history->nodes, catalog);
  ASSERT_OK(cluster);
  auto result = RunReplay(*cluster, history->trace, catalog, ReplayOptions{});
  ASSERT_OK(result);
  EXPECT_EQ(result->jobs_finished, 12);
  EXPECT_EQ(result->jobs_unplaceable, 0);
  for (const ReplayJobOutcome& job : result->jobs) {
    const TraceJob* trace_job = FindJob(history->trace, job.id);
    ASSERT_NE(trace_job, nullptr);
    EXPECT_EQ(job.gpus * kMilliPerUnit, trace_job->job.RequestedGpuMilliTotal()) << job.id;
  }
}

TEST(SacctHistory, JobsThatCannotFitAreNeverWithTheirReason) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto history = ReadSacctText(kShortHeader +
                                   "1|2024-03-01T08:00:00|2024-03-01T08:00:05|2024-03-01T10:00:05|"
                                   "COMPLETED|gpu|ml|alice|1|cpu=8,gres/gpu:a100=4,mem=64G\n"
                                   "2|2024-03-01T08:00:00|2024-03-01T08:00:05|2024-03-01T10:00:05|"
                                   "COMPLETED|gpu|ml|alice|1|cpu=8,gres/gpu:v100=2,mem=64G\n",
                               catalog);
  ASSERT_OK(history);
  // A cluster of V100s only, as a site replaying on the wrong default would have.
  std::vector<SlurmNodeShape> shapes = {
      {"n1", std::vector<std::string>(4, "V100-16GB"), 16000, 128000}};
  auto cluster = BuildSlurmCluster(shapes, catalog);
  ASSERT_OK(cluster);
  auto result = RunReplay(*cluster, history->trace, catalog, ReplayOptions{});
  ASSERT_OK(result);
  EXPECT_EQ(result->jobs_finished, 1);
  EXPECT_EQ(result->jobs_unplaceable, 1);
  const auto never = std::find_if(result->jobs.begin(), result->jobs.end(),
                                  [](const ReplayJobOutcome& job) { return job.id == "1"; });
  ASSERT_NE(never, result->jobs.end());
  EXPECT_THAT(never->unplaceable_reason,
              HasSubstr("no node has 4 GPUs A100-40GB (most on one node: 0)"));

  // Enough GPUs of the model, but not the memory.
  shapes = {{"n1", {"A100-40GB", "A100-40GB", "A100-40GB", "A100-40GB"}, 16000, 1000},
            {"n2", {"V100-16GB", "V100-16GB"}, 16000, 128000}};
  cluster = BuildSlurmCluster(shapes, catalog);
  ASSERT_OK(cluster);
  result = RunReplay(*cluster, history->trace, catalog, ReplayOptions{});
  ASSERT_OK(result);
  EXPECT_EQ(result->jobs_unplaceable, 1);
  EXPECT_THAT(result->jobs[0].unplaceable_reason + result->jobs[1].unplaceable_reason,
              HasSubstr("no node with the GPUs has the CPUs and memory for one task (most: "
                        "16000 mCPU, 1000 MiB)"));
}

TEST(SacctHistory, GpuTypesMapByTheDefaultTableTheFlagAndTheCatalog) {
  GpuCatalog catalog = GpuCatalog::Default();
  const std::string times = "|2024-03-01T08:00:00|2024-03-01T08:00:05|2024-03-01T09:00:05|";
  SacctOptions options;
  auto flag = ParseGresMap("tesla=V100-32GB,a100=A100-80GB", catalog);
  ASSERT_OK(flag);
  options.gres_map = *flag;
  auto history =
      ReadSacctText(kShortHeader + "1" + times + "COMPLETED|p|a|u|1|gres/gpu:a100_80g=1\n" + "2" +
                        times + "COMPLETED|p|a|u|1|gres/gpu:tesla=1\n" + "3" + times +
                        "COMPLETED|p|a|u|1|gres/gpu:a100=1\n" + "4" + times +
                        "COMPLETED|p|a|u|1|gres/gpu:L40S=1\n" + "5" + times +
                        "COMPLETED|p|a|u|1|gres/gpu:mi250=2\n" + "6" + times +
                        "COMPLETED|p|a|u|1|gres/gpu:mi250=1\n",
                    catalog, options);
  ASSERT_OK(history);
  std::vector<std::string> models;
  for (const TraceJob& job : history->trace.jobs) {
    ASSERT_EQ(job.job.allowed_gpu_models.size(), 1U);
    models.push_back(job.job.allowed_gpu_models[0]);
  }
  EXPECT_THAT(models, ElementsAre("A100-80GB", "V100-32GB", "A100-80GB", "L40S", "mi250", "mi250"));
  // Unmapped: a warning's worth of data, never silent; the type became a model of its own.
  EXPECT_THAT(history->unmapped_gpu_types, ElementsAre(Pair("mi250", 2)));
  EXPECT_TRUE(catalog.Contains("mi250"));

  EXPECT_THAT(ParseGresMap("a100", catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"a100\" is not TYPE=MODEL")));
  EXPECT_THAT(ParseGresMap("a100=X200", catalog),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("--gres-map: \"a100=X200\": unknown GPU model \"X200\"")));
  EXPECT_EQ(DefaultGresTypeModels().at("h100"), "H100-80GB");
}

TEST(SacctHistory, NodeListHostlistsNameTheNodes) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto history = ReadSacctText(
      kLongHeader +
          "7|7|2024-03-01T08:00:00|Unknown|2024-03-01T08:00:05|2024-03-01T09:00:05|01:00:00|"
          "02:00:00|COMPLETED|0:0|5|gpu[01-04,07]||cpu=40,gres/gpu:h100=40,mem=1000G\n",
      catalog);
  ASSERT_OK(history);
  std::vector<std::string> names;
  for (const SlurmNodeShape& node : history->nodes) {
    names.push_back(node.name);
    EXPECT_EQ(node.gpu_models.size(), 8U);
    EXPECT_EQ(node.cpu_milli, 8000);
  }
  EXPECT_THAT(names, ElementsAre("gpu01", "gpu02", "gpu03", "gpu04", "gpu07"));
  EXPECT_EQ(history->trace.jobs[0].job.runtime_estimate, std::chrono::hours(2));

  EXPECT_THAT(ReadSacctText(kLongHeader +
                                "7|7|2024-03-01T08:00:00|Unknown|2024-03-01T08:00:05|"
                                "2024-03-01T09:00:05|01:00:00|02:00:00|COMPLETED|0:0|2|gpu[01-03]||"
                                "gres/gpu=2\n",
                            catalog),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("sacct.txt:2: column \"NodeList\": \"gpu[01-03]\" names 3 "
                                 "nodes, NNodes is 2")));
}

TEST(SacctHistory, WithoutNodeListNodesAreSizedFromTheAllocations) {
  GpuCatalog catalog = GpuCatalog::Default();
  const std::string day = "2024-03-01T";
  // Two 8-GPU jobs at once on one node each, and a 4-GPU job later: 2 nodes of 8.
  auto history = ReadSacctText(kShortHeader + "1|" + day + "08:00:00|" + day + "08:00:00|" + day +
                                   "09:00:00|COMPLETED|p|a|u|1|cpu=32,gres/gpu=8,mem=256G\n" +
                                   "2|" + day + "08:00:00|" + day + "08:30:00|" + day +
                                   "09:30:00|COMPLETED|p|a|u|1|cpu=16,gres/gpu=8,mem=128G\n" +
                                   "3|" + day + "10:00:00|" + day + "10:00:00|" + day +
                                   "11:00:00|COMPLETED|p|a|u|1|cpu=32,gres/gpu=4,mem=64G\n",
                               catalog);
  ASSERT_OK(history);
  EXPECT_FALSE(history->nodes_named);
  ASSERT_EQ(history->nodes.size(), 2U);
  EXPECT_EQ(history->nodes[0].name, "h100-80gb-001");
  EXPECT_EQ(history->nodes[0].gpu_models.size(), 8U);
  EXPECT_EQ(history->nodes[0].gpu_models[0], "H100-80GB");  // SacctOptions::untyped_gpu_model
  // Job 3 wants 8 CPUs per GPU: 64 on a full node.
  EXPECT_EQ(history->nodes[0].cpu_milli, 64000);
  EXPECT_EQ(history->nodes[0].memory_mib, 256 * 1024);
}

struct BadSacct {
  std::string text;
  std::string expected;
};

TEST(SacctHistory, BadInputNamesTheLineAndTheField) {
  const std::string times = "2024-03-01T08:00:00|2024-03-01T08:00:05|2024-03-01T09:00:05";
  const std::string long_row =
      "9|9|2024-03-01T08:00:00|2024-03-01T08:00:00|2024-03-01T08:00:05|2024-03-01T09:00:05|"
      "01:00:00|";
  const std::vector<BadSacct> cases = {
      // A truncated last line, as from a copy cut short.
      {kShortHeader + "1|" + times + "|COMPLETED|p|a|u|1|gres/gpu=1\n2|" + times + "|COMPLE",
       "sacct.txt:3: 5 fields, expected 10"},
      {"JobID|Submit|Start|End|State|Partition|Account|User|AllocTRES\n",
       "sacct.txt:1: missing column \"NNodes\""},
      {kShortHeader + "1|" + times + "|EXPLODED|p|a|u|1|gres/gpu=1\n",
       "sacct.txt:2: column \"State\": unknown job state \"EXPLODED\""},
      {kShortHeader +
           "1|2024-03-01T08:00:00|2024-03-01T07:59:00|2024-03-01T09:00:00|COMPLETED|p|a|u|1|"
           "gres/gpu=1\n",
       "sacct.txt:2: column \"Start\": \"2024-03-01T07:59:00\" is before Submit "
       "\"2024-03-01T08:00:00\""},
      {kShortHeader +
           "1|2024-03-01T08:00:00|2024-03-01T09:00:00|2024-03-01T08:59:00|COMPLETED|p|a|u|1|"
           "gres/gpu=1\n",
       "sacct.txt:2: column \"End\": \"2024-03-01T08:59:00\" is before Start"},
      {kShortHeader + "1|" + times + "|COMPLETED|p|a|u|1|gres/gpu=1\n1|" + times +
           "|COMPLETED|p|a|u|1|gres/gpu=1\n",
       "sacct.txt:3: column \"JobID\": duplicate job id \"1\""},
      {kLongHeader + long_row + "forever|COMPLETED|0:0|1|n1||gres/gpu=1\n",
       "sacct.txt:2: column \"Timelimit\": \"forever\" is not a time limit"},
      {kLongHeader + long_row + "01:00:00|FAILED|x:1|1|n1||gres/gpu=1\n",
       "sacct.txt:2: column \"ExitCode\": \"x:1\" is not an exit code N:SIGNAL"},
      {kLongHeader + long_row + "01:00:00|FAILED|1:0|1|n[1-||gres/gpu=1\n",
       "sacct.txt:2: column \"NodeList\": "},
      {kLongHeader + "9|9|2024-03-01T08:00:00|2024-03-01 08:00:00|2024-03-01T08:00:05|"
                     "2024-03-01T09:00:05|01:00:00|01:00:00|FAILED|1:0|1|n1||gres/gpu=1\n",
       "sacct.txt:2: column \"Eligible\": \"2024-03-01 08:00:00\" is not a time"},
      {"", "sacct.txt:1: empty file"},
      {kShortHeader + "1|2024-03-01T08:00:00|None|None|CANCELLED by 1000|p|a|u|1|\n",
       "sacct.txt:2: no jobs in the file to replay (1 rows; skipped: 1 cancelled before start)"},
  };
  for (const BadSacct& c : cases) {
    SCOPED_TRACE(c.text);
    GpuCatalog catalog = GpuCatalog::Default();
    EXPECT_THAT(ReadSacctText(c.text, catalog),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.expected)));
  }
}

TEST(SacctReader, ReadsStatesExitCodesAndFoldsHetJobs) {
  GpuCatalog catalog = GpuCatalog::Default();
  std::istringstream in(
      kLongHeader +
      "5+0|5|2024-03-01T08:00:00|Unknown|2024-03-01T08:00:05|2024-03-01T09:00:05|01:00:00|"
      "1-00:00:00|NODE_FAIL|0:0|1|n1||gres/gpu=2\n"
      "5+0.batch|5.batch|2024-03-01T08:00:05|2024-03-01T08:00:05|2024-03-01T08:00:05|"
      "2024-03-01T09:00:05|01:00:00||CANCELLED|0:9|1|n1||gres/gpu=2\n"
      "5+1|6|2024-03-01T08:00:00|Unknown|2024-03-01T08:00:05|2024-03-01T09:00:05|01:00:00|"
      "1-00:00:00|NODE_FAIL|0:0|2|n[2-3]||gres/gpu=4\n"
      "8|8|2024-03-01T08:00:00|Unknown|2024-03-01T08:00:05|2024-03-01T09:00:05|01:00:00|"
      "30:00|FAILED|3:0|1|n1||gres/gpu=1\n");
  SacctReader reader(in, "sacct.txt", {}, catalog);
  ASSERT_OK(reader.Open());
  auto het = reader.Next();
  ASSERT_OK(het);
  ASSERT_TRUE(het->has_value());
  EXPECT_EQ((*het)->id, "5");
  EXPECT_EQ((*het)->state, "NODE_FAIL");
  EXPECT_EQ((*het)->time_limit_seconds, 86400);
  ASSERT_EQ((*het)->components.size(), 2U);
  EXPECT_THAT((*het)->components[1].node_names, ElementsAre("n2", "n3"));
  EXPECT_EQ((*het)->Gpus(), 6);
  auto failed = reader.Next();
  ASSERT_OK(failed);
  ASSERT_TRUE(failed->has_value());
  EXPECT_EQ((*failed)->state, "FAILED");
  EXPECT_TRUE((*failed)->has_exit_code);
  EXPECT_EQ((*failed)->exit_code, 3);
  EXPECT_EQ((*failed)->time_limit_seconds, 1800);
  auto end = reader.Next();
  ASSERT_OK(end);
  EXPECT_FALSE(end->has_value());
  EXPECT_EQ(reader.skipped().het_components_folded, 1);
  EXPECT_EQ(reader.skipped().batch_extern, 1);
}

TEST(ScontrolNodes, ReadsCpusMemoryAndTypedGres) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto nodes = ParseScontrolNodes(ReadFile(kSacctDataDir + "/examples/scontrol_nodes_site.txt"),
                                  "nodes.txt", {}, catalog);
  ASSERT_OK(nodes);
  ASSERT_EQ(nodes->size(), 5U);
  EXPECT_EQ((*nodes)[0].name, "cpu01");
  EXPECT_TRUE((*nodes)[0].gpu_models.empty());
  EXPECT_EQ((*nodes)[0].cpu_milli, 32000);
  EXPECT_EQ((*nodes)[1].name, "gpu01");
  EXPECT_EQ((*nodes)[1].gpu_models, std::vector<std::string>(4, "A100-40GB"));
  EXPECT_EQ((*nodes)[1].memory_mib, 512000);

  auto mixed = ParseScontrolNodes(
      "NodeName=m1 CPUTot=8 RealMemory=1000\n   Gres=gpu:a100:1(S:0),"
      "gpu:t4:2(S:1),nic:1,gpu:3\n",
      "nodes.txt", {}, catalog);
  ASSERT_OK(mixed);
  EXPECT_THAT((*mixed)[0].gpu_models,
              ElementsAre("A100-40GB", "T4", "T4", "H100-80GB", "H100-80GB", "H100-80GB"));
  EXPECT_THAT(ParseScontrolNodes("NodeName=m1 Gres=gpu:a100:lots\n", "nodes.txt", {}, catalog),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("nodes.txt:1: Gres: \"gpu:a100:lots\" is not")));
  EXPECT_THAT(ParseScontrolNodes("NodeName=m1 CPUTot=many\n", "nodes.txt", {}, catalog),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("nodes.txt:1: CPUTot: \"many\" is not a number")));
  EXPECT_THAT(ParseScontrolNodes("no nodes here\n", "nodes.txt", {}, catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("no NodeName= records")));
}

TEST(ScontrolNodes, TopologyConfNodesTakeTheirGpusFromTheNodes) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto spec = fabric::ImportSlurmTopology(ReadFile(kSacctDataDir + "/examples/topology_site.conf"),
                                          "topology_site.conf");
  ASSERT_OK(spec);
  std::vector<SlurmNodeShape> shapes = {
      {"gpu01", std::vector<std::string>(4, "A100-40GB"), 64000, 512000},
      {"gpu02", std::vector<std::string>(2, "T4"), 32000, 256000},
      {"gpu09", std::vector<std::string>(1, "T4"), 8000, 1000}};
  auto mismatch = ApplySlurmNodeShapes(*spec, shapes);
  ASSERT_OK(mismatch);
  EXPECT_THAT(mismatch->not_in_nodes, ElementsAre("gpu03", "gpu04", "cpu01"));
  EXPECT_THAT(mismatch->not_in_file, ElementsAre("gpu09"));
  auto built = fabric::Fabric::Build(*spec);
  ASSERT_OK(built);
  auto cluster = fabric::BuildCluster(*built, catalog);
  ASSERT_OK(cluster);
  std::vector<std::pair<std::string, size_t>> gpus;
  for (const Node& node : cluster->nodes) {
    gpus.emplace_back(node.id.value(), node.gpus.size());
  }
  // Not 8 x H100 each: the nodes' own GPUs; nodes without any are left out.
  EXPECT_THAT(gpus, ElementsAre(Pair("gpu01", 4), Pair("gpu02", 2), Pair("gpu09", 1)));
  EXPECT_EQ(cluster->nodes[1].gpus[0].model, "T4");
}

// Generates `rows` lines of sacct output on the fly: a GPU job with its .batch and .extern steps
// every third line, so nothing but the reader could hold the text.
class GeneratedSacct : public std::streambuf {
 public:
  explicit GeneratedSacct(int64_t jobs) : jobs_(jobs) {
    line_ = kLongHeader;
    Reset();
  }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) {
      return traits_type::to_int_type(*gptr());
    }
    if (next_ >= jobs_ * 3) {
      return traits_type::eof();
    }
    const int64_t job = next_ / 3;
    const int64_t kind = next_ % 3;
    ++next_;
    const int64_t start = job;  // one second apart
    const std::string id = kind == 0   ? std::to_string(job)
                           : kind == 1 ? fmt::format("{}.batch", job)
                                       : fmt::format("{}.extern", job);
    line_ = fmt::format(
        "{}|{}|2024-01-01T00:00:00|2024-01-01T00:00:00|2024-{:02}-{:02}T{:02}:{:02}:{:02}|"
        "2024-{:02}-{:02}T{:02}:{:02}:{:02}|01:00:00|02:00:00|COMPLETED|0:0|1|gpu{:04}|"
        "cpu=8,gres/gpu=2,mem=64G|billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64G,node=1\n",
        id, id, 1 + start / (86400 * 28) % 12, 1 + start / 86400 % 28, start / 3600 % 23,
        start / 60 % 60, start % 60, 1 + start / (86400 * 28) % 12, 1 + start / 86400 % 28,
        start / 3600 % 23 + 1, start / 60 % 60, start % 60, job % 1000);
    bytes_ += static_cast<int64_t>(line_.size());
    Reset();
    return traits_type::to_int_type(*gptr());
  }

 public:
  int64_t bytes() const { return bytes_; }

 private:
  void Reset() { setg(line_.data(), line_.data(), line_.data() + line_.size()); }

  int64_t jobs_;
  int64_t next_ = 0;
  int64_t bytes_ = 0;
  std::string line_;
};

// Reads the generated stream through, keeping nothing; returns the bytes it was.
int64_t StreamThrough(int64_t jobs, SacctSkipCounts& skipped, int64_t& read_jobs) {
  GeneratedSacct source(jobs);
  std::istream in(&source);
  GpuCatalog catalog = GpuCatalog::Default();
  SacctReader reader(in, "generated", {}, catalog);
  EXPECT_OK(reader.Open());
  read_jobs = 0;
  while (true) {
    auto job = reader.Next();
    EXPECT_OK(job);
    if (!job.ok() || !job->has_value()) {
      break;
    }
    ++read_jobs;
  }
  skipped = reader.skipped();
  return source.bytes();
}

TEST(SacctReader, StreamsAGeneratedHistory) {
  SacctSkipCounts skipped;
  int64_t jobs = 0;
  const int64_t bytes = StreamThrough(20'000, skipped, jobs);
  EXPECT_GT(bytes, 10'000'000);
  EXPECT_EQ(jobs, 20'000);
  EXPECT_EQ(skipped.batch_extern, 40'000);
}

int64_t MaxRssKib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// Label slow: a gigabyte of sacct output read through in bounded memory.
TEST(SacctReaderSlow, StreamsAGigabyteWithoutHoldingIt) {
  const int64_t before = MaxRssKib();
  SacctSkipCounts skipped;
  int64_t jobs = 0;
  const int64_t bytes = StreamThrough(2'000'000, skipped, jobs);
  EXPECT_GT(bytes, int64_t{1} << 30);
  EXPECT_EQ(jobs, 2'000'000);
  // The file is a gigabyte; the reader may grow the process by a few megabytes at most.
  EXPECT_LT(MaxRssKib() - before, 64 * 1024);
}

}  // namespace
}  // namespace gpufleet::sim
