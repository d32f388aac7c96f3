// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/workload.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

Job TwoGroupJob() {
  Job job;
  job.id = JobId("train");
  job.groups.push_back({"workers", 4, {{8000, 65536}, WholeGpus{8}}});
  job.groups.push_back({"eval", 1, {{4000, 16384}, FractionalGpu{500, 10240}}});
  return job;
}

TEST(Job, CountsTasksAndGpuMilli) {
  const Job job = TwoGroupJob();
  EXPECT_EQ(job.TaskCount(), 5);
  EXPECT_EQ(job.RequestedGpuMilliTotal(), 4 * 8000 + 500);
  EXPECT_EQ(RequestedGpuMilli(MigGpus{"7g.80gb", 1}), 1000);
  EXPECT_EQ(RequestedGpuMilli(NoGpu{}), 0);
}

TEST(Job, ValidJobPasses) {
  EXPECT_OK(TwoGroupJob().Validate(GpuCatalog::Default()));
}

TEST(Job, RejectsUnknownMigProfileListingValidOnes) {
  Job job = TwoGroupJob();
  job.allowed_gpu_models = {"H100-80GB"};
  job.groups[1].request.gpus = MigGpus{"3g.45gb", 1};
  EXPECT_THAT(job.Validate(GpuCatalog::Default()),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("groups[1].request.gpus.mig_profile: unknown profile \"3g.45gb\" "
                                 "for H100-80GB (valid: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, "
                                 "3g.40gb, 4g.40gb, 7g.80gb)")));
}

TEST(Job, RejectsMigProfileKnownToNoModel) {
  Job job = TwoGroupJob();
  job.groups[0].request.gpus = MigGpus{"9g.1tb", 1};
  EXPECT_THAT(job.Validate(GpuCatalog::Default()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"9g.1tb\" on every known")));
}

TEST(Job, RejectsBadCountsAndShares) {
  struct Case {
    const char* name;
    void (*mutate)(Job&);
    const char* expected;
  };
  const Case cases[] = {
      {"zero replicas", [](Job& j) { j.groups[0].replicas = 0; }, "groups[0].replicas: 0"},
      {"zero gpus", [](Job& j) { j.groups[0].request.gpus = WholeGpus{0}; },
       "groups[0].request.gpus.count: 0"},
      {"share of 1000",
       [](Job& j) {
         j.groups[1].request.gpus = FractionalGpu{1000, 0};
       },
       "groups[1].request.gpus.gpu_milli: 1000"},
      {"negative cpu", [](Job& j) { j.groups[1].request.host.cpu_milli = -1; },
       "groups[1].request.cpu_milli: negative value -1"},
      {"unknown model",
       [](Job& j) {
         j.allowed_gpu_models = {"H100-80GB", "Z1"};
       },
       "allowed_gpu_models[1]: unknown GPU model \"Z1\""},
      {"no groups", [](Job& j) { j.groups.clear(); }, "groups: a job needs"},
      {"no id", [](Job& j) { j.id = JobId(); }, "id: empty"},
      {"bad skew",
       [](Job& j) {
         j.spread = {"rack", 0};
       },
       "spread.max_skew: 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Job job = TwoGroupJob();
    c.mutate(job);
    EXPECT_THAT(job.Validate(GpuCatalog::Default()),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.expected)));
  }
}

}  // namespace
}  // namespace gpufleet
