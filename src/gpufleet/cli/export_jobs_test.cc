// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/export_jobs.h"

#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpufleet::cli {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::Pair;

// A job document as the server stores it, with one task group asking for `gpus`.
json Job(const std::string& name, const std::string& state, const json& gpus, int groups = 1) {
  json task = {{"name", "main"}, {"replicas", 2}, {"resources", {{"cpu", "4"}, {"gpus", gpus}}}};
  json tasks = json::array();
  for (int i = 0; i < groups; ++i) {
    tasks.push_back(task);
  }
  return {{"name", name},
          {"team", "nlp"},
          {"queue", "research"},
          {"state", state},
          {"created_at", "2026-12-03T10:00:00Z"},
          {"submitted_by", "alice"},
          {"spec",
           {{"apiVersion", "gpufleet.io/v1"},
            {"kind", "Job"},
            {"spec",
             {{"kind", "batch"},
              {"priority", -5},
              {"tasks", tasks},
              {"gpuModels", {"H100-80GB", "A100-80GB"}}}}}}};
}

json Events(bool placed) {
  json items = {{{"at", "2026-12-03T10:00:00Z"}, {"message", "submitted by alice"}}};
  if (placed) {
    items.push_back({{"at", "2026-12-03T10:00:30Z"}, {"message", "scheduled on node-0001"}});
  }
  items.push_back({{"at", "2026-12-03T10:10:30Z"}, {"message", "succeeded"}});
  return {{"items", items}};
}

TEST(JobsToNativeCsv, FinishedRunsBecomeRowsAndTheRestIsCountedByReason) {
  const NativeExport exported = JobsToNativeCsv({
      {Job("train", "Succeeded", {{"count", 4}}), Events(true)},
      {Job("notebook", "Cancelled", {{"milli", 250}}), Events(true)},
      {Job("waiting", "Pending", {{"count", 1}}), Events(false)},
      {Job("gave-up", "Cancelled", {{"count", 1}}), Events(false)},
      {Job("two", "Succeeded", {{"count", 1}}, 2), Events(true)},
      {Job("mig", "Succeeded", {{"migProfile", "1g.10gb"}, {"count", 1}}), Events(true)},
  });
  EXPECT_EQ(exported.csv,
            "id,submit_time,duration,tasks,gpus_per_task,gpu_milli,allowed_models,queue,priority,"
            "kind,user\n"
            "nlp/train,1796292000,600,2,4,1000,H100-80GB|A100-80GB,research,-5,batch,alice\n"
            "nlp/notebook,1796292000,600,2,1,250,H100-80GB|A100-80GB,research,-5,batch,alice\n");
  EXPECT_EQ(exported.rows, 2);
  EXPECT_THAT(exported.skipped,
              ElementsAre(Pair("not finished", 1), Pair("never placed", 1),
                          Pair("several task groups", 1), Pair("MIG instances", 1)));
}

TEST(JobsToNativeCsv, HostileDocumentsAreSkippedNotTrusted) {
  json no_times = Job("old", "Succeeded", {{"count", 1}});
  no_times.erase("created_at");
  json bad_spec = Job("bad", "Succeeded", {{"count", 1}});
  bad_spec["spec"] = "not an object";
  json quoted = Job("a,\"b\"", "Failed", json());
  const NativeExport exported = JobsToNativeCsv({{no_times, Events(true)},
                                                 {bad_spec, Events(true)},
                                                 {quoted, json::array()},
                                                 {quoted, Events(true)}});
  EXPECT_EQ(exported.rows, 1);
  EXPECT_THAT(exported.csv, ::testing::HasSubstr("\"nlp/a,\"\"b\"\"\",1796292000,600,2,0,,"));
  EXPECT_THAT(exported.skipped,
              ElementsAre(Pair("without times", 1), Pair("several task groups", 1),
                          Pair("never placed", 1)));
}

}  // namespace
}  // namespace gpufleet::cli
