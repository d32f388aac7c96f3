// SPDX-License-Identifier: Apache-2.0
// The queue controller on its own: a server writes the jobs into the store, and the test reads
// them through a view of its own and asks a controller of its own, playing the server's part
// (committing, or not, what the controller decides).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/api_request.h"
#include "gpufleet/control/queue_controller.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

using ::testing::HasSubstr;

// One task of 8 whole GPUs (a whole node) in `queue`.
std::string ControllerNodeJob(const std::string& name, const std::string& queue, int priority) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}, queue: {}}}
spec:
  priority: {}
  tasks:
    - name: main
      command: [train]
      resources: {{cpu: "8", memory: 64Gi, gpus: {{count: 8}}}}
)",
                     name, queue, priority);
}

// Two nodes of 8 H100s, both taken by low-priority jobs of queue "batch"; "urgent" (priority
// 10, same queue) waits, and so does "other" (priority 5).
class QueueControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<ApiServer>> server =
        ApiServer::Create({.store = store_, .catalog = catalog_, .clock = clock_});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    SyntheticClusterSpec spec;
    spec.blocks = 1;
    spec.leaves_per_block = 1;
    spec.nodes_per_leaf = 2;
    Result<Cluster> cluster = MakeSyntheticCluster(spec, catalog_);
    ASSERT_OK(cluster);
    ASSERT_OK(server_->RegisterNodes(*cluster));
    Result<std::string> admin =
        server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    ASSERT_OK(admin);
    admin_ = *admin;
    Call("POST", "/v1/queues", R"({"name": "batch"})", 201);
    Call("POST", "/v1/jobs", ControllerNodeJob("low-0", "batch", 0), 201);
    Call("POST", "/v1/jobs", ControllerNodeJob("low-1", "batch", 0), 201);
    ASSERT_OK(server_->RunSchedulingCycle());
    Call("POST", "/v1/jobs", ControllerNodeJob("urgent", "batch", 10), 201);
    Call("POST", "/v1/jobs", ControllerNodeJob("other", "batch", 5), 201);

    Result<std::unique_ptr<scheduler::Scheduler>> made = scheduler::Scheduler::Create(
        scheduler::SchedulerOptions{}, scheduler::PluginRegistry::Default());
    ASSERT_OK(made);
    scheduler_ = std::move(made).value();
    view_ = std::make_unique<control::SchedulingView>(store_, catalog_);
    ASSERT_OK(view_->Refresh());
    controller_ = std::make_unique<control::QueueController>(control::QueueController::Options{
        .store = store_, .catalog = catalog_, .clock = clock_, .started_at = MonoTime{}});
    EXPECT_TRUE(controller_->Update(*view_, 0).empty());
    // The low jobs are charged from now: past the minimum runtime before preemption.
    clock_.Advance(std::chrono::seconds(61));
  }

  void Call(const std::string& method, const std::string& path, const std::string& body,
            int want_status) {
    const ApiResponse response = api_testing::HandleRequest(*server_, method, path, admin_, body);
    EXPECT_EQ(response.status, want_status) << method << " " << path << ": " << response.body;
  }

  // The store key of the job named `name`.
  std::string Key(const std::string& name) {
    for (const auto& [key, job] : view_->jobs()) {
      if (control::NameOfKey(key) == name) {
        return key;
      }
    }
    ADD_FAILURE() << "no job " << name;
    return "";
  }

  Job Spec(const std::string& name) {
    const Result<Job> job = wire::ParseJobSpec(
        wire::ParseDocument(view_->jobs().at(Key(name)).data)["spec"].dump(), catalog_);
    EXPECT_OK(job);
    return *job;
  }

  Result<std::optional<control::PreemptionPlan>> Plan(const std::string& name) {
    Random random(1);
    return controller_->PlanPreemption(*view_, *scheduler_, Key(name), Spec(name), "batch",
                                       /*cycle=*/0, "2026-12-02T00:00:00Z", clock_.Now().nanos,
                                       random);
  }

  std::vector<std::string> Order() {
    std::vector<control::PendingEntry> pending = control::PendingEntries(*view_);
    controller_->OrderPending(pending);
    std::vector<std::string> names;
    for (const control::PendingEntry& entry : pending) {
      names.emplace_back(control::NameOfKey(*entry.name));
    }
    return names;
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
  store::InMemoryStateStore store_;
  std::unique_ptr<ApiServer> server_;
  std::string admin_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<control::SchedulingView> view_;
  std::unique_ptr<control::QueueController> controller_;
};

TEST_F(QueueControllerTest, PendingJobsGoByPriorityThenAReservedPreemptorFirst) {
  EXPECT_THAT(Order(), ::testing::ElementsAre("urgent", "other"));
  const Result<std::optional<control::PreemptionPlan>> plan = Plan("other");
  ASSERT_OK(plan);
  ASSERT_TRUE(plan->has_value());
  controller_->Reserve(Key("other"));
  EXPECT_THAT(Order(), ::testing::ElementsAre("other", "urgent"))
      << "what a preemptor preempted for is not taken by a job of higher priority";
}

TEST_F(QueueControllerTest, APreemptionPlanWritesNothingAndReservesOnlyOnceCommitted) {
  const Result<int64_t> revision = store_.Revision();
  ASSERT_OK(revision);
  const Result<std::optional<control::PreemptionPlan>> plan = Plan("urgent");
  ASSERT_OK(plan);
  ASSERT_TRUE(plan->has_value());
  EXPECT_EQ(*store_.Revision(), *revision) << "the server commits, not the controller";
  ASSERT_EQ((*plan)->victim_writes.size(), 1u) << "one node frees enough";
  const control::JobWrite& victim = (*plan)->victim_writes[0];
  EXPECT_EQ(victim.version, view_->jobs().at(victim.name).version);
  EXPECT_EQ(victim.before["state"], "Scheduled");
  EXPECT_EQ(victim.after["state"], "Stopping") << "its GPUs stay held until its tasks are gone";
  EXPECT_EQ(victim.after["preempted_by"], Key("urgent"));
  EXPECT_THAT(victim.events.front(), HasSubstr("priority 10 over 0"));
  EXPECT_THAT((*plan)->preemptor_event, HasSubstr("preempting"));
  EXPECT_THAT((*plan)->pending_reason, HasSubstr("waiting for them to stop"));

  EXPECT_FALSE(controller_->HasReservation(Key("urgent"))) << "not before the commit";
  controller_->Reserve(Key("urgent"));
  EXPECT_TRUE(controller_->HasReservation(Key("urgent")));
}

TEST_F(QueueControllerTest, AReserveForAnotherJobThanThePlannedOneReservesNothing) {
  const Result<std::optional<control::PreemptionPlan>> plan = Plan("urgent");
  ASSERT_OK(plan);
  ASSERT_TRUE(plan->has_value());
  controller_->Reserve(Key("other"));
  EXPECT_FALSE(controller_->HasReservation(Key("other")));
  controller_->Reserve(Key("urgent"));
  EXPECT_FALSE(controller_->HasReservation(Key("urgent"))) << "the plan was dropped";
}

// Issue 37: of two equal running jobs the victim is the one whose tasks reported a checkpoint
// last (the time the heartbeats stored on the job, on the controller's wall clock).
TEST_F(QueueControllerTest, TheVictimIsTheJobThatCheckpointedLast) {
  controller_ = std::make_unique<control::QueueController>(
      control::QueueController::Options{.store = store_,
                                        .catalog = catalog_,
                                        .clock = clock_,
                                        .wall_clock = &clock_,
                                        .started_at = MonoTime{}});
  EXPECT_TRUE(controller_->Update(*view_, 0).empty());
  clock_.Advance(std::chrono::seconds(3600));
  const auto checkpoint = [&](const std::string& name, int64_t seconds_ago) {
    const Result<store::StoredObject> stored = store_.Get("jobs", Key(name));
    ASSERT_OK(stored);
    nlohmann::json doc = wire::ParseDocument(stored->data);
    doc["last_checkpoint_ns"] = clock_.Now().nanos - seconds_ago * 1'000'000'000;
    store::WriteBatch batch;
    batch.Update("jobs", Key(name), doc.dump(), stored->version);
    ASSERT_OK(store_.Commit(batch));
    ASSERT_OK(view_->Refresh());
  };
  const auto victim = [&]() -> std::string {
    const Result<std::optional<control::PreemptionPlan>> plan = Plan("urgent");
    EXPECT_OK(plan);
    if (!plan.ok() || !plan->has_value() || (*plan)->victim_writes.size() != 1) {
      ADD_FAILURE() << "no plan of one victim";
      return "";
    }
    return std::string(control::NameOfKey((*plan)->victim_writes[0].name));
  };
  checkpoint("low-0", 50 * 60);
  checkpoint("low-1", 10);
  EXPECT_EQ(victim(), "low-1");
  checkpoint("low-0", 5);
  EXPECT_EQ(victim(), "low-0");
}

TEST_F(QueueControllerTest, AdmissionChargesTheQueueSoTheNextPlacementSeesIt) {
  Call("PATCH", "/v1/queues/batch", R"({"limit": {"*": 16}})", 200);
  ASSERT_OK(view_->Refresh());
  EXPECT_TRUE(controller_->Update(*view_, 1).empty());
  // 16 GPUs are charged already: a placement of 8 more is over the limit.
  const std::vector<scheduler::TaskPlacement> placed = view_->jobs().at(Key("low-0")).placements;
  const std::optional<std::string> refused =
      controller_->Admit(Key("urgent"), view_->jobs().at(Key("urgent")), placed, view_->snapshot());
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(*refused, HasSubstr("limit"));
}

}  // namespace
}  // namespace gpufleet::api
