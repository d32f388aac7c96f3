// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/document_cache.h"

#include <gtest/gtest.h>

namespace gpufleet::wire {
namespace {

TEST(ParsedDocumentCache, ParsesAsParseDocumentDoesAndKeepsWhatWasUsed) {
  ParsedDocumentCache cache;
  EXPECT_EQ(cache.Parse("n1", "a", R"({"state":"Running"})"),
            ParseDocument(R"({"state":"Running"})"));
  EXPECT_EQ(cache.Parse("n1", "b", "not json"), Json::object());
  EXPECT_EQ(cache.size(), 2u);
  cache.EndUse("n1");
  EXPECT_EQ(cache.size(), 2u);
  // Only "a" is used before the next EndUse: "b" (a job that left the node) is dropped.
  (void)cache.Parse("n1", "a", R"({"state":"Running"})");
  cache.EndUse("n1");
  EXPECT_EQ(cache.size(), 1u);
  cache.EndUse("n1");
  EXPECT_EQ(cache.size(), 0u);
}

TEST(ParsedDocumentCache, AChangedTextIsParsedAgainEvenWithTheSameKey) {
  ParsedDocumentCache cache;
  EXPECT_EQ(cache.Parse("n1", "job", R"({"state":"Running","v":1})")["v"], 1);
  // A job deleted and submitted again under its name: same key, other text.
  EXPECT_EQ(cache.Parse("n1", "job", R"({"state":"Pending","v":1})")["state"], "Pending");
  EXPECT_EQ(cache.Parse("n1", "job", R"({"state":"Pending","v":1})")["state"], "Pending");
  EXPECT_EQ(cache.size(), 1u);
}

TEST(ParsedDocumentCache, ACallerChangingItsDocumentDoesNotChangeTheKeptOne) {
  ParsedDocumentCache cache;
  Json first = cache.Parse("n1", "job", R"({"tasks":[1,2]})");
  first["tasks"].push_back(3);
  first["state"] = "Failed";
  const Json second = cache.Parse("n1", "job", R"({"tasks":[1,2]})");
  EXPECT_EQ(second, ParseDocument(R"({"tasks":[1,2]})"));
}

TEST(ParsedDocumentCache, GroupsAreApart) {
  ParsedDocumentCache cache;
  (void)cache.Parse("n1", "job", R"({"a":1})");
  (void)cache.Parse("n2", "job", R"({"a":2})");
  cache.EndUse("n1");
  cache.EndUse("n1");  // n1 used nothing since: its entries go, n2's stay
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Parse("n2", "job", R"({"a":2})")["a"], 2);
}

}  // namespace
}  // namespace gpufleet::wire
