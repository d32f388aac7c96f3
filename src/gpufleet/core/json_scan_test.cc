// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/json_scan.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace gpufleet {
namespace {

TEST(TopLevelString, FindsTheMemberAfterNestedValues) {
  const std::string text = R"({"attempt": 1, "labels": {"state": "Pending"},
      "placements": [{"node": "n", "gpus": [0, 1]}], "reason": "a \"quoted\" } ] reason",
      "spec": {"env": {"state": "Running"}, "tasks": [[{}], []]}, "ok": true, "none": null,
      "x": -1.5e3, "state": "Cancelled", "version": 3})";
  EXPECT_EQ(TopLevelString(text, "state"), "Cancelled");
  EXPECT_EQ(TopLevelString(R"({"state":"Pending"})", "state"), "Pending");
  // A string ending in an escaped backslash, and one holding an escaped quote.
  EXPECT_EQ(TopLevelString(R"({"a": "x\\", "b": "say \"state\": \"Pending\"", "state": "Failed"})",
                           "state"),
            "Failed");
}

TEST(TopLevelString, AgreesWithAFullParseOnServerDocuments) {
  nlohmann::json job = {{"name", "j"},
                        {"state", "Scheduled"},
                        {"spec", {{"metadata", {{"labels", {{"state", "Cancelled"}}}}}}},
                        {"reason", "back\\slash and \"quotes\" and {braces]"},
                        {"placements", nlohmann::json::array({{{"gpus", {1, 2}}}})}};
  EXPECT_EQ(TopLevelString(job.dump(), "state"), "Scheduled");
  EXPECT_EQ(TopLevelString(job.dump(2), "state"), "Scheduled");
  EXPECT_EQ(TopLevelString(job.dump(), "name"), "j");
}

TEST(TopLevelString, NulloptWhenItCannotTell) {
  EXPECT_EQ(TopLevelString(R"({"name": "j"})", "state"), std::nullopt);  // absent
  EXPECT_EQ(TopLevelString(R"({"state": 3})", "state"), std::nullopt);   // not a string
  EXPECT_EQ(TopLevelString(R"({"state": "Can\u0063elled"})", "state"), std::nullopt);
  EXPECT_EQ(TopLevelString(R"({"st\u0061te": "Cancelled"})", "state"), std::nullopt);
  EXPECT_EQ(TopLevelString(R"(["state", "Cancelled"])", "state"), std::nullopt);
  EXPECT_EQ(TopLevelString("", "state"), std::nullopt);
  EXPECT_EQ(TopLevelString("{}", "state"), std::nullopt);
  EXPECT_EQ(TopLevelString(R"({"spec": {"a": [1, 2}, "state": "Cancelled")", "state"),
            std::nullopt);  // the nested value never closes before the end
  EXPECT_EQ(TopLevelString(R"({"reason": "unterminated)", "state"), std::nullopt);
  EXPECT_EQ(TopLevelString(R"({"state" "Cancelled"})", "state"), std::nullopt);
}

}  // namespace
}  // namespace gpufleet
