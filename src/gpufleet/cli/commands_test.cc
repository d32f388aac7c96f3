// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/commands.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/http/testing/fake_transport.h"

namespace gpufleet::cli {
namespace {

using ::gpufleet::http_testing::FakeClient;
using ::gpufleet::http_testing::RecordedRequest;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kJob[] =
    R"({"name": "bert", "team": "nlp", "queue": "default", "state": "Pending",
        "created_at": "2026-11-29T20:58:00Z", "reason": "no node fits", "placements": [],
        "version": 1})";
constexpr char kNode[] =
    R"({"name": "node-0001", "state": "Cordoned", "gpus": [
        {"index": 0, "model": "H100-80GB", "health": "Healthy", "allocated_milli": 0}],
        "version": 2})";
constexpr char kNotFound[] =
    R"({"error": {"code": "NOT_FOUND", "message": "job \"nope\" not found"}})";

class CommandsTest : public ::testing::Test {
 protected:
  const RecordedRequest& OnlyRequest() {
    EXPECT_EQ(fake_.state->requests.size(), 1U);
    return fake_.state->requests.at(0);
  }

  FakeClient fake_{"tok"};
  // 2026-11-29T21:00:00Z.
  FakeClock clock_{MonoTime{int64_t{1795986000} * 1'000'000'000}};
  std::ostringstream out_;
  std::ostringstream err_;
};

class SubmitTest : public CommandsTest {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gpufleet_cli_submit_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::filesystem::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

  std::filesystem::path dir_;
};

TEST_F(SubmitTest, PostsYamlAndPrintsCreated) {
  const std::string spec = "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata:\n  name: bert\n";
  const std::string path = Write("job.yaml", spec);
  fake_.Answer("POST /v1/jobs", 201, kJob);
  EXPECT_EQ(RunSubmit(fake_.client, {.file = path}, out_, err_), 0);
  EXPECT_EQ(out_.str(), "job/bert created\n");
  EXPECT_EQ(err_.str(), "");
  const RecordedRequest& request = OnlyRequest();
  EXPECT_EQ(request.method, "POST");
  EXPECT_EQ(request.path, "/v1/jobs");
  EXPECT_EQ(request.body, spec);
  EXPECT_EQ(request.content_type, "application/yaml");
  EXPECT_EQ(request.token, "tok");
}

// The server's warnings (a job no node could ever hold) go to stderr; --strict asks it to refuse.
TEST_F(SubmitTest, WarningsGoToStderrAndStrictIsAsked) {
  const std::string path = Write("job.yaml", "a: b");
  fake_.Answer(
      "POST /v1/jobs", 201,
      R"({"name": "wide", "warnings": ["spec.tasks[0].resources.gpus: never fits: 16 GPUs per task"]})");
  EXPECT_EQ(RunSubmit(fake_.client, {.file = path}, out_, err_), 0);
  EXPECT_EQ(out_.str(), "job/wide created\n");
  EXPECT_EQ(err_.str(), "warning: spec.tasks[0].resources.gpus: never fits: 16 GPUs per task\n");
  fake_.Answer("POST /v1/jobs?strict=true", 400,
               R"({"error": {"code": "FAILED_PRECONDITION", "message": "never fits, strict"}})");
  EXPECT_EQ(RunSubmit(fake_.client, {.file = path, .strict = true}, out_, err_), 1);
  EXPECT_THAT(err_.str(), HasSubstr("never fits, strict"));
  ASSERT_EQ(fake_.state->requests.size(), 2U);
  EXPECT_EQ(fake_.state->requests[1].path, "/v1/jobs?strict=true");
}

TEST_F(SubmitTest, ContentTypeFollowsTheExtension) {
  fake_.Answer("POST /v1/jobs", 201, kJob);
  EXPECT_EQ(RunSubmit(fake_.client, {.file = Write("job.JSON", "{}")}, out_, err_), 0);
  EXPECT_EQ(RunSubmit(fake_.client, {.file = Write("job.yml", "a: b")}, out_, err_), 0);
  EXPECT_EQ(RunSubmit(fake_.client, {.file = Write("job", " {\"a\": 1}")}, out_, err_), 0);
  EXPECT_EQ(RunSubmit(fake_.client, {.file = Write("job.txt", "a: 1")}, out_, err_), 0);
  ASSERT_EQ(fake_.state->requests.size(), 4U);
  EXPECT_EQ(fake_.state->requests[0].content_type, "application/json");
  EXPECT_EQ(fake_.state->requests[1].content_type, "application/yaml");
  EXPECT_EQ(fake_.state->requests[2].content_type, "application/json");
  EXPECT_EQ(fake_.state->requests[3].content_type, "application/yaml");
}

TEST_F(SubmitTest, CreateDeploymentPostsTheFile) {
  const std::string spec = R"({"name": "chat", "template": {}})";
  fake_.Answer("POST /v1/deployments", 201, R"({"name": "chat", "desired_replicas": 1})");
  EXPECT_EQ(
      RunCreate(fake_.client, {.kind = "deployment", .file = Write("chat.json", spec)}, out_, err_),
      0);
  EXPECT_EQ(out_.str(), "deployment/chat created\n");
  const RecordedRequest& request = OnlyRequest();
  EXPECT_EQ(request.path, "/v1/deployments");
  EXPECT_EQ(request.body, spec);
  EXPECT_EQ(request.content_type, "application/json");
}

TEST_F(SubmitTest, CreateDeploymentNeedsAFileAndShowsTheServersError) {
  EXPECT_EQ(RunCreate(fake_.client, {.kind = "deployment"}, out_, err_), 1);
  EXPECT_EQ(err_.str(), "error: usage: create deployment -f FILE\n");
  EXPECT_TRUE(fake_.state->requests.empty());
  err_.str("");
  fake_.Answer("POST /v1/deployments", 400,
               R"({"error": {"code": "INVALID_ARGUMENT", "message": "name: required"}})");
  EXPECT_EQ(
      RunCreate(fake_.client, {.kind = "deployment", .file = Write("d.json", "{}")}, out_, err_),
      1);
  EXPECT_EQ(err_.str(), "Error from server (InvalidArgument): name: required\n");
}

TEST_F(SubmitTest, CreateDeploymentSendsAYamlFileAsYaml) {
  const std::string spec = "name: chat\ntemplate: {}\n";
  fake_.Answer("POST /v1/deployments", 201, R"({"name": "chat"})");
  EXPECT_EQ(
      RunCreate(fake_.client, {.kind = "deployment", .file = Write("chat.yaml", spec)}, out_, err_),
      0);
  EXPECT_EQ(out_.str(), "deployment/chat created\n");
  EXPECT_EQ(OnlyRequest().body, spec);
  EXPECT_EQ(OnlyRequest().content_type, "application/yaml");
}

TEST_F(CommandsTest, DeleteDeploymentSendsDelete) {
  fake_.Answer("DELETE /v1/deployments/chat", 200,
               R"({"name": "chat", "deleted": true, "cancelled_replicas": ["chat-r0"]})");
  EXPECT_EQ(RunDelete(fake_.client, {.kind = "deployment", .name = "chat"}, out_, err_), 0);
  EXPECT_EQ(out_.str(), "deployment/chat deleted\n");
  EXPECT_EQ(OnlyRequest().method, "DELETE");
}

TEST_F(CommandsTest, DeleteDeploymentShowsNotFound) {
  fake_.Answer("DELETE /v1/deployments/nope", 404,
               R"({"error": {"code": "NOT_FOUND", "message": "deployment \"nope\" not found"}})");
  EXPECT_EQ(RunDelete(fake_.client, {.kind = "deploy", .name = "nope"}, out_, err_), 1);
  EXPECT_EQ(err_.str(), "Error from server (NotFound): deployment \"nope\" not found\n");
  err_.str("");
  EXPECT_EQ(RunDelete(fake_.client, {.kind = "deployment"}, out_, err_), 1);
  EXPECT_EQ(err_.str(), "error: usage: delete deployment NAME\n");
}

TEST_F(CommandsTest, UpdateDeploymentPatchesOnlyTheNamedOptions) {
  fake_.Answer("PATCH /v1/deployments/chat", 200, R"({"name": "chat"})");
  EXPECT_EQ(RunUpdate(fake_.client,
                      {.kind = "deployment", .name = "chat", .max_replicas = 6, .target_pct = 60},
                      out_, err_),
            0);
  EXPECT_EQ(out_.str(), "deployment/chat updated\n");
  EXPECT_EQ(nlohmann::json::parse(OnlyRequest().body),
            nlohmann::json::parse(
                R"({"autoscaling": {"max_replicas": 6, "target_utilization_pct": 60}})"));
  EXPECT_EQ(OnlyRequest().method, "PATCH");
}

TEST_F(CommandsTest, UpdateDeploymentRefusesBadArgumentsAndShowsTheServersError) {
  EXPECT_EQ(RunUpdate(fake_.client, {.kind = "deployment", .name = "chat"}, out_, err_), 1);
  EXPECT_EQ(
      RunUpdate(fake_.client, {.kind = "deployment", .name = "chat", .weight = 2.0}, out_, err_),
      1);
  EXPECT_EQ(err_.str(),
            "error: update deployment needs at least one of --min, --max, --target\n"
            "error: update deployment takes --min, --max and --target; the others are for "
            "queues\n");
  EXPECT_TRUE(fake_.state->requests.empty());
  err_.str("");
  fake_.Answer("PATCH /v1/deployments/chat", 400,
               R"json({"error": {"code": "INVALID_ARGUMENT",
                   "message": "autoscaling.max_replicas: 1 (must be >= min_replicas 2)"}})json");
  EXPECT_EQ(RunUpdate(fake_.client, {.kind = "deployment", .name = "chat", .max_replicas = 1}, out_,
                      err_),
            1);
  EXPECT_EQ(err_.str(),
            "Error from server (InvalidArgument): autoscaling.max_replicas: 1 (must "
            "be >= min_replicas 2)\n");
}

TEST_F(CommandsTest, DescribeDeploymentShowsSpecStatusReplicasAndEvents) {
  fake_.Answer("GET /v1/deployments/chat", 200,
               R"({"name": "chat", "team": "nlp", "queue": "default",
                   "created_at": "2026-11-29T20:58:00Z", "version": 7,
                   "template": {"spec": {"tasks": [{"resources":
                     {"gpus": {"count": 1, "model": "H100-80GB"}}}]}},
                   "autoscaling": {"min_replicas": 1, "max_replicas": 3,
                                   "target_utilization_pct": 70, "tolerance_pct": 10},
                   "desired_replicas": 2, "ready_replicas": 1, "utilization_pct": 91,
                   "reason": "91% against 70%", "replicas": ["chat-r0", "chat-r1"]})");
  fake_.Answer("GET /v1/deployments/chat/events", 200,
               R"({"items": [{"revision": 1, "message": "created by alice with 1 replicas",
                              "at": "2026-11-29T20:58:00Z"},
                             {"revision": 2, "message": "scaled 1 -> 2",
                              "at": "2026-11-29T21:03:10Z"}]})");
  // The replicas are jobs of the deployment's team, asked for as TEAM/NAME (an admin's bare
  // name could be ambiguous).
  fake_.Answer("GET /v1/jobs/nlp/chat-r0", 200, R"({"name": "chat-r0", "state": "Running"})");
  fake_.Answer("GET /v1/jobs/nlp/chat-r1", 404, kNotFound);
  EXPECT_EQ(RunDescribe(fake_.client, {.kind = "deployment", .name = "chat"}, clock_, out_, err_),
            0)
      << err_.str();
  EXPECT_EQ(out_.str(),
            "Name:        chat\n"
            "Team:        nlp\n"
            "Queue:       default\n"
            "Created:     2026-11-29T20:58:00Z\n"
            "GPUs:        1 x H100-80GB per replica\n"
            "Autoscaling: min 1, max 3, target 70% (tolerance 10%)\n"
            "Replicas:    2 desired, 1 ready\n"
            "Utilization: 91%\n"
            "Reason:      91% against 70%\n"
            "Version:     7\n"
            "Replica jobs:\n"
            "  JOB       STATE\n"
            "  chat-r0   Running\n"
            "  chat-r1   <gone>\n"
            "Events:\n"
            "  REVISION   TIME                   MESSAGE\n"
            "  1          2026-11-29T20:58:00Z   created by alice with 1 replicas\n"
            "  2          2026-11-29T21:03:10Z   scaled 1 -> 2\n");
}

TEST_F(CommandsTest, ExplainJobPrintsReasonEtaAheadAndWhatIfs) {
  fake_.Answer("GET /v1/jobs/team-a/big/explain", 200,
               R"({"job": "big", "phase": "Pending", "reason": "topology",
                   "message": "no leaf holds the whole gang", "queuePosition": 3,
                   "evidence": {"nodes": {"fits": 2, "capacity": 2, "constraints": 0,
                                          "health": 0},
                                "neededGpus": 16, "freeGpus": 16,
                                "bestDomain": {"level": "leaf", "name": "leaf-0",
                                               "freeGpus": 8, "totalGpus": 16,
                                               "lacksGpus": 8}},
                   "ahead": [{"name": "a", "gpus": 8}, {"hidden": 1}],
                   "eta": {"at": "2026-12-03T11:00:00Z", "inSeconds": 250,
                           "why": "the backfill plan"},
                   "whatIf": [{"change": "topology.required=block", "wouldStartNow": true,
                               "detail": "it would start on 2 nodes"}]})");
  EXPECT_EQ(RunExplain(fake_.client, {.kind = "job", .name = "team-a/big"}, out_, err_), 0)
      << err_.str();
  EXPECT_EQ(out_.str(),
            "Job:         big (Pending, number 3 in the queue)\n"
            "Reason:      topology\n"
            "Message:     no leaf holds the whole gang\n"
            "Nodes:       2 fit a task now, 2 lack free resources, 0 are excluded by its "
            "constraints, 0 are unhealthy or not Ready\n"
            "GPUs:        needs 16, 16 free that it may use\n"
            "Best domain: leaf leaf-0: 8 GPUs free of 16, lacks 8\n"
            "ETA:         2026-12-03T11:00:00Z (in 4m10s; the backfill plan)\n"
            "Ahead:\n"
            "  JOB                  GPUS\n"
            "  a                    8\n"
            "  (1 of other teams)\n"
            "What if:\n"
            "  WHAT IF                   STARTS NOW   DETAIL\n"
            "  topology.required=block   yes          it would start on 2 nodes\n");
}

TEST_F(CommandsTest, LogsPrintsEachTasksTailAndSaysWhatIsMissing) {
  fake_.Answer("GET /v1/jobs/nlp/bert/logs", 200,
               R"({"job": "bert", "state": "Running", "items": [
                   {"task": "main-0", "attempt": 1, "node": "node-1", "text": "step 1\nstep 2\n",
                    "size": 1014, "from": 1000, "final": false},
                   {"task": "main-1", "attempt": 1, "node": "node-2", "text": null,
                    "why": "no log received yet"}]})");
  const auto no_wait = [](std::chrono::milliseconds) { FAIL() << "logs without -f waited"; };
  EXPECT_EQ(RunLogs(fake_.client, {.name = "nlp/bert"}, no_wait, out_, err_), 0) << err_.str();
  EXPECT_EQ(out_.str(), "[main-0] step 1\n[main-0] step 2\n");
  EXPECT_THAT(err_.str(), HasSubstr("[main-0: 1000 bytes before this are on node node-1 only]"));
  EXPECT_THAT(err_.str(), HasSubstr("main-1#1 on node node-2: no log received yet"));
  // One task: its name goes in the query (encoded), lines as they are.
  fake_.Answer("GET /v1/jobs/nlp/bert/logs?task=main-0", 200,
               R"({"job": "bert", "state": "Running", "items": [
                   {"task": "main-0", "attempt": 1, "node": "node-1", "text": "only\n",
                    "size": 5, "final": false}]})");
  out_.str("");
  EXPECT_EQ(RunLogs(fake_.client, {.name = "nlp/bert", .task = "main-0"}, no_wait, out_, err_), 0);
  EXPECT_EQ(out_.str(), "only\n");
}

TEST_F(CommandsTest, LogsOfAJobWithoutRunsOrNotFound) {
  fake_.Answer("GET /v1/jobs/waiting/logs", 200,
               R"({"job": "waiting", "state": "Pending", "items": [],
                   "why": "the job has no runs yet: no task of it has started"})");
  const auto no_wait = [](std::chrono::milliseconds) {};
  EXPECT_EQ(RunLogs(fake_.client, {.name = "waiting"}, no_wait, out_, err_), 0);
  EXPECT_EQ(out_.str(), "");
  EXPECT_THAT(err_.str(), HasSubstr("job waiting (Pending): the job has no runs yet"));
  err_.str("");
  fake_.Answer("GET /v1/jobs/nope/logs", 404, kNotFound);
  EXPECT_EQ(RunLogs(fake_.client, {.name = "nope"}, no_wait, out_, err_), 1);
  EXPECT_THAT(err_.str(), HasSubstr("Error from server (NotFound)"));
  EXPECT_EQ(RunLogs(fake_.client, {}, no_wait, out_, err_), 1);
}

// -f prints what is new at each answer, once, and stops once the job ended and each task's
// final tail was printed.
TEST_F(CommandsTest, LogsFollowPrintsWhatIsNewUntilTheFinalTail) {
  const std::vector<std::string> answers = {
      R"({"job": "j", "state": "Running", "items": [{"task": "main-0", "attempt": 1,
          "node": "n", "text": "a\n", "size": 2, "final": false}]})",
      R"({"job": "j", "state": "Running", "items": [{"task": "main-0", "attempt": 1,
          "node": "n", "text": "a\nb\n", "size": 4, "final": false}]})",
      R"({"job": "j", "state": "Succeeded", "items": [{"task": "main-0", "attempt": 1,
          "node": "n", "text": "a\nb\nc\n", "size": 6, "final": true}]})"};
  size_t next = 0;
  fake_.Answer("GET /v1/jobs/j/logs", 200, answers[next++]);
  std::vector<std::chrono::milliseconds> waits;
  const auto wait = [&](std::chrono::milliseconds pause) {
    waits.push_back(pause);
    ASSERT_LT(next, answers.size()) << "asked again after the final tail";
    fake_.Answer("GET /v1/jobs/j/logs", 200, answers[next++]);
  };
  EXPECT_EQ(RunLogs(fake_.client, {.name = "j", .follow = true}, wait, out_, err_), 0)
      << err_.str();
  EXPECT_EQ(out_.str(), "a\nb\nc\n");
  EXPECT_EQ(waits, std::vector<std::chrono::milliseconds>(2, kLogsFollowInterval));
  // A job that ended without a final tail is asked a bounded number of times.
  fake_.Answer("GET /v1/jobs/k/logs", 200,
               R"({"job": "k", "state": "Failed", "items": [{"task": "main-0", "attempt": 1,
                   "node": "n", "text": null, "why": "no log received yet"}]})");
  int asked = 0;
  EXPECT_EQ(RunLogs(
                fake_.client, {.name = "k", .follow = true},
                [&](std::chrono::milliseconds) { ++asked; }, out_, err_),
            0);
  EXPECT_EQ(asked, kLogsFollowPollsAfterEnd);
}

TEST_F(CommandsTest, ExplainRefusesOtherKindsAndReportsNotFound) {
  EXPECT_EQ(RunExplain(fake_.client, {.kind = "node", .name = "n"}, out_, err_), 1);
  EXPECT_THAT(err_.str(), HasSubstr("explain takes job"));
  err_.str("");
  fake_.Answer("GET /v1/jobs/nope/explain", 404,
               R"({"error": {"code": "NOT_FOUND", "message": "job \"nope\" not found"}})");
  EXPECT_EQ(RunExplain(fake_.client, {.kind = "job", .name = "nope"}, out_, err_), 1);
  EXPECT_EQ(err_.str(), "Error from server (NotFound): job \"nope\" not found\n");
}

TEST_F(CommandsTest, DescribeDeploymentNotFound) {
  fake_.Answer("GET /v1/deployments/nope", 404,
               R"({"error": {"code": "NOT_FOUND", "message": "deployment \"nope\" not found"}})");
  EXPECT_EQ(RunDescribe(fake_.client, {.kind = "deployment", .name = "nope"}, clock_, out_, err_),
            1);
  EXPECT_EQ(err_.str(), "Error from server (NotFound): deployment \"nope\" not found\n");
  EXPECT_TRUE(out_.str().empty());
}

TEST_F(CommandsTest, GetDeploymentsPrintsTheTable) {
  fake_.Answer(
      "GET /v1/deployments", 200,
      R"({"items": [{"name": "chat", "team": "nlp", "desired_replicas": 3, "ready_replicas": 2,
                   "utilization_pct": 91, "autoscaling": {"target_utilization_pct": 70},
                   "created_at": "2026-11-29T20:58:00Z"},
                  {"name": "embed", "desired_replicas": 1, "ready_replicas": 0,
                   "utilization_pct": null, "autoscaling": {"target_utilization_pct": 60}}]})");
  EXPECT_EQ(RunGet(fake_.client, {.kind = "deployments"}, clock_, out_, err_), 0);
  EXPECT_EQ(out_.str(),
            "NAME    TEAM     DESIRED   READY   UTIL        TARGET   AGE\n"
            "chat    nlp      3         2       91%         70%      2m\n"
            "embed   <none>   1         0       <unknown>   60%      <unknown>\n");
  EXPECT_EQ(OnlyRequest().path, "/v1/deployments");
}

TEST_F(CommandsTest, GetDeploymentByNameAndItsErrors) {
  fake_.Answer("GET /v1/deployments/chat", 200, R"({"name": "chat", "desired_replicas": 2})");
  EXPECT_EQ(RunGet(fake_.client, {.kind = "deployment", .name = "chat", .output = "json"}, clock_,
                   out_, err_),
            0);
  EXPECT_THAT(out_.str(), HasSubstr("\"desired_replicas\": 2"));
  EXPECT_EQ(RunGet(fake_.client, {.kind = "deployments", .state = "Running"}, clock_, out_, err_),
            1);
  EXPECT_EQ(err_.str(), "error: --state and --queue filter jobs only\n");
}

TEST_F(CommandsTest, CreateRejectsBadArgumentsWithoutCalling) {
  EXPECT_EQ(RunCreate(fake_.client, {.kind = "job", .name = "x"}, out_, err_), 1);
  EXPECT_EQ(RunCreate(fake_.client, {.kind = "team"}, out_, err_), 1);
  EXPECT_EQ(RunCreate(fake_.client, {.kind = "token", .token_name = "x"}, out_, err_), 1);
  EXPECT_EQ(err_.str(),
            "error: create takes team, queue, token or deployment, not \"job\"\n"
            "error: usage: create team NAME\n"
            "error: usage: create token --role admin|member|agent [--team TEAM] [--node NODE] "
            "--name NAME\n");
  EXPECT_TRUE(fake_.state->requests.empty());
}

TEST_F(CommandsTest, CreateForbiddenIsShownVerbatim) {
  fake_.Answer("POST /v1/teams", 403,
               R"({"error": {"code": "PERMISSION_DENIED",
                             "message": "creating a team needs an admin token"}})");
  EXPECT_EQ(RunCreate(fake_.client, {.kind = "team", .name = "nlp"}, out_, err_), 1);
  EXPECT_EQ(err_.str(),
            "Error from server (PermissionDenied): creating a team needs an admin token\n");
}

TEST_F(CommandsTest, DeleteQueueEncodesEachSegmentAndShowsARefusal) {
  fake_.Answer("DELETE /v1/queues/research/nlp%20x", 200,
               R"({"name": "research/nlp x", "deleted": true})");
  EXPECT_EQ(RunDelete(fake_.client, {.kind = "queue", .name = "research/nlp x"}, out_, err_), 0);
  EXPECT_EQ(out_.str(), "queue/research/nlp x deleted\n");
  fake_.Answer("DELETE /v1/queues/research", 409,
               R"({"error": {"code": "FAILED_PRECONDITION",
                             "message": "queue \"research\" is in use: 1 child queues"}})");
  EXPECT_EQ(RunDelete(fake_.client, {.kind = "queue", .name = "research"}, out_, err_), 1);
  EXPECT_EQ(
      err_.str(),
      "Error from server (FailedPrecondition): queue \"research\" is in use: 1 child queues\n");
  err_.str("");
  EXPECT_EQ(RunDelete(fake_.client, {.kind = "team", .name = "nlp"}, out_, err_), 1);
  EXPECT_EQ(err_.str(), "error: delete takes queue, node or deployment, not \"team\"\n");
}

TEST_F(CommandsTest, RevokeTokenAndGetTokens) {
  fake_.Answer("POST /v1/tokens/0a1b2c3d4e5f/revoke", 200,
               R"({"id": "0a1b2c3d4e5f", "revoked": true})");
  EXPECT_EQ(RunRevoke(fake_.client, {.kind = "token", .id = "0a1b2c3d4e5f"}, out_, err_), 0);
  EXPECT_EQ(out_.str(), "token/0a1b2c3d4e5f revoked\n");
  EXPECT_EQ(RunRevoke(fake_.client, {.kind = "team", .id = "nlp"}, out_, err_), 1);
  EXPECT_EQ(err_.str(), "error: revoke takes token, not \"team\"\n");

  fake_.Answer(
      "GET /v1/tokens", 200,
      R"({"items": [{"id": "0a1b2c3d4e5f", "role": "admin", "team": "", "name": "admin"}]})");
  out_.str("");
  EXPECT_EQ(RunGet(fake_.client, {.kind = "token", .name = "0a1b2c3d4e5f"}, clock_, out_, err_), 0);
  EXPECT_EQ(out_.str(),
            "ID             ROLE    TEAM     NAME\n0a1b2c3d4e5f   admin   <none>   admin\n");
}

TEST_F(CommandsTest, CancelPostsWithoutBody) {
  fake_.Answer("POST /v1/jobs/bert/cancel", 200, kJob);
  EXPECT_EQ(RunCancel(fake_.client, "bert", out_, err_), 0);
  EXPECT_EQ(out_.str(), "job/bert cancelled\n");
  EXPECT_EQ(OnlyRequest().method, "POST");
  EXPECT_EQ(OnlyRequest().body, "");
  EXPECT_EQ(OnlyRequest().content_type, "");
  EXPECT_EQ(OnlyRequest().token, "tok");
}

TEST_F(CommandsTest, TeamSlashNameKeepsItsSlashInThePath) {
  fake_.Answer("POST /v1/jobs/team-b/train/cancel", 200, kJob);
  EXPECT_EQ(RunCancel(fake_.client, "team-b/train", out_, err_), 0) << err_.str();
  EXPECT_EQ(OnlyRequest().path, "/v1/jobs/team-b/train/cancel");
  fake_.Answer("GET /v1/jobs/team-b/train", 200, kJob);
  fake_.Answer("GET /v1/jobs/team-b/train/events", 200, R"({"items": []})");
  EXPECT_EQ(RunDescribe(fake_.client, {.kind = "job", .name = "team-b/train"}, clock_, out_, err_),
            0)
      << err_.str();
  fake_.Answer("GET /v1/deployments/team-b/chat", 200, R"({"name": "chat", "team": "team-b"})");
  EXPECT_EQ(RunGet(fake_.client, {.kind = "deployment", .name = "team-b/chat"}, clock_, out_, err_),
            0)
      << err_.str();
}

TEST_F(CommandsTest, CancelForbiddenIsShownVerbatim) {
  fake_.Answer(
      "POST /v1/jobs/bert/cancel", 403,
      R"({"error": {"code": "PERMISSION_DENIED", "message": "job bert belongs to team nlp"}})");
  EXPECT_EQ(RunCancel(fake_.client, "bert", out_, err_), 1);
  EXPECT_EQ(err_.str(), "Error from server (PermissionDenied): job bert belongs to team nlp\n");
}

TEST_F(CommandsTest, ResumePostsWithoutBody) {
  fake_.Answer("POST /v1/jobs/nb/resume", 200, R"({"name": "nb", "state": "Pending"})");
  EXPECT_EQ(RunResume(fake_.client, "nb", out_, err_), 0);
  EXPECT_EQ(out_.str(), "job/nb resumed\n");
  EXPECT_EQ(OnlyRequest().method, "POST");
  EXPECT_EQ(OnlyRequest().body, "");
}

TEST_F(CommandsTest, ResumeOfAJobNotSuspendedShowsTheServersError) {
  fake_.Answer(
      "POST /v1/jobs/nb/resume", 400,
      R"({"error": {"code": "FAILED_PRECONDITION", "message": "job \"nb\" is Running, not Suspended"}})");
  EXPECT_EQ(RunResume(fake_.client, "nb", out_, err_), 1);
  EXPECT_EQ(err_.str(),
            "Error from server (FailedPrecondition): job \"nb\" is Running, not Suspended\n");
  EXPECT_EQ(RunResume(fake_.client, "", out_, err_), 1);
}

TEST_F(CommandsTest, NodeActions) {
  struct Case {
    NodeAction action;
    const char* path;
    const char* printed;
  };
  const Case cases[] = {
      {NodeAction::kCordon, "/v1/nodes/node-0001/cordon", "node/node-0001 cordoned\n"},
      {NodeAction::kUncordon, "/v1/nodes/node-0001/uncordon", "node/node-0001 uncordoned\n"},
      {NodeAction::kDrain, "/v1/nodes/node-0001/drain", "node/node-0001 drained\n"},
      {NodeAction::kQuarantine, "/v1/nodes/node-0001/quarantine", "node/node-0001 quarantined\n"},
      {NodeAction::kRelease, "/v1/nodes/node-0001/release", "node/node-0001 released\n"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    FakeClient fake("admin");
    fake.Answer(std::string("POST ") + c.path, 200, kNode);
    std::ostringstream out;
    std::ostringstream err;
    EXPECT_EQ(RunNodeAction(fake.client, c.action, {.node = "node-0001"}, out, err), 0);
    EXPECT_EQ(out.str(), c.printed);
    EXPECT_EQ(err.str(), "");
    ASSERT_EQ(fake.state->requests.size(), 1U);
    EXPECT_EQ(fake.state->requests[0].method, "POST");
    EXPECT_EQ(fake.state->requests[0].body, "");
    EXPECT_EQ(fake.state->requests[0].token, "admin");
  }
}

TEST_F(CommandsTest, QuarantineAndReleaseOneGpu) {
  fake_.Answer("POST /v1/nodes/node-0001/quarantine", 200, kNode);
  fake_.Answer("POST /v1/nodes/node-0001/release", 200, kNode);
  EXPECT_EQ(RunNodeAction(fake_.client, NodeAction::kQuarantine, {.node = "node-0001", .gpu = 3},
                          out_, err_),
            0);
  EXPECT_EQ(RunNodeAction(fake_.client, NodeAction::kRelease, {.node = "node-0001", .gpu = 0}, out_,
                          err_),
            0);
  EXPECT_EQ(out_.str(), "node/node-0001 gpu 3 quarantined\nnode/node-0001 gpu 0 released\n");
  ASSERT_EQ(fake_.state->requests.size(), 2U);
  EXPECT_EQ(fake_.state->requests[0].body, R"({"gpu":3})");
  EXPECT_EQ(fake_.state->requests[0].content_type, "application/json");
  EXPECT_EQ(fake_.state->requests[1].body, R"({"gpu":0})");
}

TEST_F(CommandsTest, QuarantineOfNodeSlashGpuSendsItsReason) {
  fake_.Answer("POST /v1/nodes/node-0001/quarantine", 200, kNode);
  EXPECT_EQ(RunNodeAction(fake_.client, NodeAction::kQuarantine,
                          {.node = "node-0001/3", .reason = "fans loud"}, out_, err_),
            0);
  EXPECT_EQ(out_.str(), "node/node-0001 gpu 3 quarantined\n");
  ASSERT_EQ(fake_.state->requests.size(), 1U);
  EXPECT_EQ(fake_.state->requests[0].body, R"({"gpu":3,"reason":"fans loud"})");
}

TEST_F(CommandsTest, QuarantineArgumentErrorsNameTheValue) {
  EXPECT_EQ(
      RunNodeAction(fake_.client, NodeAction::kQuarantine, {.node = "node-0001/x"}, out_, err_), 1);
  EXPECT_EQ(RunNodeAction(fake_.client, NodeAction::kQuarantine, {.node = "node-0001/2", .gpu = 3},
                          out_, err_),
            1);
  EXPECT_EQ(RunNodeAction(fake_.client, NodeAction::kRelease,
                          {.node = "node-0001", .reason = "done"}, out_, err_),
            1);
  EXPECT_EQ(err_.str(),
            "error: NODE: \"node-0001/x\" (expected NODE or NODE/GPU, one GPU index)\n"
            "error: NODE: \"node-0001/2\" (expected NODE or NODE/GPU, one GPU index)\n"
            "error: release takes no --reason\n");
  EXPECT_TRUE(fake_.state->requests.empty());
}

TEST_F(CommandsTest, NodeActionErrors) {
  fake_.Answer(
      "POST /v1/nodes/node-0001/drain", 403,
      R"({"error": {"code": "PERMISSION_DENIED", "message": "node operations are admin-only"}})");
  EXPECT_EQ(RunNodeAction(fake_.client, NodeAction::kDrain, {.node = "node-0001"}, out_, err_), 1);
  EXPECT_EQ(RunNodeAction(fake_.client, NodeAction::kCordon, {.node = "n", .gpu = 1}, out_, err_),
            1);
  EXPECT_EQ(
      RunNodeAction(fake_.client, NodeAction::kQuarantine, {.node = "n", .gpu = -1}, out_, err_),
      1);
  EXPECT_EQ(err_.str(),
            "Error from server (PermissionDenied): node operations are admin-only\n"
            "error: cordon takes no --gpu\n"
            "error: --gpu -1 is not a GPU index\n");
  EXPECT_EQ(fake_.state->requests.size(), 1U);
}

TEST(ReasonName, CamelCasesTheCode) {
  EXPECT_EQ(ReasonName(StatusCode::kNotFound), "NotFound");
  EXPECT_EQ(ReasonName(StatusCode::kFailedPrecondition), "FailedPrecondition");
  EXPECT_EQ(ReasonName(StatusCode::kAborted), "Aborted");
}

}  // namespace
}  // namespace gpufleet::cli
