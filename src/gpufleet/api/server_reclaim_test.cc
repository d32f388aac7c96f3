// SPDX-License-Identifier: Apache-2.0
// Idle reclaim of interactive jobs through ApiServer (server_reclaim.cc), on a fake clock: one
// agent node whose heartbeats carry GPU utilization, a notebook, and batch jobs that wait.
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/auth.h"
#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/agent_node_fixture.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/agent_protocol.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// `name` asking for `gpus` whole GPUs; `kind` batch or interactive.
std::string ReclaimJobYaml(const std::string& name, const std::string& kind, int gpus) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  kind: {}
  tasks:
    - name: main
      command: [sleep, infinity]
      resources: {{cpu: "4", memory: 16Gi, gpus: {{count: {}}}}}
)",
                     name, kind, gpus);
}

class ServerReclaimTest : public api_testing::AgentNodeServerTest {
 protected:
  // Reclaim under 10% for 30 min, after a 15 min warning; heartbeats every minute.
  void Start(policy::ReclaimAction action = policy::ReclaimAction::kSuspend) {
    policy::IdleReclaimOptions reclaim;
    reclaim.threshold_milli = 100;
    reclaim.idle_seconds = 30 * 60;
    reclaim.warning_seconds = 15 * 60;
    reclaim.max_sample_gap_seconds = 5 * 60;
    reclaim.action = action;
    StartServer(reclaim);
  }

  Json Job(const std::string& name) {
    const ApiResponse response = Call("GET", "/v1/jobs/" + name, admin_);
    EXPECT_EQ(response.status, 200) << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  std::string Events(const std::string& name) {
    return Call("GET", "/v1/jobs/" + name + "/events", admin_).body;
  }

  void Submit(const std::string& token, const std::string& yaml) {
    const ApiResponse response = Call("POST", "/v1/jobs", token, yaml);
    ASSERT_EQ(response.status, 201) << response.body;
  }

  // The GPU indices `job` holds.
  std::set<int> GpusOf(const std::string& job) {
    std::set<int> gpus;
    const Json doc = Job(job);
    for (const Json& placement : doc["placements"]) {
      for (const Json& gpu : placement["gpus"]) {
        gpus.insert(gpu.get<int>());
      }
    }
    return gpus;
  }

  // The notebook `nb` (team-a) running on one GPU, and the GPU index it holds.
  int StartNotebook() {
    Submit(alice_, ReclaimJobYaml("nb", "interactive", 1));
    Minute([](int) { return 0; });  // 00:01 scheduled
    Minute([](int) { return 0; });  // 00:02 its task is handed to the agent
    Minute([](int) { return 0; });  // 00:03 the task reports running: the first sample
    EXPECT_EQ(Job("nb")["state"], "Running");
    const std::set<int> gpus = GpusOf("nb");
    EXPECT_EQ(gpus.size(), 1U);
    return gpus.empty() ? -1 : *gpus.begin();
  }
};

TEST_F(ServerReclaimTest, IdleNotebookIsWarnedThenSuspendedAndTheWaitingJobRuns) {
  Start();
  const int nb_gpu = StartNotebook();  // Running from 00:03
  // The whole node is wanted: it waits for the notebook's GPU.
  Submit(bob_, ReclaimJobYaml("train", "batch", kGpus));
  // The notebook's GPU idles at 3% while the others are busy: its own GPUs count.
  const auto idle_notebook = [nb_gpu](int gpu) { return gpu == nb_gpu ? 3 : 90; };

  // Its first sample is the heartbeat of 00:03, so it has been idle 29 minutes at 00:32.
  Minutes(29, idle_notebook);
  EXPECT_FALSE(Job("nb").contains("warning"));
  Minute(idle_notebook);  // 00:33
  Json nb = Job("nb");
  EXPECT_EQ(nb["state"], "Running");
  EXPECT_EQ(nb["warning"],
            "GPUs under 10% for 30m while 1 job waits; will be suspended at 00:48 unless used");
  EXPECT_THAT(Events("nb"), HasSubstr("idle warning: GPUs under 10% for 30m while 1 job waits"));
  EXPECT_EQ(Job("train")["state"], "Pending");

  Minutes(14, idle_notebook);  // 00:47
  EXPECT_EQ(Job("nb")["state"], "Running");
  Minute(idle_notebook);  // 00:48: reclaimed; the notebook stops and keeps its GPU meanwhile
  nb = Job("nb");
  EXPECT_EQ(nb["state"], "Stopping");
  EXPECT_EQ(nb["stopping"]["then"], "Suspended");
  EXPECT_EQ(Job("train")["state"], "Pending");
  // 00:49 the agent still reports it running (it was told to stop in this answer); at 00:50 it
  // is gone and the waiting job is placed.
  Minute(idle_notebook);
  EXPECT_EQ(Job("nb")["state"], "Stopping");
  Minute(idle_notebook);
  nb = Job("nb");
  EXPECT_EQ(nb["state"], "Suspended");
  EXPECT_EQ(nb["reason"],
            "reclaimed: GPUs under 10% for 45m while 1 job waited; suspended until its owner "
            "resumes it");
  EXPECT_FALSE(nb.contains("warning"));
  EXPECT_TRUE(nb["placements"].empty());
  EXPECT_EQ(Job("train")["state"], "Scheduled");
  // The run's outcome record counts it as preempted, not as a failure.
  const Json outcomes =
      Json::parse(Call("GET", "/v1/outcomes?job=nb", admin_).body, nullptr, false);
  ASSERT_EQ(outcomes["items"].size(), 1U) << outcomes.dump();
  EXPECT_EQ(outcomes["items"][0]["exit_reason"], "preempted");

  // Suspended stays suspended, and its tasks are no longer wanted on the node.
  Minutes(3, [](int) { return 90; });
  EXPECT_EQ(Job("nb")["state"], "Suspended");
  EXPECT_EQ(Job("train")["state"], "Running");
  for (const std::string& id : desired_) {
    EXPECT_THAT(id, Not(HasSubstr("nb/")));
  }
  const Json suspended =
      Json::parse(Call("GET", "/v1/jobs?state=Suspended", admin_).body, nullptr, false);
  ASSERT_EQ(suspended["items"].size(), 1U);
  EXPECT_EQ(suspended["items"][0]["name"], "nb");
}

TEST_F(ServerReclaimTest, OnlyTheOwnersTeamOrAnAdminResumesASuspendedJob) {
  Start();
  StartNotebook();
  Submit(bob_, ReclaimJobYaml("train", "batch", kGpus));
  Minutes(49, [](int) { return 0; });  // reclaimed at 00:48, the batch job running at 00:52
  ASSERT_EQ(Job("nb")["state"], "Suspended");

  // Another team's job is hidden; a job that is not suspended does not resume.
  EXPECT_EQ(Call("POST", "/v1/jobs/nb/resume", bob_).status, 404);
  const ApiResponse running = Call("POST", "/v1/jobs/train/resume", admin_);
  EXPECT_EQ(running.status, 400);
  EXPECT_THAT(running.body, HasSubstr("job \\\"team-b/train\\\" is Running, not Suspended"));
  EXPECT_EQ(Call("POST", "/v1/jobs/missing/resume", admin_).status, 404);

  const ApiResponse resumed = Call("POST", "/v1/jobs/nb/resume", alice_);
  ASSERT_EQ(resumed.status, 200) << resumed.body;
  const Json nb = Job("nb");
  EXPECT_EQ(nb["state"], "Pending");
  EXPECT_EQ(nb["reason"], "resumed by alice");
  EXPECT_THAT(Events("nb"), HasSubstr("resumed by alice"));
  EXPECT_EQ(Call("POST", "/v1/jobs/nb/resume", alice_).status, 400);
}

TEST_F(ServerReclaimTest, ASuspendedJobCanBeCancelled) {
  Start();
  StartNotebook();
  Submit(bob_, ReclaimJobYaml("train", "batch", kGpus));
  Minutes(47, [](int) { return 0; });
  ASSERT_EQ(Job("nb")["state"], "Suspended");
  const ApiResponse cancelled = Call("POST", "/v1/jobs/nb/cancel", alice_);
  ASSERT_EQ(cancelled.status, 200) << cancelled.body;
  EXPECT_EQ(Job("nb")["state"], "Cancelled");
}

TEST_F(ServerReclaimTest, NotebookBusyAgainDuringItsWarningHasTheWarningWithdrawn) {
  Start();
  StartNotebook();
  Submit(bob_, ReclaimJobYaml("train", "batch", kGpus));
  Minutes(30, [](int) { return 0; });  // 00:33
  ASSERT_TRUE(Job("nb").contains("warning"));

  Minute([](int) { return 50; });  // 00:34
  const Json nb = Job("nb");
  EXPECT_EQ(nb["state"], "Running");
  EXPECT_FALSE(nb.contains("warning"));
  EXPECT_THAT(Events("nb"), HasSubstr("GPUs busy again (50% at 00:34); warning withdrawn"));

  // Busy past the old deadline: never reclaimed, and the batch job keeps waiting.
  Minutes(20, [](int) { return 50; });
  EXPECT_EQ(Job("nb")["state"], "Running");
  EXPECT_FALSE(Job("nb").contains("warning"));
  EXPECT_EQ(Job("train")["state"], "Pending");
}

TEST_F(ServerReclaimTest, IdleNotebookIsNotWarnedWhileNothingWaits) {
  Start();
  StartNotebook();
  Minutes(60, [](int) { return 0; });
  const Json nb = Job("nb");
  EXPECT_EQ(nb["state"], "Running");
  EXPECT_FALSE(nb.contains("warning"));
  EXPECT_THAT(Events("nb"), Not(HasSubstr("idle")));
}

TEST_F(ServerReclaimTest, IdleBatchJobIsNeverReclaimed) {
  Start();
  Submit(alice_, ReclaimJobYaml("batch-1", "batch", 1));
  Minutes(3, [](int) { return 0; });
  ASSERT_EQ(Job("batch-1")["state"], "Running");
  Submit(bob_, ReclaimJobYaml("train", "batch", kGpus));
  Minutes(60, [](int) { return 0; });
  const Json job = Job("batch-1");
  EXPECT_EQ(job["state"], "Running");
  EXPECT_FALSE(job.contains("warning"));
  EXPECT_EQ(Job("train")["state"], "Pending");
}

TEST_F(ServerReclaimTest, PreemptActionRequeuesTheNotebookBehindTheWaitingJob) {
  Start(policy::ReclaimAction::kPreempt);
  StartNotebook();
  Submit(bob_, ReclaimJobYaml("train", "batch", kGpus));
  Minutes(30, [](int) { return 0; });
  EXPECT_THAT(Job("nb")["warning"].get<std::string>(), HasSubstr("will be preempted at 00:48"));
  Minutes(15, [](int) { return 0; });  // 00:48
  Json nb = Job("nb");
  EXPECT_EQ(nb["state"], "Stopping");
  EXPECT_EQ(nb["stopping"]["then"], "Preempted");
  EXPECT_EQ(nb["reason"], "reclaimed: GPUs under 10% for 45m while 1 job waited; preempted");
  EXPECT_EQ(nb["preempted_by"], "team-b/train");

  // Once it is gone from the node it is requeued in the same cycle that places the batch job.
  Minutes(2, [](int) { return 0; });
  EXPECT_EQ(Job("train")["state"], "Scheduled");
  EXPECT_EQ(Job("nb")["state"], "Pending");
  // bob's job is of another team: alice's notebook is not told its name.
  EXPECT_THAT(Events("nb"), HasSubstr("requeued after preemption by a job of another team"));
  Minutes(2, [](int) { return 0; });
  EXPECT_EQ(Job("train")["state"], "Running");
  EXPECT_EQ(Job("nb")["state"], "Pending");
}

TEST(ServerReclaimOptionsTest, BadOptionsAreRefusedNamingTheField) {
  const GpuCatalog catalog = GpuCatalog::Default();
  FakeClock clock;
  store::InMemoryStateStore store;
  policy::IdleReclaimOptions reclaim;
  reclaim.threshold_milli = 0;
  const Result<std::unique_ptr<ApiServer>> server = ApiServer::Create(
      {.store = store, .catalog = catalog, .clock = clock, .idle_reclaim = reclaim});
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("threshold_milli: 0"));
}

}  // namespace
}  // namespace gpufleet::api
