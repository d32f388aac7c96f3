// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/json_fields.h"

#include <string>

#include <gtest/gtest.h>

namespace gpufleet::wire {
namespace {

TEST(ParseDocumentWithout, LeavesOutTheTopLevelMemberOnly) {
  const std::string text = R"({"spec": {"spec": {"tasks": [1]}, "x": 2}, "state": "Pending",
      "placements": [{"spec": "kept", "node": "n"}], "labels": {"spec": "kept too"}})";
  const Json doc = ParseDocumentWithout(text, "spec");
  EXPECT_FALSE(doc.contains("spec"));
  Json full = Json::parse(text);
  full.erase("spec");
  EXPECT_EQ(doc, full);
  EXPECT_EQ(doc["placements"][0]["spec"], "kept");
  EXPECT_EQ(doc["labels"]["spec"], "kept too");
  // Not an object, or not JSON: an empty object, as ParseDocument gives.
  EXPECT_EQ(ParseDocumentWithout("[1, 2]", "spec"), Json::object());
  EXPECT_EQ(ParseDocumentWithout(R"({"spec": )", "spec"), Json::object());
}

}  // namespace
}  // namespace gpufleet::wire
