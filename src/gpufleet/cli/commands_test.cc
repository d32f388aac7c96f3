// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/commands.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/cli/testing/fake_transport.h"

namespace gpufleet::cli {
namespace {

using ::gpufleet::cli::testing::FakeClient;
using ::gpufleet::cli::testing::RecordedRequest;
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

TEST_F(SubmitTest, MissingFileNamesThePathAndSendsNothing) {
  const std::string path = (dir_ / "absent.yaml").string();
  EXPECT_EQ(RunSubmit(fake_.client, {.file = path}, out_, err_), 1);
  EXPECT_EQ(err_.str(),
            "error: cannot read job spec \"" + path + "\": No such file or directory\n");
  EXPECT_EQ(out_.str(), "");
  EXPECT_TRUE(fake_.state->requests.empty());
}

TEST_F(SubmitTest, ServerRejectionIsShownVerbatim) {
  fake_.Answer("POST /v1/jobs", 400,
               R"js({"error": {"code": "INVALID_ARGUMENT",
                   "message": "spec.tasks[0].replicas: 0 (must be at least 1)"}})js");
  EXPECT_EQ(RunSubmit(fake_.client, {.file = Write("j.yaml", "x: 1")}, out_, err_), 1);
  EXPECT_EQ(err_.str(),
            "Error from server (InvalidArgument): spec.tasks[0].replicas: 0 (must be at least "
            "1)\n");
}

TEST_F(CommandsTest, GetJobsWithFilters) {
  fake_.Answer("GET /v1/jobs?state=Pending&queue=research%2Fnlp", 200,
               std::string(R"({"items": [)") + kJob + "]}");
  EXPECT_EQ(RunGet(fake_.client, {.kind = "jobs", .state = "Pending", .queue = "research/nlp"},
                   clock_, out_, err_),
            0);
  EXPECT_EQ(out_.str(),
            "NAME   TEAM   QUEUE     STATE     GPUS   AGE   REASON\n"
            "bert   nlp    default   Pending   0      2m    no node fits\n");
  EXPECT_EQ(OnlyRequest().method, "GET");
  EXPECT_EQ(OnlyRequest().token, "tok");
}

TEST_F(CommandsTest, GetEmptyListSaysSo) {
  fake_.Answer("GET /v1/nodes", 200, R"({"items": []})");
  EXPECT_EQ(RunGet(fake_.client, {.kind = "nodes"}, clock_, out_, err_), 0);
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(err_.str(), "No resources found.\n");
}

TEST_F(CommandsTest, GetQueuesAsJson) {
  fake_.Answer("GET /v1/queues", 200, R"({"items": [{"name": "q"}]})");
  EXPECT_EQ(RunGet(fake_.client, {.kind = "queues", .output = "json"}, clock_, out_, err_), 0);
  EXPECT_EQ(out_.str(), "{\n  \"items\": [\n    {\n      \"name\": \"q\"\n    }\n  ]\n}\n");
}

TEST_F(CommandsTest, GetOneJobAsYaml) {
  fake_.Answer("GET /v1/jobs/bert", 200, kJob);
  EXPECT_EQ(
      RunGet(fake_.client, {.kind = "job", .name = "bert", .output = "yaml"}, clock_, out_, err_),
      0);
  EXPECT_THAT(out_.str(), StartsWith("created_at: \"2026-11-29T20:58:00Z\"\nname: bert\n"));
}

TEST_F(CommandsTest, GetOneQueueFromTheList) {
  fake_.Answer("GET /v1/queues", 200,
               R"({"items": [{"name": "a", "pending": 1}, {"name": "b", "pending": 2}]})");
  EXPECT_EQ(RunGet(fake_.client, {.kind = "queue", .name = "b"}, clock_, out_, err_), 0);
  EXPECT_EQ(out_.str(),
            "NAME   TEAM     GUARANTEE   LIMIT    WEIGHT   PENDING   RUNNING   GPUS   BORROWED   "
            "FAIR-SHARE\n"
            "b      <none>   <none>      <none>   1        2         0         0      0          "
            "<none>\n");
  EXPECT_EQ(RunGet(fake_.client, {.kind = "queue", .name = "c"}, clock_, out_, err_), 1);
  EXPECT_EQ(err_.str(), "error: queue \"c\" not found\n");
}

TEST_F(CommandsTest, GetRejectsBadArgumentsWithoutCalling) {
  EXPECT_EQ(RunGet(fake_.client, {.kind = "pods"}, clock_, out_, err_), 1);
  EXPECT_EQ(RunGet(fake_.client, {.kind = "jobs", .output = "xml"}, clock_, out_, err_), 1);
  EXPECT_EQ(RunGet(fake_.client, {.kind = "nodes", .state = "Ready"}, clock_, out_, err_), 1);
  EXPECT_EQ(err_.str(),
            "error: unknown resource type \"pods\" (expected jobs, nodes, queues, teams or "
            "tokens)\n"
            "error: unknown output format \"xml\" (expected table, wide, json or yaml)\n"
            "error: --state and --queue filter jobs only\n");
  EXPECT_TRUE(fake_.state->requests.empty());
}

TEST_F(CommandsTest, NotFoundIsShownLikeKubectl) {
  fake_.Answer("GET /v1/jobs/nope", 404, kNotFound);
  EXPECT_EQ(RunGet(fake_.client, {.kind = "job", .name = "nope"}, clock_, out_, err_), 1);
  EXPECT_EQ(err_.str(), "Error from server (NotFound): job \"nope\" not found\n");
  EXPECT_EQ(out_.str(), "");
}

TEST_F(CommandsTest, ConnectionFailureIsAClientError) {
  fake_.Fail("GET /v1/nodes", UnavailableError("cannot reach http://fake:8080: Connection"));
  EXPECT_EQ(RunGet(fake_.client, {.kind = "nodes"}, clock_, out_, err_), 1);
  EXPECT_EQ(err_.str(), "error: cannot reach http://fake:8080: Connection\n");
}

TEST_F(CommandsTest, DescribeJobFetchesTheJobAndItsEvents) {
  fake_.Answer("GET /v1/jobs/bert", 200, kJob);
  fake_.Answer("GET /v1/jobs/bert/events", 200,
               R"({"items": [{"revision": 1, "message": "submitted"}]})");
  EXPECT_EQ(RunDescribe(fake_.client, {.kind = "job", .name = "bert"}, out_, err_), 0);
  EXPECT_THAT(out_.str(), HasSubstr("Reason:      no node fits\n"));
  EXPECT_THAT(out_.str(), HasSubstr("Events:\n  REVISION   MESSAGE\n  1          submitted\n"));
  ASSERT_EQ(fake_.state->requests.size(), 2U);
  EXPECT_EQ(fake_.state->requests[1].path, "/v1/jobs/bert/events");
}

TEST_F(CommandsTest, DescribeNodeAndErrors) {
  fake_.Answer("GET /v1/nodes/node-0001", 200, kNode);
  fake_.Answer("GET /v1/nodes/node-0001/events", 200,
               R"({"items": [{"revision": 2, "message": "cordoned by root"}]})");
  EXPECT_EQ(RunDescribe(fake_.client, {.kind = "node", .name = "node-0001"}, out_, err_), 0);
  EXPECT_THAT(out_.str(), HasSubstr("  2          cordoned by root\n"));
  EXPECT_THAT(out_.str(), HasSubstr("  0       H100-80GB   Healthy   0\n"));
  EXPECT_EQ(RunDescribe(fake_.client, {.kind = "node", .name = "node-9"}, out_, err_), 1);
  EXPECT_EQ(RunDescribe(fake_.client, {.kind = "queue", .name = "q"}, out_, err_), 1);
  EXPECT_EQ(err_.str(),
            "Error from server (NotFound): no route\n"
            "error: describe takes job or node\n");
}

TEST_F(CommandsTest, CreateTeamAndQueue) {
  fake_.Answer("POST /v1/teams", 201, R"({"name": "nlp", "version": 1})");
  fake_.Answer("POST /v1/queues", 201, R"({"name": "research/nlp", "team": "nlp", "version": 1})");
  EXPECT_EQ(RunCreate(fake_.client, {.kind = "team", .name = "nlp"}, out_, err_), 0);
  EXPECT_EQ(
      RunCreate(fake_.client, {.kind = "queue", .name = "research/nlp", .team = "nlp"}, out_, err_),
      0);
  EXPECT_EQ(out_.str(), "team/nlp created\nqueue/research/nlp created\n");
  ASSERT_EQ(fake_.state->requests.size(), 2U);
  EXPECT_EQ(fake_.state->requests[0].body, R"({"name":"nlp"})");
  EXPECT_EQ(fake_.state->requests[1].body, R"({"name":"research/nlp","team":"nlp"})");
  EXPECT_EQ(fake_.state->requests[1].content_type, "application/json");
}

TEST_F(CommandsTest, CreateQueueWithQuota) {
  fake_.Answer("POST /v1/queues", 201, R"({"name": "research", "version": 1})");
  EXPECT_EQ(RunCreate(fake_.client,
                      {.kind = "queue",
                       .name = "research",
                       .guarantee = {"H100-80GB=16", "*=0.5"},
                       .limit = {"*=64"},
                       .weight = 2,
                       .no_borrow = true},
                      out_, err_),
            0);
  ASSERT_EQ(fake_.state->requests.size(), 1U);
  EXPECT_EQ(fake_.state->requests[0].body,
            R"({"guarantee":{"*":0.5,"H100-80GB":16.0},"limit":{"*":64.0},"may_borrow":false,)"
            R"("name":"research","weight":2.0})");
  EXPECT_EQ(
      RunCreate(fake_.client, {.kind = "queue", .name = "q", .guarantee = {"H100"}}, out_, err_),
      1);
  EXPECT_THAT(err_.str(), HasSubstr("--guarantee H100: expected MODEL=GPUS"));
  EXPECT_EQ(fake_.state->requests.size(), 1U);
}

TEST_F(CommandsTest, UpdateQueueSendsAMergePatchOfWhatItNames) {
  fake_.Answer("PATCH /v1/queues/research/nlp", 200, R"({"name": "research/nlp", "version": 3})");
  EXPECT_EQ(RunUpdate(fake_.client,
                      {.kind = "queue",
                       .name = "research/nlp",
                       .guarantee = {"H100-80GB=8", "*-"},
                       .limit = {"*=32"},
                       .weight = 2,
                       .no_borrow = true},
                      out_, err_),
            0);
  EXPECT_EQ(out_.str(), "queue/research/nlp updated\n");
  const RecordedRequest& request = OnlyRequest();
  EXPECT_EQ(request.method, "PATCH");
  EXPECT_EQ(request.path, "/v1/queues/research/nlp");
  EXPECT_EQ(request.content_type, "application/json");
  EXPECT_EQ(request.body,
            R"({"guarantee":{"*":null,"H100-80GB":8.0},"limit":{"*":32.0},"may_borrow":false,)"
            R"("weight":2.0})");
}

TEST_F(CommandsTest, UpdateQueueRejectsBadArgumentsWithoutCalling) {
  EXPECT_EQ(RunUpdate(fake_.client, {.kind = "team", .name = "nlp", .weight = 2}, out_, err_), 1);
  EXPECT_EQ(RunUpdate(fake_.client, {.kind = "queue", .weight = 2}, out_, err_), 1);
  EXPECT_EQ(RunUpdate(fake_.client, {.kind = "queue", .name = "q"}, out_, err_), 1);
  EXPECT_EQ(RunUpdate(fake_.client, {.kind = "queue", .name = "q", .limit = {"H100"}}, out_, err_),
            1);
  EXPECT_EQ(
      RunUpdate(fake_.client, {.kind = "queue", .name = "q", .borrow = true, .no_borrow = true},
                out_, err_),
      1);
  EXPECT_THAT(err_.str(), HasSubstr("error: update takes queue, not \"team\"\n"));
  EXPECT_THAT(err_.str(), HasSubstr("error: usage: update queue NAME"));
  EXPECT_THAT(err_.str(), HasSubstr("needs at least one of --guarantee"));
  EXPECT_THAT(err_.str(), HasSubstr("--limit H100: expected MODEL=GPUS"));
  EXPECT_THAT(err_.str(), HasSubstr("--borrow and --no-borrow contradict each other"));
  EXPECT_TRUE(fake_.state->requests.empty());
}

TEST_F(CommandsTest, UpdateQueueShowsTheServersRefusal) {
  fake_.Answer("PATCH /v1/queues/research", 400,
               R"({"error": {"code": "INVALID_ARGUMENT",
                             "message": "guarantee.B9000: unknown GPU model \"B9000\""}})");
  EXPECT_EQ(RunUpdate(fake_.client, {.kind = "queue", .name = "research", .guarantee = {"B9000=1"}},
                      out_, err_),
            1);
  EXPECT_EQ(err_.str(),
            "Error from server (InvalidArgument): guarantee.B9000: unknown GPU model \"B9000\"\n");
}

TEST_F(CommandsTest, CreateTokenPrintsItOnce) {
  fake_.Answer("POST /v1/tokens", 201,
               R"({"id": "0a1b2c3d4e5f", "role": "member", "team": "nlp", "name": "ci-bot",
                   "token": "secret-secret-secret"})");
  EXPECT_EQ(RunCreate(fake_.client,
                      {.kind = "token", .team = "nlp", .role = "member", .token_name = "ci-bot"},
                      out_, err_),
            0);
  EXPECT_EQ(out_.str(),
            "token/0a1b2c3d4e5f created\n"
            "token (shown once, keep it): secret-secret-secret\n");
  EXPECT_EQ(OnlyRequest().body, R"({"name":"ci-bot","role":"member","team":"nlp"})");
}

TEST_F(CommandsTest, CreateRejectsBadArgumentsWithoutCalling) {
  EXPECT_EQ(RunCreate(fake_.client, {.kind = "job", .name = "x"}, out_, err_), 1);
  EXPECT_EQ(RunCreate(fake_.client, {.kind = "team"}, out_, err_), 1);
  EXPECT_EQ(RunCreate(fake_.client, {.kind = "token", .token_name = "x"}, out_, err_), 1);
  EXPECT_EQ(err_.str(),
            "error: create takes team, queue or token, not \"job\"\n"
            "error: usage: create team NAME\n"
            "error: usage: create token --role admin|member [--team TEAM] --name NAME\n");
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
