// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/spec_tree.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::wire {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

Result<nlohmann::json> TreeJson(const std::string& text) {
  GPUFLEET_ASSIGN_OR_RETURN(const SpecNode tree, ParseSpecTree(text));
  return SpecTreeToJson(tree);
}

TEST(SpecTreeTest, YamlAndJsonGiveTheSameValuesWithPositions) {
  const Result<SpecNode> tree = ParseSpecTree("a: 1\nb:\n  - \"2\"\n  - x\n  - true\n  - ~\n");
  ASSERT_OK(tree);
  ASSERT_EQ(tree->entries.size(), 2u);
  EXPECT_EQ(SpecNodePosition(tree->entries[1].key), " (line 2, column 1)");
  EXPECT_EQ(SpecNodePosition(tree->entries[1].value.items[0]), " (line 3, column 5)");
  const nlohmann::json expected = {{"a", 1}, {"b", {"2", "x", true, nullptr}}};
  EXPECT_EQ(*TreeJson("a: 1\nb:\n  - \"2\"\n  - x\n  - true\n  - ~\n"), expected);
  EXPECT_EQ(*TreeJson(R"({"a": 1, "b": ["2", "x", true, null]})"), expected);
  EXPECT_EQ(*TreeJson("n: 0.25\nm: -3\np: +4\n"),
            (nlohmann::json{{"n", 0.25}, {"m", -3}, {"p", 4}}));
}

TEST(SpecTreeTest, HostileDocumentsFailAloneNamingTheProblem) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "spec is empty"},
      {"a: [1\n", "invalid YAML at line 2"},
      {"{\"a\": }", "invalid JSON: "},
      {"a: 1\n---\nb: 2\n", "more than one YAML document"},
      {"? [a]\n: 1\n", "a map key must be a string"},
      {"a: *nowhere\n", "the referenced anchor is not defined"},
      {std::string(40, '[') + std::string(40, ']'), "nesting deeper than 32 levels"},
      // 100,000 deep, as JSON (the syntax check first) and as YAML: refused, never a crash.
      {"{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
       "nesting deeper than 32 levels"},
      {std::string(100000, '[') + std::string(100000, ']'), "nesting deeper than 32 levels"},
      // Aliases that expand a few lines into billions of values.
      {"a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
       "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\n"
       "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e]\n",
       "more than 100000 values (aliases expanded)"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    EXPECT_THAT(ParseSpecTree(text), StatusIs(StatusCode::kInvalidArgument, HasSubstr(message)));
  }
}

TEST(SpecTreeTest, DuplicateKeysAreKeptInTheTreeAndRefusedAsJson) {
  const Result<SpecNode> tree = ParseSpecTree("name: a\nname: b\n");
  ASSERT_OK(tree);
  EXPECT_EQ(tree->entries.size(), 2u);
  EXPECT_THAT(SpecTreeToJson(*tree),
              StatusIs(StatusCode::kInvalidArgument, "name: duplicate key (line 2, column 1)"));
}

TEST(SpecTreeTest, AStoredJsonValueBecomesATreeUnderTheSameLimits) {
  const Result<SpecNode> tree = SpecTreeFromJson(nlohmann::json{{"a", {1, "x"}}});
  ASSERT_OK(tree);
  EXPECT_EQ(SpecNodePosition(*tree), "");
  EXPECT_EQ(*SpecTreeToJson(*tree), (nlohmann::json{{"a", {1, "x"}}}));
  nlohmann::json deep = 1;
  for (int i = 0; i < 40; ++i) {
    deep = nlohmann::json::array({deep});
  }
  EXPECT_THAT(SpecTreeFromJson(deep),
              StatusIs(StatusCode::kInvalidArgument, "nesting deeper than 32 levels"));
}

}  // namespace
}  // namespace gpufleet::wire
