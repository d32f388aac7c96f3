// SPDX-License-Identifier: Apache-2.0
// Provenance for people: describe's section, diffs of two runs, and the fleet's version skew.
#include "gpufleet/cli/provenance.h"

#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/cli/report.h"
#include "gpufleet/http/testing/fake_transport.h"

namespace gpufleet::cli {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

json Record(const std::string& task, int attempt, const std::string& digest,
            const std::string& driver, const std::string& commit) {
  return {{"job", "ml/bert"},
          {"task", task},
          {"attempt", attempt},
          {"node", "n1"},
          {"image", "localhost/tiny:1"},
          {"image_digest", digest},
          {"driver_version", driver},
          {"cuda_version", "12.4"},
          {"nvml_version", "12.550.54.15"},
          {"gpus", {{{"uuid", "GPU-1"}, {"serial", "1650923000001"}, {"vbios_version", "96"}}}},
          {"command", {"python", "train.py"}},
          {"env_names", {"CUDA_VISIBLE_DEVICES", "HF_TOKEN"}},
          {"provenance", {{"git.commit", commit}}},
          {"labels", {{"project", "bert"}}},
          {"recorded_at", "2026-12-03T06:00:00Z"}};
}

TEST(DescribeProvenance, ShowsTheLatestAttemptAndNamesTheEarlierOnes) {
  const json records = json::array({Record("main-0", 1, "sha256:aaa", "550.54.15", "3f2c1e0"),
                                    Record("main-0", 2, "sha256:bbb", "560.28.03", "3f2c1e0")});
  const std::string text = DescribeProvenance(records);
  EXPECT_THAT(text, HasSubstr("Provenance:  attempt 2 (also recorded: attempt 1;"));
  EXPECT_THAT(text, HasSubstr("sha256:bbb"));
  EXPECT_THAT(text, Not(HasSubstr("sha256:aaa")));
  EXPECT_THAT(text, HasSubstr("GPU-1 (serial 1650923000001, VBIOS 96)"));
  EXPECT_THAT(text, HasSubstr("Env names:  CUDA_VISIBLE_DEVICES, HF_TOKEN"));
  EXPECT_THAT(text, HasSubstr("Job provenance:  git.commit=3f2c1e0"));
  EXPECT_EQ(DescribeProvenance(json::array()), "");
}

TEST(RenderProvenanceDiff, ShowsOnlyTheFieldsThatDiffer) {
  const json a = json::array({Record("main-0", 1, "sha256:aaa", "550.54.15", "3f2c1e0")});
  const json b = json::array({Record("main-0", 1, "sha256:bbb", "550.54.15", "4a5b6c7"),
                              Record("main-1", 1, "sha256:bbb", "550.54.15", "4a5b6c7")});
  const std::string text = RenderProvenanceDiff(a, "A", b, "B");
  EXPECT_THAT(text, HasSubstr("main-0 image_digest"));
  EXPECT_THAT(text, HasSubstr("sha256:aaa"));
  EXPECT_THAT(text, HasSubstr("provenance.git.commit"));
  EXPECT_THAT(text, HasSubstr("(no record)"));
  EXPECT_THAT(text, Not(HasSubstr("driver_version"))) << "equal fields are left out";
  EXPECT_THAT(text, Not(HasSubstr("labels.project")));
  EXPECT_EQ(RenderProvenanceDiff(a, "A", a, "B"), "no differences between A and B\n");
}

TEST(RunDiff, ComparesTwoAttemptsOfOneJob) {
  http_testing::FakeClient fake;
  fake.Answer("GET /v1/provenance?job=bert&attempt=1", 200,
              json{{"items", {Record("main-0", 1, "sha256:aaa", "550.54.15", "c")}}}.dump());
  fake.Answer("GET /v1/provenance?job=bert&attempt=2", 200,
              json{{"items", {Record("main-0", 2, "sha256:aaa", "560.28.03", "c")}}}.dump());
  std::ostringstream out;
  std::ostringstream err;
  ASSERT_EQ(RunDiff(fake.client, {"job", {"bert"}, {1, 2}}, out, err), 0) << err.str();
  EXPECT_THAT(out.str(), HasSubstr("bert (attempt 1)"));
  EXPECT_THAT(out.str(), HasSubstr("main-0 driver_version   550.54.15"));
  EXPECT_THAT(out.str(), Not(HasSubstr("image_digest")));

  std::ostringstream bad;
  EXPECT_EQ(RunDiff(fake.client, {"job", {"bert"}, {}}, out, bad), 1);
  EXPECT_THAT(bad.str(), HasSubstr("usage: diff job A B"));
  std::ostringstream none;
  EXPECT_EQ(RunDiff(fake.client, {"job", {"bert"}, {1, 3}}, out, none), 1);
  EXPECT_THAT(none.str(), HasSubstr("no route"));
}

TEST(RenderVersionReport, NamesTheNodesOffTheMajority) {
  const auto node = [](const std::string& name, const std::string& driver,
                       const std::string& digest) {
    return json{
        {"name", name},
        {"labels", {{"gpufleet.io/driver-version", driver}, {"gpufleet.io/cuda-version", "12.4"}}},
        {"images", {{{"references", {"localhost/tiny:1"}}, {"digest", digest}}}}};
  };
  const json nodes = {
      {"items",
       {node("n1", "550.54.15", "sha256:aaa"), node("n2", "550.54.15", "sha256:aaa"),
        node("n3", "535.104.05", "sha256:bbb")}}};
  const std::string text = RenderVersionReport(nodes);
  EXPECT_THAT(text, HasSubstr("Fleet: 3 nodes"));
  EXPECT_THAT(text, HasSubstr("driver"));
  EXPECT_THAT(text, HasSubstr("550.54.15"));
  EXPECT_THAT(text, HasSubstr("2/3"));
  EXPECT_THAT(text, HasSubstr("n3 (535.104.05)"));
  EXPECT_THAT(text, HasSubstr("n3 (sha256:bbb)"));
  EXPECT_THAT(text, HasSubstr("12.4         3/3     -"));

  http_testing::FakeClient fake;
  fake.Answer("GET /v1/nodes", 200, nodes.dump());
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(RunReport(fake.client, {"versions", ""}, out, err), 0) << err.str();
  EXPECT_EQ(out.str(), text);
}

}  // namespace
}  // namespace gpufleet::cli
