// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/trace_loaders.h"

#include <sstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kTraceDataDir = GPUFLEET_TEST_DATA_DIR;

using Reader = Result<Trace> (*)(std::istream&, const std::string&, const GpuCatalog&);

Result<Trace> ReadText(Reader reader, const std::string& text, const std::string& source) {
  std::istringstream in(text);
  return reader(in, source, GpuCatalog::Default());
}

// ReadSacct on a copy of the catalog, which gains the GPU types it does not know.
Result<Trace> ReadSacctCopyingCatalog(std::istream& in, const std::string& source,
                                      const GpuCatalog& catalog) {
  GpuCatalog copy = catalog;
  return ReadSacct(in, source, copy);
}

int Gpus(const TraceJob& job) {
  return static_cast<int>(job.job.RequestedGpuMilliTotal() / kMilliPerUnit);
}

WholeGpus Whole(const TraceJob& job) {
  return std::get<WholeGpus>(job.job.groups[0].request.gpus);
}

TEST(SplitGpus, LargestDivisorUpToEightGpusPerTask) {
  struct Case {
    int gpus;
    int tasks;
    int gpus_per_task;
  };
  const Case cases[] = {{1, 1, 1},  {4, 1, 4},   {8, 1, 8},  {12, 2, 6},   {16, 2, 8},
                        {24, 3, 8}, {11, 11, 1}, {64, 8, 8}, {128, 16, 8}, {7, 1, 7}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.gpus);
    const TaskSplit split = SplitGpus(c.gpus);
    EXPECT_EQ(split.tasks, c.tasks);
    EXPECT_EQ(split.gpus_per_task, c.gpus_per_task);
  }
}

TEST(Philly, LoadsTheBundledJobList) {
  auto trace = LoadPhilly(kTraceDataDir + "/philly/philly.csv", GpuCatalog::Default());
  ASSERT_OK(trace);
  ASSERT_EQ(trace->jobs.size(), 82247U);
  // The earliest row: "2017-09-04 10:30:41,2240194.0,8,17921552.0,7f04ca" (file line 31,568).
  const TraceJob& first = trace->jobs.front();
  EXPECT_EQ(first.submit_seconds, 0);
  EXPECT_EQ(first.duration_seconds, 2240194);
  EXPECT_EQ(first.job.runtime_estimate, std::chrono::seconds(2240194));
  EXPECT_EQ(first.job.queue.value(), "7f04ca");
  EXPECT_EQ(first.job.groups[0].replicas, 1);
  EXPECT_EQ(Whole(first).count, 8);
  int sixteen = 0;
  for (size_t i = 0; i < trace->jobs.size(); ++i) {
    const TraceJob& job = trace->jobs[i];
    ASSERT_TRUE(i == 0 || trace->jobs[i - 1].submit_seconds <= job.submit_seconds);
    if (Gpus(job) == 16) {
      ++sixteen;
      EXPECT_EQ(job.job.groups[0].replicas, 2);
      EXPECT_EQ(Whole(job).count, 8);
    }
  }
  EXPECT_EQ(sixteen, 199);
}

TEST(Philly, TimestampsAreUtcCalendarSeconds) {
  const std::string header = "timestamp,duration,num_gpus,gpu_time,cluster\n";
  auto trace = ReadText(ReadPhilly,
                        header +
                            "2016-03-01 00:00:00,10.4,12,1,vc\n"
                            "2016-02-28 23:59:59,1.5,1,1,vc\n"
                            "2017-01-01 00:00:00,60.0,1,1,\n",
                        "philly.csv");
  ASSERT_OK(trace);
  ASSERT_EQ(trace->jobs.size(), 3U);
  EXPECT_EQ(trace->jobs[0].submit_seconds, 0);
  EXPECT_EQ(trace->jobs[0].duration_seconds, 2);    // 1.5 rounds to 2
  EXPECT_EQ(trace->jobs[1].submit_seconds, 86401);  // 2016 is a leap year
  EXPECT_EQ(trace->jobs[1].duration_seconds, 10);
  EXPECT_EQ(trace->jobs[1].job.groups[0].replicas, 2);  // 12 GPUs: 2 x 6
  EXPECT_EQ(Whole(trace->jobs[1]).count, 6);
  EXPECT_EQ(trace->jobs[2].submit_seconds, 86401 + 306 * 86400);
  EXPECT_EQ(trace->jobs[2].job.queue.value(), "default");
  EXPECT_EQ(trace->jobs[1].job.id.value(), "philly-1");
}

TEST(Gavel, LoadsTheBundledTraces) {
  auto small = LoadGavel(kTraceDataDir + "/gavel/23dbec.trace", GpuCatalog::Default());
  ASSERT_OK(small);
  ASSERT_EQ(small->jobs.size(), 9U);
  // "Transformer (batch size 128) ... 14612 0.000000 1": 14612 / 5.771204 steps/s = 2532 s.
  const TraceJob& first = small->jobs.front();
  EXPECT_EQ(first.job.id.value(), "23dbec-1");
  EXPECT_EQ(first.job.queue.value(), "23dbec");
  EXPECT_EQ(first.submit_seconds, 0);
  EXPECT_EQ(first.duration_seconds, 2532);
  EXPECT_EQ(Gpus(first), 1);
  // "ResNet-18 (batch size 32) ... 775977 182117.000000 8" is one task of 8 GPUs.
  const TraceJob& fourth = small->jobs[3];
  EXPECT_EQ(fourth.submit_seconds, 182117);
  EXPECT_EQ(fourth.duration_seconds, 11792);
  EXPECT_EQ(Whole(fourth).count, 8);

  auto vc = LoadGavel(kTraceDataDir + "/gavel/51b7ef.trace", GpuCatalog::Default());
  ASSERT_OK(vc);
  EXPECT_EQ(vc->jobs.size(), 18U);
  auto large = LoadGavel(kTraceDataDir + "/gavel/2869ce.trace", GpuCatalog::Default());
  ASSERT_OK(large);
  EXPECT_EQ(large->jobs.size(), 533U);
}

TEST(Gavel, DurationIsStepsOverTheJobTypeRate) {
  EXPECT_DOUBLE_EQ(GavelStepsPerSecond("Transformer (batch size 256)").value(), 1.707021);
  EXPECT_FALSE(GavelStepsPerSecond("GPT-5").has_value());
}

TEST(Pollux, LoadsTheBundledWorkloads) {
  auto trace = LoadPollux(kTraceDataDir + "/pollux/workload-1.csv", GpuCatalog::Default());
  ASSERT_OK(trace);
  ASSERT_EQ(trace->jobs.size(), 160U);
  // "cifar10-0,107,cifar10,6,2048": the first job, rebased to 0.
  const TraceJob& first = trace->jobs[0];
  EXPECT_EQ(first.job.id.value(), "cifar10-0");
  EXPECT_EQ(first.submit_seconds, 0);
  EXPECT_EQ(first.duration_seconds, 854);
  EXPECT_EQ(Whole(first).count, 6);
  // "deepspeech2-3,262,deepspeech2,12,640": 12 replicas are 2 tasks of 6 GPUs.
  const TraceJob& fourth = trace->jobs[3];
  EXPECT_EQ(fourth.job.id.value(), "deepspeech2-3");
  EXPECT_EQ(fourth.submit_seconds, 155);
  EXPECT_EQ(fourth.duration_seconds, 2573);
  EXPECT_EQ(fourth.job.groups[0].replicas, 2);
  EXPECT_EQ(Whole(fourth).count, 6);
  for (int i = 2; i <= 8; ++i) {
    SCOPED_TRACE(i);
    auto other = LoadPollux(fmt::format("{}/pollux/workload-{}.csv", kTraceDataDir, i),
                            GpuCatalog::Default());
    ASSERT_OK(other);
    EXPECT_EQ(other->jobs.size(), 160U);
  }
}

TEST(Native, LoadsTheExample) {
  auto trace = LoadNative(kTraceDataDir + "/examples/native_example.csv", GpuCatalog::Default());
  ASSERT_OK(trace);
  std::vector<std::string> ids;
  for (const TraceJob& job : trace->jobs) {
    ids.push_back(job.job.id.value());
  }
  // Sorted by submit time; serve-llm and sweep-7 (both at 60 s) keep file order.
  EXPECT_THAT(
      ids, ElementsAre("train-bert", "notebook-1", "serve-llm", "sweep-7", "finetune", "etl-cpu"));
  const TraceJob& train = trace->jobs[0];
  EXPECT_EQ(train.duration_seconds, 7200);
  EXPECT_EQ(train.job.groups[0].replicas, 2);
  EXPECT_EQ(Whole(train).count, 8);
  EXPECT_THAT(train.job.allowed_gpu_models, ElementsAre("H100-80GB", "A100-80GB"));
  EXPECT_EQ(train.job.queue.value(), "research");
  EXPECT_EQ(train.job.priority, 10);
  EXPECT_EQ(train.user, "alice");
  const TraceJob& notebook = trace->jobs[1];
  EXPECT_EQ(notebook.job.kind, JobKind::kInteractive);
  EXPECT_EQ(std::get<FractionalGpu>(notebook.job.groups[0].request.gpus).gpu_milli, 500);
  EXPECT_EQ(trace->jobs[2].job.kind, JobKind::kInference);
  const TraceJob& finetune = trace->jobs[4];
  EXPECT_EQ(finetune.submit_seconds, 91);  // 90.5 rounds to 91
  EXPECT_EQ(finetune.duration_seconds, 5400);
  EXPECT_THAT(finetune.job.allowed_gpu_models, ElementsAre("A100-40GB"));  // alias merged
  const TraceJob& etl = trace->jobs[5];
  EXPECT_TRUE(std::holds_alternative<NoGpu>(etl.job.groups[0].request.gpus));
  EXPECT_EQ(etl.job.priority, -5);
  EXPECT_EQ(etl.job.queue.value(), "default");
}

TEST(Native, OptionalCommunicationFractionPerJob) {
  const std::string header =
      "id,submit_time,duration,tasks,gpus_per_task,gpu_milli,allowed_models,queue,priority,kind,"
      "user,communication_fraction\n";
  auto trace = ReadText(ReadNative,
                        header +
                            "a,0,60,2,8,1000,,q,0,batch,u,0.45\n"
                            "b,0,60,2,8,1000,,q,0,batch,u,\n",
                        "jobs.csv");
  ASSERT_OK(trace);
  EXPECT_DOUBLE_EQ(trace->jobs[0].communication_fraction, 0.45);
  EXPECT_LT(trace->jobs[1].communication_fraction, 0);
  EXPECT_THAT(ReadText(ReadNative, header + "a,0,60,2,8,1000,,q,0,batch,u,1.5\n", "jobs.csv"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("column \"communication_fraction\": \"1.5\" is not a fraction")));
}

TEST(Native, WithoutIdColumnNumbersTheRows) {
  auto trace = ReadText(ReadNative,
                        "submit_time,duration,tasks,gpus_per_task,gpu_milli,allowed_models,queue,"
                        "priority,kind,user\n"
                        "100,60,1,1,1000,,,,,\n"
                        "50,60,1,2,1000,,,,,\n",
                        "jobs.csv");
  ASSERT_OK(trace);
  ASSERT_EQ(trace->jobs.size(), 2U);
  EXPECT_EQ(trace->jobs[0].job.id.value(), "job-2");
  EXPECT_EQ(trace->jobs[1].job.id.value(), "job-1");
  EXPECT_EQ(trace->jobs[1].submit_seconds, 50);
  EXPECT_EQ(trace->jobs[0].job.kind, JobKind::kBatch);
}

TEST(Sacct, LoadsTheExample) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto trace = LoadSacct(kTraceDataDir + "/examples/sacct_example.txt", catalog);
  ASSERT_OK(trace);
  std::vector<std::string> ids;
  for (const TraceJob& job : trace->jobs) {
    ids.push_back(job.job.id.value());
  }
  // Steps, the job cancelled while pending, the running, pending and CPU-only jobs are skipped.
  EXPECT_THAT(ids, ElementsAre("1001", "1002", "1004", "1008_1"));
  const TraceJob& first = trace->jobs[0];
  EXPECT_EQ(first.submit_seconds, 0);
  EXPECT_EQ(first.duration_seconds, 7200);
  EXPECT_EQ(Whole(first).count, 4);
  EXPECT_THAT(first.job.allowed_gpu_models, ElementsAre("A100-40GB"));
  EXPECT_EQ(first.job.groups[0].request.host.cpu_milli, 8000);
  EXPECT_EQ(first.job.groups[0].request.host.memory_mib, 65536);
  EXPECT_EQ(first.job.queue.value(), "gpu");
  EXPECT_EQ(first.user, "alice");
  const TraceJob& two_nodes = trace->jobs[1];
  EXPECT_EQ(two_nodes.submit_seconds, 300);
  EXPECT_EQ(two_nodes.duration_seconds, 12 * 3600);
  EXPECT_EQ(two_nodes.job.groups[0].replicas, 2);
  EXPECT_EQ(Whole(two_nodes).count, 8);
  EXPECT_EQ(two_nodes.job.groups[0].request.host.memory_mib, 256000);
  EXPECT_TRUE(two_nodes.job.allowed_gpu_models.empty());
  EXPECT_THAT(trace->jobs[2].job.allowed_gpu_models, ElementsAre("V100-16GB"));
  EXPECT_THAT(trace->jobs[3].job.allowed_gpu_models, ElementsAre("H100-80GB"));
  EXPECT_EQ(trace->jobs[3].submit_seconds, 8100);
}

TEST(Sacct, TrailingDelimiterOfParsableIsAccepted) {
  auto trace = ReadText(ReadSacctCopyingCatalog,
                        "JobID|Submit|Start|End|State|Partition|User|NNodes|AllocTRES|\n"
                        "7|2024-01-01T00:00:00|2024-01-01T00:00:10|2024-01-01T00:01:10|COMPLETED|"
                        "p|u|1|gres/gpu=2|\n",
                        "sacct.txt");
  ASSERT_OK(trace);
  ASSERT_EQ(trace->jobs.size(), 1U);
  EXPECT_EQ(trace->jobs[0].duration_seconds, 60);
}

struct BadCase {
  const char* format;
  Reader reader;
  std::string text;
  std::string expected;
};

const std::string kPhillyHeader = "timestamp,duration,num_gpus,gpu_time,cluster\n";
const std::string kPhillyRow = "2017-10-09 07:01:55,66.0,1,66.0,vc\n";
const std::string kGavelRow = "A3C\tcmd\t-n\t1\t1000\t0.000000\t1\n";
const std::string kPolluxHeader = "name,time,application,num_replicas,batch_size\n";
const std::string kNativeHeader =
    "id,submit_time,duration,tasks,gpus_per_task,gpu_milli,allowed_models,queue,priority,kind,"
    "user\n";
const std::string kSacctHeader =
    "JobID|Submit|Start|End|State|Partition|Account|User|NNodes|"
    "AllocTRES\n";
const std::string kSacctTimes = "2024-03-01T08:00:00|2024-03-01T08:00:05|2024-03-01T09:00:05";

std::vector<BadCase> BadCases() {
  return {
      // philly
      {"philly", ReadPhilly, "", "trace:1: empty file, expected a header row"},
      {"philly", ReadPhilly, kPhillyHeader, "trace:1: no jobs in the file"},
      {"philly", ReadPhilly, "timestamp,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,1,1,vc\n",
       "trace:1: missing column \"duration\""},
      {"philly", ReadPhilly, kPhillyHeader + kPhillyRow + "2017-10-09 07:01:55,abc,1,1,vc\n",
       "trace:3: column \"duration\": \"abc\" is not a number of seconds"},
      {"philly", ReadPhilly, kPhillyHeader + "2017-10-09 07:01:55,-5.0,1,1,vc\n",
       "trace:2: column \"duration\": duration -5.0 s (must be positive"},
      {"philly", ReadPhilly, kPhillyHeader + "2017-10-09 07:01:55,0.4,1,1,vc\n",
       "trace:2: column \"duration\": duration 0.4 s"},
      {"philly", ReadPhilly, kPhillyHeader + "2017-02-29 07:01:55,60,1,1,vc\n",
       "trace:2: column \"timestamp\": \"2017-02-29 07:01:55\" is not a time"},
      {"philly", ReadPhilly, kPhillyHeader + "2017-10-09T07:01:55,60,1,1,vc\n",
       "trace:2: column \"timestamp\""},
      {"philly", ReadPhilly, kPhillyHeader + "2017-10-09 07:01:55,60,0,1,vc\n",
       "trace:2: column \"num_gpus\": 0 (must be 1.."},
      {"philly", ReadPhilly, kPhillyHeader + "2017-10-09 07:01:55,60,1\n",
       "trace:2: 3 fields, the header has 5"},
      // gavel
      {"gavel", ReadGavel, "", "trace:1: empty file, expected one job per line"},
      {"gavel", ReadGavel, kGavelRow + "A3C\tcmd\t-n\t1\t1000\t0.000000\n",
       "trace:2: 6 fields, expected 7"},
      {"gavel", ReadGavel, "A3C\tcmd\t-n\t1\tmany\t0.000000\t1\n",
       "trace:1: column \"total_steps\": \"many\" is not an integer"},
      {"gavel", ReadGavel, "A3C\tcmd\t-n\t1\t-5\t0.000000\t1\n",
       "trace:1: column \"total_steps\": -5 (must be 0.."},
      {"gavel", ReadGavel, "A3C\tcmd\t-n\t1\t0\t0.000000\t1\n",
       "trace:1: column \"total_steps\": 0 steps of \"A3C\" at 8.233016 steps/s give a duration "
       "of 0.000 s"},
      {"gavel", ReadGavel, "A3C\tcmd\t-n\t1\t1000\t-3.0\t1\n",
       "trace:1: column \"arrival_time\": time -3.0 s (must not be negative)"},
      {"gavel", ReadGavel, "A3C\tcmd\t-n\t1\t1000\t0.0\tx\n",
       "trace:1: column \"scale_factor\": \"x\" is not an integer"},
      {"gavel", ReadGavel, "GPT\tcmd\t-n\t1\t1000\t0.0\t1\n",
       "trace:1: column \"job_type\": unknown job type \"GPT\""},
      // pollux
      {"pollux", ReadPollux, "", "trace:1: empty file"},
      {"pollux", ReadPollux, kPolluxHeader, "trace:1: no jobs in the file"},
      {"pollux", ReadPollux, "name,time,application,num_replicas\nj,0,ncf,1\n",
       "trace:1: missing column \"batch_size\""},
      {"pollux", ReadPollux, kPolluxHeader + "j,soon,ncf,1,256\n",
       "trace:2: column \"time\": \"soon\" is not a number of seconds"},
      {"pollux", ReadPollux, kPolluxHeader + "j,-10,ncf,1,256\n",
       "trace:2: column \"time\": time -10 s (must not be negative)"},
      {"pollux", ReadPollux, kPolluxHeader + "j,0,ncf,-1,256\n",
       "trace:2: column \"num_replicas\": -1 (must be 1.."},
      {"pollux", ReadPollux, kPolluxHeader + "j,0,gpt,1,256\n",
       "trace:2: column \"application\": unknown application \"gpt\""},
      {"pollux", ReadPollux, kPolluxHeader + "j,0,ncf,3,256\n",
       "trace:2: column \"application\": no duration for ncf with num_replicas 3 and batch_size "
       "256 (known replicas x batch size: 1x256, 1x32768, 2x512, 4x1024, 8x2048)"},
      {"pollux", ReadPollux, kPolluxHeader + "j,0,ncf,1,256\nj,5,ncf,1,256\n",
       "trace:3: column \"name\": duplicate job id \"j\""},
      // native
      {"native", ReadNative, "", "trace:1: empty file"},
      {"native", ReadNative, kNativeHeader, "trace:1: no jobs in the file"},
      {"native", ReadNative,
       "submit_time,duration,tasks,gpus_per_task,gpu_milli,allowed_models,queue,priority,user\n"
       "0,60,1,1,1000,,q,0,u\n",
       "trace:1: missing column \"kind\""},
      {"native", ReadNative, kNativeHeader + "a,0,60,two,1,1000,,q,0,batch,u\n",
       "trace:2: column \"tasks\": \"two\" is not an integer"},
      {"native", ReadNative, kNativeHeader + "a,0,-60,1,1,1000,,q,0,batch,u\n",
       "trace:2: column \"duration\": duration -60 s (must be positive"},
      {"native", ReadNative, kNativeHeader + "a,0,0,1,1,1000,,q,0,batch,u\n",
       "trace:2: column \"duration\": duration 0 s"},
      {"native", ReadNative, kNativeHeader + "a,-1,60,1,1,1000,,q,0,batch,u\n",
       "trace:2: column \"submit_time\": time -1 s"},
      {"native", ReadNative, kNativeHeader + "a,0,60,1,1,1000,H100|X100,q,0,batch,u\n",
       "trace:2: column \"allowed_models\": unknown GPU model \"X100\""},
      {"native", ReadNative, kNativeHeader + "a,0,60,1,2,500,,q,0,batch,u\n",
       "trace:2: column \"gpu_milli\": 500 milli-GPU on each of 2 GPUs"},
      {"native", ReadNative, kNativeHeader + "a,0,60,1,1,1500,,q,0,batch,u\n",
       "trace:2: column \"gpu_milli\": 1500 (must be 1..1000)"},
      {"native", ReadNative, kNativeHeader + "a,0,60,1,0,250,,q,0,batch,u\n",
       "trace:2: column \"gpu_milli\": \"250\" for a task without GPUs"},
      {"native", ReadNative, kNativeHeader + "a,0,60,1,1,1000,,q,high,batch,u\n",
       "trace:2: column \"priority\": \"high\" is not an integer"},
      {"native", ReadNative, kNativeHeader + "a,0,60,1,1,1000,,q,0,training,u\n",
       "trace:2: column \"kind\": unknown kind \"training\""},
      {"native", ReadNative,
       kNativeHeader + "a,0,60,1,1,1000,,q,0,batch,u\na,1,60,1,1,1000,,q,0,batch,u\n",
       "trace:3: column \"id\": duplicate job id \"a\""},
      // sacct
      {"sacct", ReadSacctCopyingCatalog, "", "trace:1: empty file"},
      {"sacct", ReadSacctCopyingCatalog, kSacctHeader, "trace:1: no jobs in the file"},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader + "1.batch|" + kSacctTimes + "|COMPLETED|p|a|u|1|gres/gpu=1\n" +
           "2|2024-03-01T08:00:00|None|2024-03-01T08:00:00|CANCELLED by 0|p|a|u|1|\n",
       "trace:3: no jobs in the file to replay (2 rows; skipped: 1 .batch/.extern steps, 1 "
       "cancelled before start)"},
      {"sacct", ReadSacctCopyingCatalog,
       "JobID|Submit|Start|End|State|Partition|Account|User|NNodes\n1|" + kSacctTimes +
           "|COMPLETED|p|a|u|1\n",
       "trace:1: missing column \"AllocTRES\""},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader + "1|" + kSacctTimes + "|COMPLETED|p|a|u|two|gres/gpu=1\n",
       "trace:2: column \"NNodes\": \"two\" is not an integer"},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader +
           "1|2024-03-01T08:00:00|2024-03-01T09:00:00|2024-03-01T08:59:00|COMPLETED|p|a|u|1|"
           "gres/gpu=1\n",
       "trace:2: column \"End\": \"2024-03-01T08:59:00\" is before Start \"2024-03-01T09:00:00\" "
       "(negative duration -60 s)"},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader +
           "1|2024-03-01 08:00:00|2024-03-01T09:00:00|2024-03-01T10:00:00|COMPLETED|p|a|u|1|"
           "gres/gpu=1\n",
       "trace:2: column \"Submit\": \"2024-03-01 08:00:00\" is not a time YYYY-MM-DDTHH:MM:SS"},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader +
           "1|2024-03-01T08:00:00|2024-03-01T07:00:00|2024-03-01T09:00:00|COMPLETED|p|a|u|1|"
           "gres/gpu=1\n",
       "trace:2: column \"Start\": \"2024-03-01T07:00:00\" is before Submit"},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader + "1|" + kSacctTimes + "|COMPLETED|p|a|u|1|gres/gpu=lots\n",
       "trace:2: column \"AllocTRES\": \"gres/gpu=lots\" in \"gres/gpu=lots\" is not a count"},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader + "1|" + kSacctTimes + "|COMPLETED|p|a|u|2|gres/gpu=3\n",
       "trace:2: column \"AllocTRES\": 3 GPUs in \"gres/gpu=3\" do not split evenly over NNodes 2"},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader + "1|" + kSacctTimes + "|COMPLETED|p|a|u|1|gres/gpu=1,mem=lots\n",
       "trace:2: column \"AllocTRES\": \"mem=lots\""},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader + "1|" + kSacctTimes + "|EXPLODED|p|a|u|1|gres/gpu=1\n",
       "trace:2: column \"State\": unknown job state \"EXPLODED\""},
      {"sacct", ReadSacctCopyingCatalog,
       kSacctHeader + "1|" + kSacctTimes + "|COMPLETED|p|a|u|1|gres/gpu=1\n" + "1|" + kSacctTimes +
           "|COMPLETED|p|a|u|1|gres/gpu=1\n",
       "trace:3: column \"JobID\": duplicate job id \"1\""},
      {"sacct", ReadSacctCopyingCatalog, kSacctHeader + "1|" + kSacctTimes + "|COMPLETED|p|a|u|1\n",
       "trace:2: 9 fields, expected 10"},
  };
}

TEST(TraceLoaders, BadRowsFailTheWholeLoadNamingFileLineAndColumn) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(std::string(c.format) + ": " + c.text);
    EXPECT_THAT(ReadText(c.reader, c.text, "trace"),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.expected)));
  }
}

TEST(TraceLoaders, OpenbTraceRejectsBadTimes) {
  GpuCatalog catalog = GpuCatalog::Default();
  const std::string header =
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
      "deletion_time,scheduled_time\n";
  std::istringstream backwards(header + "p1,1000,10,1,500,,LS,Running,5,20,30\n");
  EXPECT_THAT(ReadOpenbTrace(backwards, "pods.csv", catalog),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("pods.csv:2: column \"deletion_time\": 20 is not after")));
  std::istringstream no_times("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,0\n");
  EXPECT_THAT(
      ReadOpenbTrace(no_times, "pods.csv", catalog),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("missing column \"creation_time\"")));
  std::istringstream bad(header + "p1,1000,10,1,500,,LS,Running,x,20,10\n");
  EXPECT_THAT(ReadOpenbTrace(bad, "pods.csv", catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("column \"creation_time\": \"x\"")));
}

TEST(TraceLoaders, LoadTraceDispatchesOnTheFormat) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto native = LoadTrace(kTraceDataDir + "/examples/native_example.csv", "native", catalog);
  ASSERT_OK(native);
  EXPECT_EQ(native->jobs.size(), 6U);
  EXPECT_EQ(native->source, kTraceDataDir + "/examples/native_example.csv");
  auto sacct = LoadTrace(kTraceDataDir + "/examples/sacct_example.txt", "sacct", catalog);
  ASSERT_OK(sacct);
  EXPECT_EQ(sacct->jobs.size(), 4U);
  auto gavel = LoadTrace(kTraceDataDir + "/gavel/23dbec.trace", "gavel", catalog);
  ASSERT_OK(gavel);
  EXPECT_EQ(gavel->jobs.size(), 9U);
  auto pollux = LoadTrace(kTraceDataDir + "/pollux/workload-1.csv", "pollux", catalog);
  ASSERT_OK(pollux);
  EXPECT_EQ(pollux->jobs.size(), 160U);
  auto openb = LoadTrace(kTraceDataDir + "/openb/openb_pod_list_default.csv", "openb", catalog);
  ASSERT_OK(openb);
  EXPECT_EQ(openb->jobs.size(), 8152U - 897U);  // 897 pods never started
  EXPECT_EQ(openb->jobs.front().submit_seconds, 0);
  EXPECT_THAT(LoadTrace("trace.csv", "csv", catalog),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unknown trace format \"csv\" (formats: philly, openb, native, "
                                 "sacct, gavel, pollux)")));
  EXPECT_THAT(LoadTrace(kTraceDataDir + "/does-not-exist.csv", "philly", catalog),
              StatusIs(StatusCode::kNotFound, HasSubstr("cannot open file")));
  EXPECT_THAT(TraceFormatNames(),
              ElementsAre("philly", "openb", "native", "sacct", "gavel", "pollux"));
}

TEST(TraceLoaders, EveryJobValidatesAgainstTheCatalog) {
  GpuCatalog catalog = GpuCatalog::Default();
  for (const auto& [path, format] :
       std::vector<std::pair<std::string, std::string>>{{"/examples/native_example.csv", "native"},
                                                        {"/examples/sacct_example.txt", "sacct"},
                                                        {"/gavel/2869ce.trace", "gavel"},
                                                        {"/pollux/workload-8.csv", "pollux"}}) {
    SCOPED_TRACE(path);
    auto trace = LoadTrace(kTraceDataDir + path, format, catalog);
    ASSERT_OK(trace);
    for (const TraceJob& job : trace->jobs) {
      EXPECT_OK(job.job.Validate(catalog));
      EXPECT_GT(job.duration_seconds, 0);
      EXPECT_GE(job.submit_seconds, 0);
      EXPECT_EQ(job.job.runtime_estimate, std::chrono::seconds(job.duration_seconds));
      EXPECT_EQ(job.job.groups.size(), 1U);
    }
  }
}

}  // namespace
}  // namespace gpufleet::sim
