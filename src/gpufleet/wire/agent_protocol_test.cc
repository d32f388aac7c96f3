// SPDX-License-Identifier: Apache-2.0
// The agent protocol's MIG fields: round trips and bad input, each error naming the field.
#include "gpufleet/wire/agent_protocol.h"

#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::wire {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(AgentProtocol, TheTasksOfOneAttemptShareARun) {
  EXPECT_EQ(RunIdOfTask(MakeTaskId("team-a/train", "workers-3", 2)), "team-a/train/2");
  EXPECT_EQ(RunIdOfTask(MakeTaskId("train", "workers-0", 2)),
            RunIdOfTask(MakeTaskId("train", "main-0", 2)));
  EXPECT_NE(RunIdOfTask(MakeTaskId("train", "main-0", 1)),
            RunIdOfTask(MakeTaskId("train", "main-0", 2)));
  EXPECT_EQ(RunIdOfTask("a/b"), "a/b");
  EXPECT_EQ(RunIdOfTask("solo"), "solo");
}

TEST(AgentProtocolJson, ReplyWithMigLayoutsAndAMigTaskRoundTrips) {
  AgentReply reply;
  reply.heartbeat_interval_ms = 5000;
  DesiredTask task;
  task.id = "infer/main-0/1";
  task.job = "infer";
  task.task = "main-0";
  task.team = "vision";
  task.queue = "research/vision";
  task.command = {"serve"};
  task.gpu_uuids = {"MIG-abc"};
  task.gpu_milli = 428;
  task.cpu_milli = 2500;
  task.memory_mib = 4096;
  task.mig_instances = {{2, "3g.40gb", 4, "MIG-abc"}};
  reply.tasks.push_back(task);
  DesiredTask share;
  share.id = "infer/share-0/1";
  share.gpu_uuids = {"GPU-abc"};
  share.gpu_milli = 250;
  share.mps = true;
  share.gpu_memory_mib = 8192;
  reply.tasks.push_back(share);
  reply.mig_layouts = {{2, {{"3g.40gb", 0}, {"3g.40gb", 4}}}, {3, {}}};

  const Result<AgentReply> parsed = ParseAgentReply(AgentReplyToJson(reply));
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->tasks.size(), 2u);
  EXPECT_FALSE(parsed->tasks[0].mps);
  EXPECT_TRUE(parsed->tasks[1].mps);
  EXPECT_EQ(parsed->tasks[1].gpu_memory_mib, 8192);
  EXPECT_EQ(parsed->tasks[0].gpu_uuids, task.gpu_uuids);
  EXPECT_EQ(parsed->tasks[0].team, "vision");
  EXPECT_EQ(parsed->tasks[0].queue, "research/vision");
  EXPECT_EQ(parsed->tasks[0].mig_instances, task.mig_instances);
  EXPECT_EQ(parsed->tasks[0].cpu_milli, 2500);
  EXPECT_EQ(parsed->tasks[0].memory_mib, 4096);
  ASSERT_EQ(parsed->mig_layouts.size(), 2u);
  EXPECT_EQ(parsed->mig_layouts[0].gpu_index, 2);
  EXPECT_EQ(parsed->mig_layouts[0].instances, reply.mig_layouts[0].instances);
  EXPECT_EQ(parsed->mig_layouts[1].gpu_index, 3);
  EXPECT_TRUE(parsed->mig_layouts[1].instances.empty()) << "no instances: destroy them all";
}

// Issue 37 item 4: a task's preemption notice; a task without one has none.
TEST(AgentProtocolJson, ANoticeRoundTripsAndItsSignalIsChecked) {
  AgentReply reply;
  reply.tasks.push_back({.id = "a/b/1", .notice = TaskNotice{"SIGUSR2", 1765119700}});
  reply.tasks.push_back({.id = "a/c/1"});
  const Result<AgentReply> parsed = ParseAgentReply(AgentReplyToJson(reply));
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->tasks.size(), 2u);
  EXPECT_EQ(parsed->tasks[0].notice, (TaskNotice{"SIGUSR2", 1765119700}));
  EXPECT_FALSE(parsed->tasks[1].notice.has_value());
  EXPECT_EQ(AgentReplyToJson(AgentReply{.tasks = {{.id = "a/c/1"}}}).find("notice"),
            std::string::npos);
  EXPECT_THAT(
      ParseAgentReply(
          R"({"tasks": [{"id": "a/b/1", "notice": {"signal": "SIGKILL", "deadline_unix_s": 5}}]})"),
      StatusIs(StatusCode::kInvalidArgument,
               HasSubstr("tasks[0].notice.signal: \"SIGKILL\" is not a notice signal")));
  EXPECT_THAT(ParseAgentReply(R"({"tasks": [{"id": "a/b/1", "notice": {"signal": "SIGUSR1"}}]})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tasks[0].notice.deadline_unix_s")));
}

TEST(AgentProtocolJson, ContainerTaskRoundTrips) {
  AgentReply reply;
  DesiredTask task;
  task.id = "train/main-0/1";
  task.command = {"sh", "-c", "true"};
  task.image = "127.0.0.1:15000/tiny:1";
  task.image_pull_policy = ImagePullPolicy::kAlways;
  task.host_network = true;
  reply.tasks.push_back(task);
  reply.tasks.push_back(DesiredTask{.id = "plain/main-0/1"});
  const Result<AgentReply> parsed = ParseAgentReply(AgentReplyToJson(reply));
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->tasks.size(), 2u);
  EXPECT_EQ(parsed->tasks[0].image, "127.0.0.1:15000/tiny:1");
  EXPECT_EQ(parsed->tasks[0].image_pull_policy, ImagePullPolicy::kAlways);
  EXPECT_TRUE(parsed->tasks[0].host_network);
  EXPECT_EQ(parsed->tasks[1].image, "");
  EXPECT_EQ(parsed->tasks[1].image_pull_policy, ImagePullPolicy::kIfNotPresent);
  EXPECT_FALSE(parsed->tasks[1].host_network);
  EXPECT_EQ(AgentReplyToJson(reply).find("image", AgentReplyToJson(reply).find("plain/")),
            std::string::npos)
      << "a process task's reply carries no image fields";
}

TEST(AgentProtocolJson, TaskReportCarriesTheImagePullTime) {
  HeartbeatRequest beat;
  beat.tasks.push_back({.id = "a/b/1", .image_pull_ms = 1234});
  beat.tasks.push_back({.id = "a/c/1"});
  const Result<HeartbeatRequest> parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->tasks.size(), 2u);
  EXPECT_EQ(parsed->tasks[0].image_pull_ms, 1234);
  EXPECT_EQ(parsed->tasks[1].image_pull_ms, std::nullopt);
  EXPECT_THAT(ParseHeartbeatRequest(R"({"tasks": [{"id": "a/b/1", "image_pull_ms": -1}]})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tasks[0].image_pull_ms")));
}

TEST(AgentProtocolJson, TaskReportCarriesTheLastCheckpoint) {
  HeartbeatRequest beat;
  beat.tasks.push_back({.id = "a/b/1", .last_checkpoint_unix_s = 1765119600});
  beat.tasks.push_back({.id = "a/c/1"});
  const Result<HeartbeatRequest> parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->tasks.size(), 2u);
  EXPECT_EQ(parsed->tasks[0].last_checkpoint_unix_s, 1765119600);
  // An agent that does not read checkpoint files leaves the field out.
  EXPECT_EQ(parsed->tasks[1].last_checkpoint_unix_s, std::nullopt);
  EXPECT_EQ(HeartbeatRequestToJson(beat).find("last_checkpoint",
                                              HeartbeatRequestToJson(beat).find("a/c/1")),
            std::string::npos);
  EXPECT_THAT(
      ParseHeartbeatRequest(R"({"tasks": [{"id": "a/b/1", "last_checkpoint_unix_s": -1}]})"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("tasks[0].last_checkpoint_unix_s")));
  EXPECT_THAT(ParseHeartbeatRequest(
                  R"({"tasks": [{"id": "a/b/1", "last_checkpoint_unix_s": 4000000001}]})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tasks[0].last_checkpoint_unix_s")));
}

TEST(AgentProtocolJson, TaskReportCarriesTheImageDigest) {
  const std::string digest = "sha256:" + std::string(64, 'a');
  HeartbeatRequest beat;
  beat.tasks.push_back({.id = "a/b/1", .image_digest = digest});
  const Result<HeartbeatRequest> parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->tasks[0].image_digest, digest);
  EXPECT_THAT(ParseHeartbeatRequest(R"({"tasks": [{"id": "a/b/1", "image_digest": "md5"}]})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tasks[0].image_digest")));
}

TEST(AgentProtocolJson, HeartbeatLinkProblemsRoundTripWithinBounds) {
  HeartbeatRequest beat;
  EXPECT_EQ(HeartbeatRequestToJson(beat).find("link_problems"), std::string::npos);
  beat.link_problems = {"mlx5_1/1: port DOWN (Disabled), not ACTIVE and LinkUp"};
  Result<HeartbeatRequest> parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->link_problems, beat.link_problems);
  // A hostile list is cut to the bounds, not refused: a refused heartbeat leaves the node
  // NotReady.
  beat.link_problems.assign(kMaxLinkProblems + 5, std::string(kMaxLinkProblemBytes + 50, 'x'));
  parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->link_problems.size(), kMaxLinkProblems);
  EXPECT_EQ(parsed->link_problems[0].size(), kMaxLinkProblemBytes);
  EXPECT_THAT(ParseHeartbeatRequest(R"({"link_problems": "eth0 down"})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("link_problems")));
}

// Issue 36: the server asks for diagnostics in its answer, the agent reports them in heartbeats;
// both fields are absent when empty, so agents and servers from before them never see one.
TEST(AgentProtocolJson, DiagnosticsRoundTripWithinBounds) {
  AgentReply reply;
  EXPECT_EQ(AgentReplyToJson(reply).find("diagnostics"), std::string::npos);
  reply.diagnostics = {{.id = "diag-7", .gpu_index = 3, .gpu_uuid = "GPU-3", .kind = "command"}};
  Result<AgentReply> parsed_reply = ParseAgentReply(AgentReplyToJson(reply));
  ASSERT_OK(parsed_reply);
  EXPECT_EQ(parsed_reply->diagnostics, reply.diagnostics);
  EXPECT_THAT(
      ParseAgentReply(R"({"diagnostics": [{"id": "d", "gpu_index": 0, "kind": "x"}]})"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("diagnostics[0].kind: unknown \"x\"")));
  EXPECT_THAT(ParseAgentReply(R"({"diagnostics": [{"id": "d"}]})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("diagnostics[0].gpu_index")));

  HeartbeatRequest beat;
  EXPECT_EQ(HeartbeatRequestToJson(beat).find("diagnostics"), std::string::npos);
  beat.diagnostics = {{.id = "diag-7",
                       .phase = DiagnosticPhase::kFailed,
                       .summary = "failed: command: exit 3",
                       .exit_code = 3,
                       .output = std::string(kMaxDiagnosticOutputBytes + 10, 'o') + "\xff",
                       .took_ms = 1200},
                      {.id = "diag-8", .phase = DiagnosticPhase::kRunning}};
  Result<HeartbeatRequest> parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->diagnostics.size(), 2u);
  EXPECT_EQ(parsed->diagnostics[0].phase, DiagnosticPhase::kFailed);
  EXPECT_EQ(parsed->diagnostics[0].exit_code, 3);
  EXPECT_EQ(parsed->diagnostics[0].took_ms, 1200);
  EXPECT_EQ(parsed->diagnostics[0].output.size(), kMaxDiagnosticOutputBytes);
  EXPECT_EQ(parsed->diagnostics[1], beat.diagnostics[1]);
  EXPECT_THAT(ParseHeartbeatRequest(R"({"diagnostics": [{"id": "d", "phase": "Broken"}]})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("diagnostics[0].phase: unknown")));
}

TEST(AgentProtocolJson, HeartbeatImagesRoundTripAndAbsentMeansUnchanged) {
  HeartbeatRequest beat;
  EXPECT_EQ(HeartbeatRequestToJson(beat).find("images"), std::string::npos);
  Result<HeartbeatRequest> parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->images, std::nullopt);
  const CachedImage image{
      {"localhost/tiny:1", "localhost/tiny:latest"}, "sha256:" + std::string(64, 'b'), 1987655};
  beat.images = std::vector<CachedImage>{image};
  parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  ASSERT_OK(parsed);
  ASSERT_TRUE(parsed->images.has_value());
  EXPECT_THAT(*parsed->images, ElementsAre(image));
  EXPECT_EQ(parsed->images_dropped, "");
  beat.images->clear();
  parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->images, std::vector<CachedImage>{}) << "an empty list: the node holds none";
}

TEST(AgentProtocolJson, HeartbeatImagesAreBoundedAndBadValuesDroppedWithAReason) {
  const std::string digest = "sha256:" + std::string(64, 'c');
  HeartbeatRequest beat;
  beat.images.emplace();
  for (size_t i = 0; i < kMaxReportedImages + 10; ++i) {
    beat.images->push_back({{fmt::format("localhost/image{}:1", i)}, digest, 1000});
  }
  beat.images->at(1).references = {"--privileged", "localhost/ok:1"};
  beat.images->at(2).digest = "sha256:nothex";
  beat.images->at(3).references.assign(kMaxReferencesPerImage + 2, "localhost/many:1");
  const Result<HeartbeatRequest> parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(beat));
  // A bad image never refuses the heartbeat (the node would go NotReady).
  ASSERT_OK(parsed);
  ASSERT_TRUE(parsed->images.has_value());
  // Image 2 is dropped, so images 0-256 but 2 are kept and the last 9 are past the bound.
  EXPECT_EQ(parsed->images->size(), kMaxReportedImages);
  EXPECT_THAT(parsed->images->at(1).references, ElementsAre("localhost/ok:1"));
  EXPECT_EQ(parsed->images->at(2).references.size(), kMaxReferencesPerImage);
  // One bad reference, one bad digest, two references past the bound, nine images past it.
  EXPECT_THAT(parsed->images_dropped, HasSubstr("13 dropped"));
  EXPECT_THAT(parsed->images_dropped, HasSubstr("images[1].references[0]"));
  EXPECT_THAT(parsed->images_dropped, HasSubstr("images[2].digest"));
  EXPECT_THAT(parsed->images_dropped, HasSubstr("images[3].references[8]: past the bound"));
  // A reason stays short whatever the agent sent.
  HeartbeatRequest huge;
  huge.images = std::vector<CachedImage>{{{std::string(100000, 'a')}, std::string(100000, 'f'), 1}};
  const Result<HeartbeatRequest> cut = ParseHeartbeatRequest(HeartbeatRequestToJson(huge));
  ASSERT_OK(cut);
  EXPECT_TRUE(cut->images->empty());
  EXPECT_LT(cut->images_dropped.size(), 700u);
  // The structure is still checked strictly.
  EXPECT_THAT(ParseHeartbeatRequest(R"({"images": {"a": 1}})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("images: expected a list")));
  EXPECT_THAT(ParseHeartbeatRequest(R"({"images": [{"digest": "x", "size_bytes": "big"}]})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("images[0].size_bytes")));
}

TEST(AgentProtocolJson, ContainerTaskFieldsAreChecked) {
  EXPECT_THAT(ParseAgentReply(R"({"tasks": [{"id": "a/b/1", "image": "--privileged"}]})"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("tasks[0].image: name component")));
  EXPECT_THAT(
      ParseAgentReply(
          R"({"tasks": [{"id": "a/b/1", "image": "a", "image_pull_policy": "Sometimes"}]})"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("tasks[0].image_pull_policy")));
  EXPECT_THAT(
      ParseAgentReply(R"({"tasks": [{"id": "a/b/1", "image": "a", "host_network": "yes"}]})"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("tasks[0].host_network")));
}

TEST(AgentProtocolJson, ReplyWithoutMigFieldsHasNone) {
  const Result<AgentReply> parsed =
      ParseAgentReply(R"({"heartbeat_interval_ms": 1000, "tasks": [{"id": "a/b/1"}]})");
  ASSERT_OK(parsed);
  EXPECT_TRUE(parsed->mig_layouts.empty());
  EXPECT_TRUE(parsed->tasks[0].mig_instances.empty());
}

TEST(AgentProtocolJson, GpuReportMigDevicesAndErrorRoundTrip) {
  HeartbeatRequest request;
  GpuReport mig;
  mig.index = 0;
  mig.mig_devices = std::vector<MigDeviceReport>{{"MIG-1", "3g.40gb", 0}, {"MIG-2", "1g.10gb", 6}};
  mig.mig_error = "gpu 0: the 3g.40gb instance at 0 is in use";
  GpuReport empty_mig;
  empty_mig.index = 1;
  empty_mig.mig_devices = std::vector<MigDeviceReport>{};
  GpuReport plain;
  plain.index = 2;
  request.gpus = {mig, empty_mig, plain};

  const Result<HeartbeatRequest> parsed = ParseHeartbeatRequest(HeartbeatRequestToJson(request));
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->gpus.size(), 3u);
  EXPECT_EQ(parsed->gpus[0].mig_devices, mig.mig_devices);
  EXPECT_EQ(parsed->gpus[0].mig_error, mig.mig_error);
  ASSERT_TRUE(parsed->gpus[1].mig_devices.has_value()) << "MIG on, no instances";
  EXPECT_TRUE(parsed->gpus[1].mig_devices->empty());
  EXPECT_FALSE(parsed->gpus[2].mig_devices.has_value()) << "no MIG";
  EXPECT_TRUE(parsed->gpus[2].mig_error.empty());
}

TEST(AgentProtocolJson, RegisterCarriesTheNodesMigInstances) {
  RegisterRequest request;
  request.node.id = NodeId("node-a");
  Gpu gpu;
  gpu.uuid = GpuUuid("GPU-0");
  gpu.model = "A100-80GB";
  gpu.mig_enabled = true;
  gpu.mig_instances = {{"3g.40gb", 0}, {"3g.40gb", 4}};
  request.node.gpus.push_back(gpu);
  const Result<RegisterRequest> parsed = ParseRegisterRequest(RegisterRequestToJson(request));
  ASSERT_OK(parsed);
  ASSERT_EQ(parsed->node.gpus.size(), 1u);
  EXPECT_TRUE(parsed->node.gpus[0].mig_enabled);
  EXPECT_EQ(parsed->node.gpus[0].mig_instances, gpu.mig_instances);
}

TEST(AgentProtocolJson, BadMigFieldsAreRefusedNamingTheField) {
  struct Case {
    const char* body;
    const char* error;
  };
  const Case replies[] = {
      {R"({"mig_layouts": {}})", "mig_layouts: expected a list"},
      {R"({"mig_layouts": [{"instances": []}]})", "mig_layouts[0].gpu_index: required field"},
      {R"({"mig_layouts": [{"gpu_index": 0}]})", "mig_layouts[0].instances: required field"},
      {R"({"mig_layouts": [{"gpu_index": 0, "instances": []}, {"gpu_index": 0, "instances": []}]})",
       "mig_layouts[1].gpu_index: duplicate GPU index 0"},
      {R"({"mig_layouts": [{"gpu_index": 0, "instances": [{"profile": "3g.40gb"}]}]})",
       "mig_layouts[0].instances[0].start: required field"},
      {R"({"mig_layouts": [{"gpu_index": 0, "instances": [{"profile": "3g.40gb", "start": 8}]}]})",
       "mig_layouts[0].instances[0].start: 8 is out of range [0, 7]"},
      {R"({"mig_layouts": [{"gpu_index": 0, "instances": [{"profile": "", "start": 0}]}]})",
       "mig_layouts[0].instances[0].profile: must not be empty"},
      {R"({"mig_layouts": [{"gpu_index": 0, "instances": [{"profile": "x", "start": 0, "uuid": "y"}]}]})",
       "mig_layouts[0].instances[0].uuid: unknown field"},
      {R"({"mig_layouts": [{"gpu_index": -1, "instances": []}]})",
       "mig_layouts[0].gpu_index: -1 is out of range"},
      {R"({"tasks": [{"id": "a/b/1", "mig_instances": [{"gpu_index": 0, "profile": "3g.40gb", "start": 0}]}]})",
       "tasks[0].mig_instances[0].uuid: required field"},
      {R"({"tasks": [{"id": "a/b/1", "mig_instances": [{"profile": "3g.40gb", "start": 0, "uuid": "M"}]}]})",
       "tasks[0].mig_instances[0].gpu_index: required field"},
      {R"({"tasks": [{"id": "a/b/1", "mig_instances": [{"gpu_index": 0, "profile": "3g.40gb", "start": 0, "uuid": ""}]}]})",
       "tasks[0].mig_instances[0].uuid: must not be empty"},
  };
  for (const Case& c : replies) {
    SCOPED_TRACE(c.body);
    const Result<AgentReply> parsed = ParseAgentReply(c.body);
    EXPECT_THAT(parsed.status(), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error));
  }
  const Case heartbeats[] = {
      {R"({"gpus": [{"index": 0, "mig_devices": {}}]})", "gpus[0].mig_devices: expected a list"},
      {R"({"gpus": [{"index": 0, "mig_devices": [{"profile": "3g.40gb", "start": 0}]}]})",
       "gpus[0].mig_devices[0].uuid: required field"},
      {R"({"gpus": [{"index": 0, "mig_devices": [{"uuid": "M", "profile": "3g.40gb", "start": 0}, {"uuid": "M", "profile": "3g.40gb", "start": 4}]}]})",
       "gpus[0].mig_devices[1].uuid: duplicate \"M\""},
      {R"({"gpus": [{"index": 0, "mig_devices": [{"uuid": "M", "profile": "3g.40gb", "start": "0"}]}]})",
       "gpus[0].mig_devices[0].start: expected an integer"},
      {R"({"gpus": [{"index": 0, "mig_error": 3}]})", "gpus[0].mig_error: expected a string"},
  };
  for (const Case& c : heartbeats) {
    SCOPED_TRACE(c.body);
    const Result<HeartbeatRequest> parsed = ParseHeartbeatRequest(c.body);
    EXPECT_THAT(parsed.status(), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error));
  }
  const Result<RegisterRequest> register_request = ParseRegisterRequest(
      R"({"node": {"name": "n", "gpus": [{"uuid": "G", "model": "A100-80GB", "mig_instances": [{"profile": "3g.40gb", "start": 0}]}]}})");
  EXPECT_THAT(register_request.status(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(register_request.status().message(),
              HasSubstr("node.gpus[0].mig_instances: set on a GPU with MIG disabled"));
}

TEST(AgentProtocolJson, DescribesMigInstances) {
  EXPECT_EQ(DescribeMigInstances({}), "none");
  EXPECT_EQ(DescribeMigInstances({{"3g.40gb", 0}, {"1g.10gb", 6}}), "3g.40gb at 0, 1g.10gb at 6");
}

TEST(TaskLogReportJson, RoundTripsAndReplacesBytesThatAreNotUtf8) {
  const TaskLogReport report{
      .task_id = "nlp/bert/main-0/1", .text = "step 1\nloss 0.5\n", .size = 4096, .final = true};
  Result<TaskLogReport> back = ParseTaskLogReport(TaskLogReportToJson(report));
  ASSERT_OK(back);
  EXPECT_EQ(*back, report);
  // A log is any bytes: a stray 0xff, and a character cut by the tail's start, go as '?', one
  // byte for one, so the size still lines up.
  Result<TaskLogReport> binary = ParseTaskLogReport(TaskLogReportToJson({.task_id = "j/main-0/1",
                                                                         .text = "\xa9"
                                                                                 "a\xff"
                                                                                 "b\xc3\xa9",
                                                                         .size = 6}));
  ASSERT_OK(binary);
  EXPECT_EQ(binary->text, "?a?b\xc3\xa9");
}

TEST(TaskLogReportJson, RefusesHostileReportsNamingTheField) {
  const auto body = [](const std::string& task_id, const std::string& text, int64_t size) {
    return fmt::format(R"({{"task_id": "{}", "text": "{}", "size": {}}})", task_id, text, size);
  };
  EXPECT_THAT(ParseTaskLogReport(body("", "x", 1)).status().message(), HasSubstr("task_id"));
  EXPECT_THAT(
      ParseTaskLogReport(body(std::string(kMaxTaskIdLength + 1, 'a'), "x", 1)).status().message(),
      HasSubstr("task_id: must hold 1 to"));
  EXPECT_THAT(
      ParseTaskLogReport(body("j/main-0/1", std::string(kMaxTaskLogTailBytes + 1, 'x'), 1 << 20))
          .status()
          .message(),
      HasSubstr("text: 16385 bytes"));
  EXPECT_THAT(ParseTaskLogReport(body("j/main-0/1", "xyz", 2)).status().message(),
              HasSubstr("size: 2 is less than the 3 bytes"));
  EXPECT_THAT(ParseTaskLogReport(body("j/main-0/1", "x", -1)),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTaskLogReport(R"({"task_id": "j/main-0/1", "size": 1, "final": "yes"})")
                  .status()
                  .message(),
              HasSubstr("final: expected true or false"));
  EXPECT_THAT(
      ParseTaskLogReport(R"({"task_id": "j/main-0/1", "size": 1, "extra": 1})").status().message(),
      HasSubstr("extra: unknown field"));
  EXPECT_THAT(ParseTaskLogReport(std::string(7 * kMaxTaskLogTailBytes, ' ')).status().message(),
              HasSubstr("more than"));
}

TEST(ProvenanceReportJson, RoundTripsWithSortedEnvNames) {
  ProvenanceReport report;
  report.task_id = "ml/bert/main-0/2";
  report.image = "localhost/tiny:1";
  report.image_digest = "sha256:" + std::string(64, 'a');
  report.driver_version = "550.54.15";
  report.cuda_version = "12.4";
  report.nvml_version = "12.550.54.15";
  report.gpus = {{"GPU-1", "1320123456789", "96.00.89.00.01"}};
  report.command = {"python", "train.py"};
  report.env_names = {"PATH", "CUDA_VISIBLE_DEVICES"};
  Result<ProvenanceReport> parsed = ParseProvenanceReport(ProvenanceReportToJson(report));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_THAT(parsed->env_names, ElementsAre("CUDA_VISIBLE_DEVICES", "PATH"));
  parsed.value().env_names = report.env_names;
  EXPECT_EQ(*parsed, report);
}

TEST(ProvenanceReportJson, RefusesHostileReports) {
  struct Case {
    std::string body;
    std::string error;
  };
  const std::string many_gpus = [] {
    std::string gpus;
    for (size_t i = 0; i <= kMaxProvenanceGpus; ++i) {
      gpus += fmt::format("{}{{\"uuid\": \"GPU-{}\"}}", i == 0 ? "" : ",", i);
    }
    return R"({"task_id": "a/b/1", "gpus": [)" + gpus + "]}";
  }();
  const Case cases[] = {
      {R"({"task_id": "a/b/1", "env_names": ["TOKEN=hunter2"]})",
       "env_names[0]: not an environment variable name"},
      {R"({"task_id": "a/b/1", "env_names": ["A", "A"]})", "env_names[1]: duplicate name"},
      {R"({"task_id": "a/b/1", "env": {"A": "b"}})", "env: unknown field"},
      {R"({"image": "x"})", "task_id: required field missing"},
      {R"({"task_id": "a/b/1", "image": "-rm"})", "image:"},
      {R"({"task_id": "a/b/1", "image_digest": "md5:x"})", "image_digest:"},
      {R"({"task_id": "a/b/1", "gpus": [{"uuid": "G"}, {"uuid": "G"}]})",
       "gpus[1].uuid: duplicate GPU"},
      {R"({"task_id": "a/b/1", "driver_version": ")" + std::string(300, 'x') + R"("})",
       "driver_version: 300 bytes, more than 256"},
      {many_gpus, "more than 64 GPUs"},
      {R"({"task_id": "a/b/1", "command": [")" + std::string(70000, 'x') + R"("]})",
       "body: 70037 bytes, more than the 65536 bytes a provenance report may hold"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 200));
    const Result<ProvenanceReport> parsed = ParseProvenanceReport(c.body);
    EXPECT_THAT(parsed.status(), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.error));
    EXPECT_THAT(parsed.status().message(), ::testing::Not(HasSubstr("hunter2")));
  }
}

// The skew policy of docs/operations.md on a server of protocol 1.5: its own minor and the one
// before are served; a newer minor, a minor two back and another major are refused with both
// versions named.
TEST(AgentProtocolVersion, ServerServesItsMinorAndTheOneBefore) {
  const ProtocolVersion server{1, 5};
  EXPECT_OK(CheckAgentProtocol({1, 5}, "0.5.0", server));
  EXPECT_OK(CheckAgentProtocol({1, 4}, "0.4.0", server));
  EXPECT_THAT(CheckAgentProtocol({1, 6}, "0.6.0", server),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("agent protocol 1.6 (agent 0.6.0) is newer than this server's "
                                 "1.5: upgrade the servers before the agents")));
  EXPECT_THAT(CheckAgentProtocol({1, 3}, "0.3.0", server),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("agent protocol 1.3 (agent 0.3.0) is too old for this server's "
                                 "1.5 (it serves 1.4 to 1.5): upgrade the agent")));
  EXPECT_THAT(CheckAgentProtocol({2, 5}, "", server),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("agent protocol 2.5 is newer")));
  EXPECT_THAT(
      CheckAgentProtocol({0, 5}, "", server),
      StatusIs(StatusCode::kFailedPrecondition, HasSubstr("agent protocol 0.5 is too old")));
}

// 1.2 (notices) serves 1.1, the last release; the agents that sent no version speak 1.0 and are
// refused as too old, as docs/operations.md says they will be once 1.0 is no longer served.
TEST(AgentProtocolVersion, ThisBuildServesTheLastReleaseAndRefusesUnversionedAgentsAsTooOld) {
  EXPECT_OK(CheckAgentProtocol(kAgentProtocolVersion, "", kAgentProtocolVersion));
  EXPECT_OK(CheckAgentProtocol({1, 1}, "", kAgentProtocolVersion));
  EXPECT_THAT(CheckAgentProtocol(kUnversionedAgentProtocol, "", kAgentProtocolVersion),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("agent protocol 1.0 is too old for this server's 1.2")));
}

TEST(AgentProtocolVersion, RefusalsAreKnownByTheAgent) {
  EXPECT_TRUE(IsAgentProtocolRefusal(CheckAgentProtocol({1, 6}, "", {1, 5})));
  EXPECT_TRUE(IsAgentProtocolRefusal(CheckAgentProtocol({1, 3}, "", {1, 5})));
  EXPECT_FALSE(IsAgentProtocolRefusal(FailedPreconditionError("node \"n1\" is not registered")));
  EXPECT_FALSE(IsAgentProtocolRefusal(Status::Ok()));
}

TEST(AgentProtocolVersion, RegistrationAndHeartbeatCarryTheVersion) {
  RegisterRequest registration;
  registration.node.id = NodeId("n1");
  registration.agent_version = "0.2.0 (commit abc)";
  const Result<RegisterRequest> registered =
      ParseRegisterRequest(RegisterRequestToJson(registration));
  ASSERT_OK(registered);
  EXPECT_EQ(registered->protocol, kAgentProtocolVersion);
  EXPECT_EQ(registered->agent_version, "0.2.0 (commit abc)");

  HeartbeatRequest heartbeat;
  heartbeat.protocol = {1, 7};
  const Result<HeartbeatRequest> beat = ParseHeartbeatRequest(HeartbeatRequestToJson(heartbeat));
  ASSERT_OK(beat);
  EXPECT_EQ(beat->protocol, (ProtocolVersion{1, 7}));
  EXPECT_EQ(beat->agent_version, "");
}

TEST(AgentProtocolVersion, AMissingVersionReadsAsTheUnversionedProtocol) {
  const Result<HeartbeatRequest> beat = ParseHeartbeatRequest(R"({"gpus": [], "sequence": 3})");
  ASSERT_OK(beat);
  EXPECT_EQ(beat->protocol, kUnversionedAgentProtocol);
  RegisterRequest registration;
  registration.node.id = NodeId("n1");
  Result<nlohmann::json> unversioned = ParseJson(RegisterRequestToJson(registration));
  ASSERT_OK(unversioned);
  ASSERT_EQ(unversioned->erase("protocol"), 1u);
  const Result<RegisterRequest> registered = ParseRegisterRequest(unversioned->dump());
  ASSERT_OK(registered);
  EXPECT_EQ(registered->protocol, kUnversionedAgentProtocol);
}

// A newer agent's request that the reader refuses (a field it added) is answered with the
// version refusal; a request of a served version keeps the reader's error.
TEST(AgentProtocolVersion, ARefusedRequestOfANewerAgentHearsAboutVersions) {
  EXPECT_THAT(CheckProtocolOfRefusedRequest(
                  R"({"protocol": "1.6", "agent_version": "0.6.0", "new_field": 1})", {1, 5}),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("agent protocol 1.6 (agent 0.6.0) is newer than this server's "
                                 "1.5")));
  EXPECT_OK(CheckProtocolOfRefusedRequest(R"({"protocol": "1.5", "new_field": 1})", {1, 5}));
  EXPECT_OK(CheckProtocolOfRefusedRequest(R"({"new_field": 1})", {1, 5}));
  EXPECT_OK(CheckProtocolOfRefusedRequest(R"({"protocol": "x"})", {1, 5}));
  EXPECT_OK(CheckProtocolOfRefusedRequest("not json", {1, 5}));
}

TEST(AgentProtocolVersion, BadVersionsNameTheField) {
  for (const char* bad :
       {R"("1")", R"("1.1.0")", R"("a.b")", R"("1.-1")", R"("")", R"("12345.1")", R"(11)"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(ParseHeartbeatRequest(fmt::format(R"({{"protocol": {}}})", bad)).status(),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("protocol: ")));
  }
  EXPECT_THAT(ParseProtocolVersion("1.x"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("\"1.x\" is not a protocol version MAJOR.MINOR")));
  const Result<ProtocolVersion> padded = ParseProtocolVersion("01.10");
  ASSERT_OK(padded);
  EXPECT_EQ(*padded, (ProtocolVersion{1, 10}));
}

}  // namespace
}  // namespace gpufleet::wire
