// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/json_fields.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::wire {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::testing::StrEq;

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

// `depth` arrays or objects, one inside the other: "[[[...]]]" or {"a":{"a":...}}.
std::string Nested(int depth, bool objects) {
  std::string text;
  for (int i = 0; i < depth; ++i) {
    text += objects ? R"({"a":)" : "[";
  }
  text += "1";
  for (int i = 0; i < depth; ++i) {
    text += objects ? "}" : "]";
  }
  return text;
}

TEST(ParseJson, RefusesNestingDeeperThanTheLimitWithoutBuildingIt) {
  for (const bool objects : {false, true}) {
    SCOPED_TRACE(objects ? "objects" : "arrays");
    // 100,000 deep is about 200 KB: under any body limit, and deep enough that copying or
    // dumping the value would overflow a thread's stack.
    EXPECT_THAT(ParseJson(Nested(100'000, objects)),
                StatusIs(StatusCode::kInvalidArgument, StrEq("JSON nested deeper than 64 levels")));
    EXPECT_THAT(ParseJson(Nested(65, objects)),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("deeper than 64")));
    const Result<Json> deepest = ParseJson(Nested(64, objects));
    ASSERT_OK(deepest);
    EXPECT_EQ(deepest->dump(), Nested(64, objects));
    EXPECT_THAT(ParseJson(Nested(9, objects), {.max_depth = 8}),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("deeper than 8")));
    // The lenient readers of stored documents read such a document as an empty object.
    EXPECT_EQ(ParseDocument(R"({"x": )" + Nested(100'000, objects) + "}"), Json::object());
    EXPECT_EQ(ParseDocumentWithout(R"({"x": )" + Nested(100'000, objects) + "}", "spec"),
              Json::object());
  }
}

TEST(ParseJson, NamesWhatIsWrong) {
  EXPECT_THAT(ParseJson(R"({"a": })"),
              StatusIs(StatusCode::kInvalidArgument,
                       StartsWith("not valid JSON: parse error at line 1, column 7")));
  EXPECT_THAT(ParseJson(std::string(100, ' '), {.max_bytes = 99}),
              StatusIs(StatusCode::kInvalidArgument, StrEq("100 bytes of JSON, more than 99")));
  const Result<Json> array = ParseJson("[1, 2]");
  ASSERT_OK(array);
  EXPECT_EQ(*array, Json::array({1, 2}));
  // Deep strings are not nesting.
  EXPECT_OK(ParseJson(R"({"a": ")" + std::string(1000, '[') + R"("})"));
}

}  // namespace
}  // namespace gpufleet::wire
