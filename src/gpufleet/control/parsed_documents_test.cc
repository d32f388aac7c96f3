// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/parsed_documents.h"

#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gpufleet/wire/job_spec.h"

namespace gpufleet::control {
namespace {

TEST(ParsedDocuments, ParsesAsParseDocumentDoes) {
  ParsedDocuments documents(1 << 20);
  const std::string text = R"({"state":"Running","placements":[{"node":"n1"}]})";
  EXPECT_EQ(documents.Parse("job", text), wire::ParseDocument(text));
  EXPECT_EQ(documents.Parse("job", text), wire::ParseDocument(text));
  EXPECT_EQ(documents.Parse("bad", "not json"), Json::object());
}

TEST(ParsedDocuments, AChangedTextUnderTheSameKeyIsParsedAgain) {
  ParsedDocuments documents(1 << 20);
  EXPECT_EQ(documents.Parse("job", R"({"state":"Running","v":1})")["state"], "Running");
  // A job deleted and submitted again under its name: same key, other text.
  EXPECT_EQ(documents.Parse("job", R"({"state":"Pending","v":1})")["state"], "Pending");
  EXPECT_EQ(documents.Parse("job", R"({"state":"Running","v":1})")["state"], "Running");
}

TEST(ParsedDocuments, KeepsTheSpecParsedWithItsDocument) {
  const GpuCatalog catalog = GpuCatalog::Default();
  ParsedDocuments documents(1 << 20, &catalog);
  const Result<Job> job = wire::ParseJobSpec(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: keep}
spec:
  tasks:
  - {name: main, image: busybox:1, command: [sleep, "1"], resources: {gpus: {count: 1}}}
)",
                                             catalog);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const std::string text =
      Json{{"name", "keep"}, {"state", "Running"}, {"spec", wire::JobSpecToJson(*job)}}.dump();
  const ParsedJob first = documents.ParseJob("keep", text);
  ASSERT_NE(first.spec, nullptr);
  ASSERT_TRUE(first.spec->ok()) << first.spec->status().ToString();
  EXPECT_EQ((*first.spec)->groups.at(0).image, "busybox:1");
  // The same text again: the spec parsed the first time, not a new parse.
  EXPECT_EQ(documents.ParseJob("keep", text).spec, first.spec);
  // A document whose spec does not read keeps the error.
  const ParsedJob broken = documents.ParseJob("broken", R"({"name":"broken","spec":{}})");
  ASSERT_NE(broken.spec, nullptr);
  EXPECT_FALSE(broken.spec->ok());
  // Without a catalog no spec is parsed.
  ParsedDocuments plain(1 << 20);
  EXPECT_EQ(plain.ParseJob("keep", text).spec, nullptr);
}

TEST(ParsedDocuments, ACallerChangingItsCopyDoesNotChangeTheKeptDocument) {
  ParsedDocuments documents(1 << 20);
  Json first = documents.Parse("job", R"({"tasks":[1,2]})");
  first["tasks"].push_back(3);
  first["state"] = "Failed";
  EXPECT_EQ(documents.Parse("job", R"({"tasks":[1,2]})"),
            wire::ParseDocument(R"({"tasks":[1,2]})"));
}

TEST(ParsedDocuments, KeepsAtMostItsBudgetOfTextPlusTwoDocuments) {
  constexpr size_t kBudget = 1000;
  ParsedDocuments documents(kBudget);
  size_t largest = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::string text = fmt::format(R"({{"n":{},"pad":"{}"}})", i, std::string(i % 97, 'x'));
    largest = std::max(largest, text.size());
    EXPECT_EQ(documents.Parse(fmt::format("job-{}", i % 300), text)["n"], i);
    ASSERT_LE(documents.TextBytesForTest(), kBudget + 2 * largest) << "after " << i;
  }
}

TEST(ParsedDocuments, ThreadsParsingTheSameKeysGetTheirOwnTexts) {
  ParsedDocuments documents(4096);
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        // Each thread's version of the same few keys, so that the kept text keeps changing.
        const std::string key = fmt::format("job-{}", i % 5);
        const std::string text = fmt::format(R"({{"thread":{},"round":{}}})", t, i % 3);
        const Json doc = documents.Parse(key, text);
        if (doc.value("thread", -1) != t || doc.value("round", -1) != i % 3) {
          ++wrong[static_cast<size_t>(t)];
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(wrong, std::vector<int>(kThreads, 0));
}

}  // namespace
}  // namespace gpufleet::control
