// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/usage_report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/testing/fake_transport.h"

namespace gpufleet::cli {
namespace {

using ::gpufleet::http_testing::FakeClient;
using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kPath[] = "GET /v1/usage?from=2026-12-01T00:00:00Z&to=2026-12-02T00:00:00Z";

constexpr char kAnswer[] = R"({
  "from": "2026-12-01T00:00:00Z", "to": "2026-12-02T00:00:00Z", "by": "team",
  "rows": [
    {"key": "nlp", "allocatedGpuHours": 10.5, "busyGpuHours": 7.0, "idleGpuHours": 3.5,
     "models": [{"model": "H100-80GB", "allocatedGpuHours": 10.0, "busyGpuHours": 7.0,
                 "idleGpuHours": 3.0},
                {"model": "A100-80GB", "allocatedGpuHours": 0.5, "busyGpuHours": 0.0,
                 "idleGpuHours": 0.5}]},
    {"key": "=HYPERLINK(\"x\"),b", "allocatedGpuHours": 1.0, "busyGpuHours": 0.25,
     "idleGpuHours": 0.75,
     "models": [{"model": "T4", "allocatedGpuHours": 1.0, "busyGpuHours": 0.25,
                 "idleGpuHours": 0.75}]}],
  "unallocatedGpuHours": 180.5
})";

TEST(ParsePriceTable, ReadsCsvAndYamlAndCanonicalisesModels) {
  const Result<wire::PriceTable> csv = ParsePriceTable(
      "# on-demand list prices\nmodel,price_per_gpu_hour\nH100,2.49\nA100-80GB, 1.5 \n\n",
      "prices.csv");
  ASSERT_OK(csv);
  EXPECT_EQ(csv->micros_per_gpu_hour.at("H100-80GB"), 2'490'000);
  EXPECT_EQ(csv->micros_per_gpu_hour.at("A100-80GB"), 1'500'000);
  const Result<wire::PriceTable> yaml =
      ParsePriceTable("H100-80GB: 2.49  # reserved\n\"G2\": 0.000001\nT4: 0\n", "prices.yaml");
  ASSERT_OK(yaml);
  EXPECT_EQ(yaml->micros_per_gpu_hour.at("H100-80GB"), 2'490'000);
  EXPECT_EQ(yaml->micros_per_gpu_hour.at("G2"), 1);  // a trace model, kept as written
  EXPECT_EQ(yaml->micros_per_gpu_hour.at("T4"), 0);
}

TEST(ParsePriceTable, ErrorsNameTheLineAndTheField) {
  struct Case {
    std::string text;
    std::string message;
  };
  for (const Case& c : {
           Case{"H100,2.49\nA100,lots\n", "p:2: price of A100-40GB: \"lots\""},
           Case{"H100,2.49\nA100,-1\n", "p:2: price of A100-40GB: \"-1\""},
           Case{"H100: 1.1234567\n", "p:1: price of H100-80GB: \"1.1234567\""},
           Case{"H100: 99999999999999\n", "p:1: price of H100-80GB"},
           Case{"H100,2.49\nH100-80GB,3\n", "p:2: model: H100-80GB has a price already (line 1)"},
           Case{"H100,2.49\nA100: 3\n", "p:2: \"A100: 3\" is not MODEL,PRICE"},
           Case{"H100,1,2\n", "p:1: \"H100,1,2\" is not MODEL,PRICE"},
           Case{"H100: 1\n: 2\n", "p:2: model: empty"},
           Case{"# nothing\n\n", "p: no prices"},
       }) {
    SCOPED_TRACE(c.text);
    EXPECT_THAT(ParsePriceTable(c.text, "p"),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(RenderUsageCsv, OneLinePerGroupAndTheUnallocatedLineWithSafeKeys) {
  nlohmann::json report = nlohmann::json::parse(kAnswer);
  wire::PriceTable prices;
  prices.micros_per_gpu_hour = {{"H100-80GB", 2'000'000}, {"A100-80GB", 1'000'000}};
  (void)wire::AddCosts(report, prices);
  EXPECT_EQ(RenderUsageCsv(report, true),
            "team,allocated_gpu_hours,busy_gpu_hours,idle_gpu_hours,cost\n"
            "nlp,10.500000,7.000000,3.500000,20.50\n"
            "\"'=HYPERLINK(\"\"x\"\"),b\",1.000000,0.250000,0.750000,\n"
            "(unallocated),180.500000,,,\n");
  // A member's answer has no fleet line.
  report["unallocatedGpuHours"] = nullptr;
  EXPECT_THAT(RenderUsageCsv(report, false), Not(HasSubstr("unallocated")));
}

TEST(RenderUsageTable, ShowsBusyShareAndTheFleetLine) {
  const std::string text = RenderUsageTable(nlohmann::json::parse(kAnswer), false);
  EXPECT_THAT(text, HasSubstr("Usage from 2026-12-01T00:00:00Z to 2026-12-02T00:00:00Z\n"));
  EXPECT_THAT(text, HasSubstr("TEAM"));
  EXPECT_THAT(text, HasSubstr("ALLOCATED GPU-H   BUSY GPU-H   IDLE GPU-H   BUSY"));
  EXPECT_THAT(text, HasSubstr("10.500            7.000        3.500        67%"));
  EXPECT_THAT(text, HasSubstr("Unallocated (the fleet's GPUs no run held): 180.500 GPU-h\n"));
  nlohmann::json no_team = nlohmann::json::parse(kAnswer);
  no_team["rows"][0]["key"] = "";
  EXPECT_THAT(RenderUsageTable(no_team, false), HasSubstr("\n(no team)           10.500"));
}

TEST(RunUsageReport, AsksTheServerAndPrintsJsonWithCosts) {
  const FakeClock clock;
  const std::string prices_path =
      (std::filesystem::temp_directory_path() /
       ("gpufleet-prices-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
        ".csv"))
          .string();
  std::ofstream(prices_path) << "H100,2\nA100-80GB,1\nT4,0.5\n";
  FakeClient fake;
  fake.Answer(std::string(kPath) + "&by=team", 200, kAnswer);
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(RunUsageReport(fake.client,
                           {.from = "2026-12-01T00:00:00Z",
                            .to = "2026-12-02T00:00:00Z",
                            .by = "team",
                            .prices = prices_path,
                            .format = "json"},
                           clock, out, err),
            0)
      << err.str();
  std::remove(prices_path.c_str());
  EXPECT_EQ(err.str(), "");
  const nlohmann::json printed = nlohmann::json::parse(out.str());
  EXPECT_DOUBLE_EQ(printed["rows"][0]["cost"].get<double>(), 20.5);
  EXPECT_DOUBLE_EQ(printed["rows"][1]["cost"].get<double>(), 0.5);
  EXPECT_EQ(printed["unallocatedGpuHours"], 180.5);
}

TEST(RunUsageReport, BadArgumentsAndServerErrorsAreReported) {
  const FakeClock clock;
  FakeClient fake;
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(
      RunUsageReport(fake.client, {.from = "a", .to = "b", .format = "xlsx"}, clock, out, err), 1);
  EXPECT_THAT(err.str(), HasSubstr("--format: \"xlsx\" (expected table, csv or json)"));
  err.str("");
  EXPECT_EQ(RunUsageReport(fake.client, {.to = "b"}, clock, out, err), 1);
  EXPECT_THAT(err.str(), HasSubstr("--to: \"b\" is not an RFC 3339 time"));
  err.str("");
  EXPECT_EQ(RunUsageReport(fake.client, {.from = "a", .to = "b", .prices = "/nonexistent/p.csv"},
                           clock, out, err),
            1);
  EXPECT_THAT(err.str(), HasSubstr("cannot read prices \"/nonexistent/p.csv\""));
  EXPECT_TRUE(fake.state->requests.empty());
  err.str("");
  fake.Answer(
      "GET /v1/usage?from=monday&to=2026-12-02T00:00:00Z", 400,
      R"({"error": {"code": "INVALID_ARGUMENT", "message": "from: \"monday\" is not an RFC 3339 time"}})");
  EXPECT_EQ(RunUsageReport(fake.client, {.from = "monday", .to = "2026-12-02T00:00:00Z"}, clock,
                           out, err),
            1);
  EXPECT_THAT(err.str(), HasSubstr("Error from server (InvalidArgument): from: \"monday\""));
}

TEST(RunUsageReport, DefaultsToTheLastSevenDays) {
  // Now is 2026-12-08T12:00:00Z.
  const FakeClock clock{MonoTime{int64_t{1796731200} * 1'000'000'000}};
  FakeClient fake;
  fake.Answer("GET /v1/usage?from=2026-12-01T12:00:00Z&to=2026-12-08T12:00:00Z", 200, kAnswer);
  fake.Answer("GET /v1/usage?from=2026-11-24T00:00:00Z&to=2026-12-01T00:00:00Z", 200, kAnswer);
  fake.Answer("GET /v1/usage?from=2026-12-05T00:00:00Z&to=2026-12-08T12:00:00Z", 200, kAnswer);
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(RunUsageReport(fake.client, {}, clock, out, err), 0) << err.str();
  EXPECT_EQ(RunUsageReport(fake.client, {.to = "2026-12-01T00:00:00Z"}, clock, out, err), 0)
      << err.str();
  EXPECT_EQ(RunUsageReport(fake.client, {.from = "2026-12-05T00:00:00Z"}, clock, out, err), 0)
      << err.str();
  EXPECT_EQ(err.str(), "");
  EXPECT_EQ(fake.state->requests.size(), 3u);
}

}  // namespace
}  // namespace gpufleet::cli
