// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/job_record.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/wire/job_spec.h"

namespace gpufleet::wire {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kRecordSpecYaml[] = R"(apiVersion: gpufleet.io/v1
kind: Job
metadata:
  name: train
  queue: research
spec:
  tasks:
  - name: worker
    replicas: 2
    image: pytorch:24.01
    command: [python, train.py]
    resources:
      gpus: {count: 1}
)";

// A Running job's document as the server writes it: submitted, placed (GPUs by UUID, a MIG
// slice on one assignment), stamped and reported on.
Json RunningJobDocument() {
  const Result<Job> job = ParseJobSpec(kRecordSpecYaml, GpuCatalog::Default());
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  Result<Json> doc = ParseJson(R"({
    "name": "train", "team": "nlp", "queue": "research", "labels": {"owner": "ada"},
    "state": "Running", "reason": "", "priority": 0, "submit_seq": 17,
    "submitted_by": "user ada", "created_at": "2026-12-07T15:00:00Z", "attempt": 2,
    "placements": [
      {"task": "worker-0", "node": "node-a", "gpus": [3], "gpu_uuids": ["GPU-aaaa"],
       "group": 0, "replica": 0, "cpu_milli": 1000, "memory_mib": 2048,
       "assignments": [{"milli": 1000, "memory_mib": 0, "mig_profile": "", "mig_start": -1,
                        "mig_created": false, "model": "A100-80GB"}],
       "phase": "Running", "started_ns": 5000, "image_pulled_ns": 4000, "image_pull_ms": 1200,
       "image_digest": "sha256:abc"},
      {"task": "worker-1", "node": "node-b", "gpus": [0], "gpu_uuids": ["GPU-bbbb"],
       "group": 0, "replica": 1, "cpu_milli": 1000, "memory_mib": 2048,
       "assignments": [{"milli": 1000, "memory_mib": 10240, "mig_profile": "1g.10gb",
                        "mig_start": 2, "mig_created": true, "model": "A100-80GB"}],
       "phase": "Waiting", "image_pull_progress": "40%"}
    ],
    "preempted_by": "", "preempted_by_team": "vision",
    "usage_run": {"attempt": 2, "start_ns": 3000, "busy": 77},
    "warning": "idle for 2h: reclaimed at 16:00 unless it works",
    "last_checkpoint_ns": 1765119600000000000,
    "notice": {"signal": "SIGUSR1", "since_ns": 1765119700000000000,
               "deadline_ns": 1765119760000000000, "reason": "preempted by job urgent"}
  })");
  EXPECT_TRUE(doc.ok()) << doc.status().ToString();
  (*doc)["spec"] = JobSpecToJson(*job);
  return *doc;
}

TEST(JobRecord, ReadsEveryFieldTyped) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const Result<JobRecord> record = JobRecordFromJson(RunningJobDocument(), &catalog);
  ASSERT_OK(record.status());
  EXPECT_EQ(record->name, "train");
  EXPECT_EQ(record->team, "nlp");
  EXPECT_EQ(record->queue, "research");
  EXPECT_EQ(record->labels.at("owner"), "ada");
  EXPECT_EQ(record->submit_seq, 17);
  EXPECT_EQ(record->state, JobState::kRunning);
  EXPECT_EQ(record->attempt, 2);
  ASSERT_TRUE(record->spec.has_value());
  EXPECT_EQ(record->spec->id.value(), "train");
  EXPECT_EQ(record->spec->TaskCount(), 2);
  ASSERT_EQ(record->placements.size(), 2u);
  const PlacementRecord& second = record->placements[1];
  EXPECT_EQ(second.node, "node-b");
  EXPECT_EQ(second.gpu_uuids, std::vector<std::string>{"GPU-bbbb"});
  EXPECT_EQ(second.gpu_indices, std::vector<int64_t>{0});
  ASSERT_EQ(second.assignments.size(), 1u);
  EXPECT_EQ(second.assignments[0].mig_profile, "1g.10gb");
  EXPECT_EQ(second.assignments[0].mig_start, 2);
  EXPECT_TRUE(second.assignments[0].mig_created);
  EXPECT_EQ(second.image_pull_progress, "40%");
  EXPECT_EQ(record->placements[0].started_ns, 5000);
  EXPECT_FALSE(record->placements[1].started_ns.has_value());
  EXPECT_EQ(record->preempted_by, std::optional<std::string>(""));
  EXPECT_EQ(record->preempted_by_team, std::optional<std::string>("vision"));
  ASSERT_TRUE(record->usage_run.has_value());
  EXPECT_EQ(record->usage_run->busy, 77);
  EXPECT_EQ(record->idle_warning, "idle for 2h: reclaimed at 16:00 unless it works");
  EXPECT_EQ(record->last_checkpoint_ns, 1765119600000000000);
  ASSERT_TRUE(record->notice.has_value());
  EXPECT_EQ(record->notice->signal, "SIGUSR1");
  EXPECT_EQ(record->notice->since_ns, 1765119700000000000);
  EXPECT_EQ(record->notice->deadline_ns, 1765119760000000000);
  EXPECT_EQ(record->notice->reason, "preempted by job urgent");
  EXPECT_TRUE(record->extra.empty()) << record->extra.dump();
  // A job that never reported a checkpoint has none.
  Json without = RunningJobDocument();
  without.erase("last_checkpoint_ns");
  const Result<JobRecord> unsaved = JobRecordFromJson(without, &catalog);
  ASSERT_OK(unsaved.status());
  EXPECT_FALSE(unsaved->last_checkpoint_ns.has_value());
  EXPECT_FALSE(JobRecordToJson(*unsaved).contains("last_checkpoint_ns"));
  without.erase("notice");
  EXPECT_FALSE(JobRecordFromJson(without, &catalog)->notice.has_value());
  EXPECT_FALSE(JobRecordToJson(*JobRecordFromJson(without, &catalog)).contains("notice"));
  without["last_checkpoint_ns"] = "yesterday";
  EXPECT_THAT(JobRecordFromJson(without, &catalog).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("last_checkpoint_ns")));
}

TEST(JobRecord, WritesBackTheDocumentItRead) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const Json doc = RunningJobDocument();
  const Result<JobRecord> with_spec = JobRecordFromJson(doc, &catalog);
  ASSERT_OK(with_spec.status());
  EXPECT_EQ(JobRecordToJson(*with_spec), doc);
  // Read without the spec, the stored spec is carried through untouched.
  const Result<JobRecord> without_spec = JobRecordFromJson(doc, nullptr);
  ASSERT_OK(without_spec.status());
  EXPECT_FALSE(without_spec->spec.has_value());
  EXPECT_EQ(JobRecordToJson(*without_spec), doc);
}

TEST(JobRecord, WritesTheChangesOfATypedEdit) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Result<JobRecord> record = JobRecordFromJson(RunningJobDocument(), &catalog);
  ASSERT_OK(record.status());
  record->state = JobState::kStopping;
  record->stopping = StopRecord{.then = JobState::kCancelled,
                                .reason = "cancelled by user ada",
                                .since = "2026-12-07T15:10:00Z"};
  record->placements[0].gone = true;
  record->placements[0].gone_reason = "exited with code 0";
  const Json written = JobRecordToJson(*record);
  EXPECT_EQ(written["state"], "Stopping");
  EXPECT_EQ(written["stopping"]["then"], "Cancelled");
  EXPECT_EQ(written["placements"][0]["gone"], true);
  const Result<JobRecord> again = JobRecordFromJson(written, &catalog);
  ASSERT_OK(again.status());
  EXPECT_EQ(again->stopping, record->stopping);
  EXPECT_EQ(again->placements, record->placements);
}

TEST(JobRecord, AnMpsShareIsMarkedOnItsAssignmentOnly) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Result<JobRecord> record = JobRecordFromJson(RunningJobDocument(), &catalog);
  ASSERT_OK(record.status());
  // Documents from before MPS have no "mps": time-sliced, and written back without one.
  EXPECT_FALSE(record->placements[0].assignments[0].mps);
  EXPECT_FALSE(JobRecordToJson(*record)["placements"][0]["assignments"][0].contains("mps"));
  record->placements[0].assignments[0].milli = 250;
  record->placements[0].assignments[0].mps = true;
  const Json written = JobRecordToJson(*record);
  EXPECT_EQ(written["placements"][0]["assignments"][0]["mps"], true);
  const Result<JobRecord> again = JobRecordFromJson(written, &catalog);
  ASSERT_OK(again.status());
  EXPECT_TRUE(again->placements[0].assignments[0].mps);
}

TEST(JobRecord, LoadsAPendingDocumentOfAnOlderServer) {
  // Stored before placements named GPU UUIDs and before submitted_by, created_at and labels:
  // missing members take their defaults, and the document is written back as it was.
  Result<Json> old = ParseJson(R"({
    "name": "old", "team": "", "queue": "default", "state": "Scheduled", "reason": "",
    "priority": 3, "submit_seq": 2, "attempt": 1,
    "placements": [{"task": "main-0", "node": "n1", "gpus": [1, 2], "group": 0, "replica": 0,
                    "cpu_milli": 0, "memory_mib": 0,
                    "assignments": [{"milli": 1000}, {"milli": 1000}]}]
  })");
  ASSERT_OK(old.status());
  const Result<JobRecord> record = JobRecordFromJson(*old, nullptr);
  ASSERT_OK(record.status());
  EXPECT_EQ(record->state, JobState::kScheduled);
  EXPECT_EQ(record->priority, 3);
  ASSERT_EQ(record->placements.size(), 1u);
  EXPECT_TRUE(record->placements[0].gpu_uuids.empty());
  EXPECT_EQ(record->placements[0].gpu_indices, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(record->placements[0].assignments[1].mig_start, -1);
  const Json written = JobRecordToJson(*record);
  EXPECT_EQ(written["placements"][0]["gpus"], (*old)["placements"][0]["gpus"]);
  EXPECT_EQ(written["priority"], 3);
  EXPECT_EQ(written["attempt"], 1);
}

TEST(JobRecord, KeepsMembersItDoesNotKnow) {
  Json doc = RunningJobDocument();
  doc["annotation_from_a_newer_server"] = {{"keep", true}};
  doc["placements"][0]["future_field"] = 42;
  doc["placements"][1]["assignments"][0]["nvlink_domain"] = "d1";
  doc["usage_run"]["future"] = "x";
  const Result<JobRecord> record = JobRecordFromJson(doc, nullptr);
  ASSERT_OK(record.status());
  EXPECT_EQ(record->placements[0].extra, (Json{{"future_field", 42}}));
  // A typed edit keeps them all.
  JobRecord edited = *record;
  edited.reason = "edited";
  Json expected = doc;
  expected["reason"] = "edited";
  EXPECT_EQ(JobRecordToJson(edited), expected);
}

TEST(JobRecord, NamesTheFieldAndValueOfABadMember) {
  struct BadMember {
    std::string json_pointer;
    Json value;
    std::string message;
  };
  const BadMember cases[] = {
      {"/state", "Running2", "state: unknown \"Running2\" (valid: Pending, Scheduled"},
      {"/attempt", "two", "attempt: expected an integer, got \"two\""},
      {"/placements/1/replica", "one", "placements[1].replica: expected an integer, got \"one\""},
      {"/placements/0/gpu_uuids/0", 7, "placements[0].gpu_uuids[0]: expected a string, got 7"},
      {"/placements/1/assignments/0/mig_created", "yes",
       "placements[1].assignments[0].mig_created: expected a boolean, got \"yes\""},
      {"/stopping", Json{{"then", "Later"}}, "stopping.then: unknown \"Later\""},
      {"/usage_run", 5, "usage_run: expected an object, got 5"},
      {"/labels/owner", 1, "labels.owner: expected a string, got 1"},
      {"/priority", int64_t{1} << 40, "priority: 1099511627776 is out of range"},
  };
  for (const BadMember& bad : cases) {
    SCOPED_TRACE(bad.json_pointer);
    Json doc = RunningJobDocument();
    doc[Json::json_pointer(bad.json_pointer)] = bad.value;
    EXPECT_THAT(JobRecordFromJson(doc, nullptr).status(),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(bad.message)));
  }
  EXPECT_THAT(JobRecordFromJson(Json::array(), nullptr).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("job: expected an object")));
}

TEST(JobRecord, ASpecThatNoLongerValidatesIsAnErrorOnlyWhenTheSpecIsRead) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Json doc = RunningJobDocument();
  doc["spec"]["spec"]["tasks"][0]["replicas"] = -1;
  EXPECT_THAT(JobRecordFromJson(doc, &catalog).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("replicas")));
  EXPECT_OK(JobRecordFromJson(doc, nullptr).status());
  doc.erase("spec");
  EXPECT_THAT(JobRecordFromJson(doc, &catalog).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("spec: required field missing")));
}

}  // namespace
}  // namespace gpufleet::wire
