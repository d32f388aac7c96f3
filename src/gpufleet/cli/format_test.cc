// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::cli {
namespace {

using ::gpufleet::testing::StatusIs;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// 2026-11-29T21:00:00Z, the time the AGE column counts to.
constexpr int64_t kNow = 1795986000;

json Parse(const char* text) {
  json value = json::parse(text, nullptr, false);
  EXPECT_FALSE(value.is_discarded()) << text;
  return value;
}

json Jobs() {
  return Parse(R"({"items": [
    {"name": "bert-pretrain", "team": "nlp", "queue": "default", "state": "Pending",
     "created_at": "2026-11-29T20:57:30Z", "labels": {"team": "nlp", "gpufleet.io/project": "bert"},
     "reason": "group \"workers\" (16 x 8 whole GPU(s)): no leaf can hold all tasks; the best, leaf-3, can hold 6",
     "spec": {"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "bert-pretrain"},
              "spec": {"tasks": [{"name": "workers", "replicas": 16,
                                  "resources": {"gpus": {"count": 8}}}]}},
     "placements": [], "version": 3},
    {"name": "nb", "team": "cv", "queue": "research/cv", "state": "Running", "reason": "",
     "spec": {"spec": {"tasks": [{"name": "w", "resources": {"gpus": {"milli": 250}}},
                                 {"name": "m", "replicas": 2,
                                  "resources": {"gpus": {"migProfile": "3g.40gb", "count": 1}}}]}},
     "placements": [{"task": "w-0", "node": "node-0001", "gpus": [0]},
                    {"task": "m-0", "node": "node-0002", "gpus": [1]},
                    {"task": "m-1", "node": "node-0002", "gpus": [2]}],
     "version": 12}
  ]})");
}

json Nodes() {
  return Parse(R"({"items": [
    {"name": "node-0001", "state": "Ready", "labels": {"gpufleet.io/driver-version": "550.54"},
     "topology": {"block": "block-0", "leaf": "leaf-0"}, "cpu_milli": 192000,
     "memory_mib": 2097152,
     "gpus": [{"index": 0, "model": "H100-80GB", "health": "Healthy", "allocated_milli": 1000},
              {"index": 1, "model": "H100-80GB", "health": "Healthy", "allocated_milli": 0},
              {"index": 2, "model": "H100-80GB", "health": "Quarantined", "allocated_milli": 0}],
     "version": 1},
    {"name": "node-0002", "state": "Cordoned", "cpu_milli": 500, "memory_mib": 1000,
     "gpus": [], "version": 7}
  ]})");
}

TEST(ParseOutputFormat, KnowsTheFourFormats) {
  EXPECT_EQ(*ParseOutputFormat(""), OutputFormat::kTable);
  EXPECT_EQ(*ParseOutputFormat("table"), OutputFormat::kTable);
  EXPECT_EQ(*ParseOutputFormat("wide"), OutputFormat::kWide);
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("yaml"), OutputFormat::kYaml);
  EXPECT_THAT(ParseOutputFormat("xml"), StatusIs(StatusCode::kInvalidArgument));
}

TEST(RenderList, JobsTable) {
  EXPECT_EQ(RenderList(ResourceKind::kJob, Jobs(), OutputFormat::kTable, kNow),
            "NAME            TEAM   QUEUE         STATE     GPUS             AGE         REASON\n"
            "bert-pretrain   nlp    default       Pending   128              2m30s       "
            "group \"workers\" (16 x 8 whole GPU(s)): no leaf can hold a...\n"
            "nb              cv     research/cv   Running   0.25+2x3g.40gb   <unknown>   <none>\n");
}

TEST(RenderList, JobsWide) {
  EXPECT_EQ(RenderList(ResourceKind::kJob, Jobs(), OutputFormat::kWide, kNow),
            "NAME            TEAM   QUEUE         STATE     GPUS             AGE         NODES"
            "                 VERSION   REASON\n"
            "bert-pretrain   nlp    default       Pending   128              2m30s       <none>"
            "                3         group \"workers\" (16 x 8 whole GPU(s)): no leaf can "
            "hold all tasks; the best, leaf-3, can hold 6\n"
            "nb              cv     research/cv   Running   0.25+2x3g.40gb   <unknown>   "
            "node-0001,node-0002   12        <none>\n");
}

TEST(RenderList, NodesTableAndWide) {
  EXPECT_EQ(RenderList(ResourceKind::kNode, Nodes(), OutputFormat::kTable, kNow),
            "NAME        STATE      GPUS   FREE   MODEL       LEAF\n"
            "node-0001   Ready      3      1      H100-80GB   leaf-0\n"
            "node-0002   Cordoned   0      0      <none>      <none>\n");
  EXPECT_EQ(RenderList(ResourceKind::kNode, Nodes(), OutputFormat::kWide, kNow),
            "NAME        STATE      GPUS   FREE   ALLOCATED   UNHEALTHY   MODEL       CPU   "
            "MEMORY   LEAF     TOPOLOGY                    VERSION\n"
            "node-0001   Ready      3      1      1           1           H100-80GB   192   "
            "2048Gi   leaf-0   block=block-0,leaf=leaf-0   1\n"
            "node-0002   Cordoned   0      0      0           0           <none>      0.5   "
            "1000Mi   <none>   <none>                      7\n");
}

TEST(RenderList, QueuesTable) {
  const json queues = Parse(R"({"items": [
      {"name": "default", "team": "", "pending": 3, "running": 5, "gpus_allocated": 40},
      {"name": "research/nlp", "team": "nlp", "guarantee": {"H100-80GB": 512, "*": 8},
       "limit": {"*": 1024}, "weight": 2, "pending": 0, "running": 12, "gpus_allocated": 1024,
       "borrowed": 504, "fair_share": 1.4567}]})");
  EXPECT_EQ(RenderList(ResourceKind::kQueue, queues, OutputFormat::kTable, kNow),
            "NAME           TEAM     GUARANTEE           LIMIT    WEIGHT   PENDING   RUNNING   "
            "GPUS   BORROWED   FAIR-SHARE\n"
            "default        <none>   <none>              <none>   1        3         5         "
            "40     0          <none>\n"
            "research/nlp   nlp      *=8,H100-80GB=512   *=1024   2        0         12        "
            "1024   504        1.46\n");
}

TEST(RenderList, TeamsAndTokensTables) {
  EXPECT_EQ(
      RenderList(ResourceKind::kTeam, Parse(R"({"items": [{"name": "cv"}, {"name": "nlp"}]})"),
                 OutputFormat::kTable, kNow),
      "NAME\ncv\nnlp\n");
  const json tokens = Parse(R"({"items": [
      {"id": "0a1b2c3d4e5f", "role": "admin", "team": "", "name": "admin"},
      {"id": "9f8e7d6c5b4a", "role": "member", "team": "nlp", "name": "ci-bot"}]})");
  EXPECT_EQ(RenderList(ResourceKind::kToken, tokens, OutputFormat::kTable, kNow),
            "ID             ROLE     TEAM     NAME\n"
            "0a1b2c3d4e5f   admin    <none>   admin\n"
            "9f8e7d6c5b4a   member   nlp      ci-bot\n");
}

TEST(RenderList, EmptyTableIsEmptyAndJsonKeepsTheAnswer) {
  const json empty = Parse(R"({"items": []})");
  EXPECT_EQ(RenderList(ResourceKind::kJob, empty, OutputFormat::kTable, kNow), "");
  EXPECT_EQ(RenderList(ResourceKind::kJob, empty, OutputFormat::kJson, kNow),
            "{\n  \"items\": []\n}\n");
  EXPECT_EQ(RenderList(ResourceKind::kJob, empty, OutputFormat::kYaml, kNow), "items: []\n");
}

TEST(RenderList, QueuesJson) {
  const json queues = Parse(R"({"items": [{"name": "default", "pending": 3}]})");
  EXPECT_EQ(RenderList(ResourceKind::kQueue, queues, OutputFormat::kJson, kNow),
            "{\n"
            "  \"items\": [\n"
            "    {\n"
            "      \"name\": \"default\",\n"
            "      \"pending\": 3\n"
            "    }\n"
            "  ]\n"
            "}\n");
}

TEST(ToYaml, MappingsSequencesAndQuotedScalars) {
  const json node = Nodes()["items"][0];
  EXPECT_EQ(ToYaml(node),
            "cpu_milli: 192000\n"
            "gpus:\n"
            "  - allocated_milli: 1000\n"
            "    health: Healthy\n"
            "    index: 0\n"
            "    model: H100-80GB\n"
            "  - allocated_milli: 0\n"
            "    health: Healthy\n"
            "    index: 1\n"
            "    model: H100-80GB\n"
            "  - allocated_milli: 0\n"
            "    health: Quarantined\n"
            "    index: 2\n"
            "    model: H100-80GB\n"
            "labels:\n"
            "  gpufleet.io/driver-version: \"550.54\"\n"
            "memory_mib: 2097152\n"
            "name: node-0001\n"
            "state: Ready\n"
            "topology:\n"
            "  block: block-0\n"
            "  leaf: leaf-0\n"
            "version: 1\n");
}

TEST(ToYaml, QuotesWhatWouldReadAsSomethingElse) {
  const json value = Parse(R"({
      "empty": "", "bool": "true", "no": "No", "number": "42", "colon": "a: b",
      "hash": "x #y", "dash": "-x", "newline": "a\nb", "space": " x", "null": null,
      "nested": [[1, 2], {}, [], "plain text"], "t": true, "f": 1.5})");
  EXPECT_EQ(ToYaml(value),
            "bool: \"true\"\n"
            "colon: \"a: b\"\n"
            "dash: \"-x\"\n"
            "empty: \"\"\n"
            "f: 1.5\n"
            "hash: \"x #y\"\n"
            "nested:\n"
            "  - - 1\n"
            "    - 2\n"
            "  - {}\n"
            "  - []\n"
            "  - plain text\n"
            "newline: \"a\\nb\"\n"
            "\"no\": \"No\"\n"
            "\"null\": null\n"
            "number: \"42\"\n"
            "space: \" x\"\n"
            "t: true\n");
  EXPECT_EQ(ToYaml(json("x")), "x\n");
  EXPECT_EQ(ToYaml(json::array()), "[]\n");
}

TEST(DescribeJob, FieldsReasonPlacementsAndEvents) {
  const json job = Jobs()["items"][1];
  const json events = Parse(R"({"items": [{"revision": 11, "message": "submitted"},
                                           {"revision": 12, "message": "scheduled on node-0001"}]})");
  EXPECT_EQ(DescribeJob(job, events, kNow),
            "Name:        nb\n"
            "Team:        cv\n"
            "Queue:       research/cv\n"
            "Labels:      <none>\n"
            "Created:     <none>\n"
            "State:       Running\n"
            "GPUs:        0.25+2x3g.40gb\n"
            "Version:     12\n"
            "Reason:      <none>\n"
            "Placements:\n"
            "  TASK   NODE        GPUS   PHASE\n"
            "  w-0    node-0001   0      <none>\n"
            "  m-0    node-0002   1      <none>\n"
            "  m-1    node-0002   2      <none>\n"
            "Events:\n"
            "  REVISION   MESSAGE\n"
            "  11         submitted\n"
            "  12         scheduled on node-0001\n");
}

TEST(DescribeJob, EventsWithTheirTimes) {
  const json events = Parse(R"({"items": [{"revision": 3, "message": "submitted"},
                                           {"revision": 11, "at": "2026-12-03T12:00:05Z",
                                            "message": "scheduled on node-0001"}]})");
  EXPECT_THAT(DescribeJob(Jobs()["items"][1], events, kNow),
              HasSubstr("Events:\n"
                        "  REVISION   TIME                   MESSAGE\n"
                        "  3          <none>                 submitted\n"
                        "  11         2026-12-03T12:00:05Z   scheduled on node-0001\n"));
}

TEST(DescribeJob, PendingJobShowsItsReason) {
  const json job = Jobs()["items"][0];
  EXPECT_EQ(DescribeJob(job, Parse(R"({"items": []})"), kNow),
            "Name:        bert-pretrain\n"
            "Team:        nlp\n"
            "Queue:       default\n"
            "Labels:      gpufleet.io/project=bert\n"
            "             team=nlp\n"
            "Created:     2026-11-29T20:57:30Z\n"
            "State:       Pending\n"
            "GPUs:        128\n"
            "Version:     3\n"
            "Reason:      group \"workers\" (16 x 8 whole GPU(s)): no leaf can hold all tasks; "
            "the best, leaf-3, can hold 6\n"
            "Placements:  <none>\n"
            "Events:      <none>\n");
}

TEST(DescribeJob, RunningJobShowsItsIdleWarning) {
  json job = Parse(R"({"name": "nb", "state": "Running", "reason": "",
                       "warning": "GPUs under 10% for 30m while 2 jobs wait; will be suspended at 14:05 unless used"})");
  EXPECT_THAT(DescribeJob(job, json(), kNow),
              HasSubstr("Reason:      <none>\n"
                        "Warning:     GPUs under 10% for 30m while 2 jobs wait; will be suspended "
                        "at 14:05 unless used\n"
                        "Placements:  <none>\n"));
  // A warning left on a job that no longer runs is not shown.
  job["state"] = "Cancelled";
  EXPECT_THAT(DescribeJob(job, json(), kNow), Not(HasSubstr("Warning:")));
}

TEST(DescribeJob, ShowsHowLongAgoTheJobLastCheckpointed) {
  json job = Parse(R"({"name": "train", "state": "Running", "reason": ""})");
  EXPECT_THAT(DescribeJob(job, json(), kNow), Not(HasSubstr("Checkpoint:")));
  job["last_checkpoint_ns"] = (kNow - 150) * 1'000'000'000;
  EXPECT_THAT(DescribeJob(job, json(), kNow),
              HasSubstr("Reason:      <none>\n"
                        "Checkpoint:  last checkpoint 2m30s ago\n"));
}

// Issue 37 item 4: a run under a preemption notice says so, and how long it may still save.
TEST(DescribeJob, ShowsAPreemptionNoticeAndItsDeadline) {
  json job = Parse(R"({"name": "train", "state": "Running", "reason": ""})");
  EXPECT_THAT(DescribeJob(job, json(), kNow), Not(HasSubstr("Notice:")));
  job["notice"] = {{"signal", "SIGUSR1"},
                   {"since_ns", (kNow - 30) * 1'000'000'000},
                   {"deadline_ns", (kNow + 150) * 1'000'000'000}};
  EXPECT_THAT(DescribeJob(job, json(), kNow),
              HasSubstr("Notice:      SIGUSR1 sent; stopping once it reports a checkpoint, at the "
                        "latest in 2m30s\n"));
}

TEST(DescribeJob, ImagePullsAndDigestsOfItsTasks) {
  const json job = Parse(R"({"name": "boxed", "state": "Running", "placements": [
      {"task": "main-0", "node": "n1", "gpus": [0], "image_pull_ms": 12345,
       "image_digest": "sha256:abc"},
      {"task": "main-1", "node": "n2", "gpus": [0]}]})");
  EXPECT_THAT(DescribeJob(job, json(), kNow),
              HasSubstr("Placements:\n"
                        "  TASK     NODE   GPUS   PHASE    IMAGE PULL   "
                        "IMAGE DIGEST\n"
                        "  main-0   n1     0      <none>   12.3s        "
                        "sha256:abc\n"
                        "  main-1   n2     0      <none>   <none>       <none>\n"));
}

TEST(DescribeJob, ATaskPullingItsImageShowsWhereThePullIs) {
  const json job = Parse(R"({"name": "boxed", "state": "Scheduled", "placements": [
      {"task": "main-0", "node": "n1", "gpus": [0], "phase": "Pulling",
       "image_pull_progress": "Copying blob sha256:abc"},
      {"task": "main-1", "node": "n2", "gpus": [0], "phase": "Running", "image_pull_ms": 900}]})");
  EXPECT_THAT(DescribeJob(job, json(), kNow),
              HasSubstr("  main-0   n1     0      Pulling   <none>       <none>\n"
                        "  main-1   n2     0      Running   0.9s         <none>\n"
                        "  main-0 pulling: Copying blob sha256:abc\n"));
}

TEST(DescribeNode, ImagesTheAgentReported) {
  const json node = Parse(R"({"name": "n1", "state": "Ready", "gpus": [],
      "images": [{"references": ["localhost/tiny:1", "localhost/tiny:latest"],
                  "digest": "sha256:abc", "size_bytes": 2147483648}],
      "images_dropped": "1 dropped: images[3].digest: digest \"x\" has no ':'"})");
  const std::string text = DescribeNode(node, json());
  EXPECT_THAT(text, HasSubstr("Images:      1\n"
                              "  REFERENCES                                DIGEST       SIZE\n"
                              "  localhost/tiny:1, localhost/tiny:latest   sha256:abc   2Gi\n"));
  EXPECT_THAT(text, HasSubstr("Images not kept: 1 dropped: images[3].digest"));
}

TEST(DescribeNode, FieldsAndGpuHealth) {
  EXPECT_EQ(DescribeNode(Nodes()["items"][0], json::object()),
            "Name:        node-0001\n"
            "State:       Ready\n"
            "Labels:      gpufleet.io/driver-version=550.54\n"
            "Topology:    block=block-0\n"
            "             leaf=leaf-0\n"
            "CPU:         192\n"
            "Memory:      2048Gi\n"
            "Version:     1\n"
            "GPUs:        3 (1 free, 1 not healthy)\n"
            "  INDEX   MODEL       HEALTH        ALLOCATED\n"
            "  0       H100-80GB   Healthy       1\n"
            "  1       H100-80GB   Healthy       0\n"
            "  2       H100-80GB   Quarantined   0\n"
            "Events:      <none>\n");
}

TEST(DescribeNode, GpuHealthReasonsAndEvents) {
  const json node = Parse(R"({"name": "n", "state": "Ready", "gpus": [
      {"index": 0, "model": "H100-80GB", "health": "Healthy"},
      {"index": 1, "model": "H100-80GB", "health": "Unhealthy",
       "reasons": ["XID 79: GPU has fallen off the bus; drain now", "GPU lost"]}]})");
  const json events = Parse(R"({"items": [{"revision": 4, "message": "gpu 1: Unhealthy"}]})");
  const std::string text = DescribeNode(node, events);
  EXPECT_THAT(text, HasSubstr("  INDEX   MODEL       HEALTH      ALLOCATED   REASONS\n"
                              "  0       H100-80GB   Healthy     0           -\n"
                              "  1       H100-80GB   Unhealthy   0           XID 79: GPU has "
                              "fallen off the bus; drain now; GPU lost\n"));
  EXPECT_THAT(text, HasSubstr("Events:\n  REVISION   MESSAGE\n  4          gpu 1: Unhealthy\n"));
}

TEST(DescribeNode, AQuarantinedGpuSaysWhy) {
  const json node = Parse(R"({"name": "n", "state": "Ready", "gpus": [
      {"index": 0, "model": "H100-80GB", "health": "Quarantined",
       "quarantine_reason": "fans loud"}]})");
  EXPECT_THAT(
      DescribeNode(node, json::object()),
      HasSubstr("  0       H100-80GB   Quarantined   0           quarantined: fans loud\n"));
}

TEST(DescribeJob, ARepeatedEventShowsItsCountAndSpan) {
  const json events = Parse(R"({"items": [
      {"revision": 3, "at": "2026-12-07T07:12:01Z", "message": "unschedulable: 30 lack free resources",
       "count": 97, "firstTime": "2026-12-07T07:12:01Z", "lastTime": "2026-12-07T07:18:40Z"},
      {"revision": 9, "message": "cancelled by alice"}]})");
  const std::string text = DescribeJob(json::object(), events, kNow);
  EXPECT_THAT(text, HasSubstr("unschedulable: 30 lack free resources (x97, 07:12-07:18)\n"));
  EXPECT_THAT(text, HasSubstr("cancelled by alice\n"));
  EXPECT_THAT(text, Not(HasSubstr("cancelled by alice (x")));
}

TEST(Format, ToleratesMissingAndMistypedFields) {
  const json odd = Parse(R"({"items": [{"name": 7, "gpus": "many", "topology": []}, 5]})");
  EXPECT_NO_FATAL_FAILURE(RenderList(ResourceKind::kNode, odd, OutputFormat::kWide, kNow));
  EXPECT_NO_FATAL_FAILURE(RenderList(ResourceKind::kJob, odd, OutputFormat::kWide, kNow));
  EXPECT_NO_FATAL_FAILURE(RenderList(ResourceKind::kToken, odd, OutputFormat::kTable, kNow));
  EXPECT_NO_FATAL_FAILURE(DescribeJob(json(), json(), kNow));
  EXPECT_EQ(DescribeNode(json::object(), json()).substr(0, 19), "Name:        <none>");
}

TEST(FormatAge, LikeKubectl) {
  EXPECT_EQ(FormatAge(-5), "0s");
  EXPECT_EQ(FormatAge(0), "0s");
  EXPECT_EQ(FormatAge(119), "119s");
  EXPECT_EQ(FormatAge(150), "2m30s");
  EXPECT_EQ(FormatAge(300), "5m");
  EXPECT_EQ(FormatAge(17 * 60 + 59), "17m");
  EXPECT_EQ(FormatAge(3 * 3600 + 12 * 60 + 5), "3h12m");
  EXPECT_EQ(FormatAge(20 * 3600), "20h");
  EXPECT_EQ(FormatAge(53 * 3600), "2d5h");
  EXPECT_EQ(FormatAge(40 * 86400), "40d");
  EXPECT_EQ(FormatAge(385 * 86400 * 2), "2y40d");
  EXPECT_EQ(FormatAge(int64_t{9} * 365 * 86400), "9y");
}

TEST(FormatMilli, Decimals) {
  EXPECT_EQ(FormatMilli(0), "0");
  EXPECT_EQ(FormatMilli(1000), "1");
  EXPECT_EQ(FormatMilli(250), "0.25");
  EXPECT_EQ(FormatMilli(1500), "1.5");
  EXPECT_EQ(FormatMilli(-1001), "-1.001");
}

}  // namespace
}  // namespace gpufleet::cli
