// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/hostlist.h"

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::fabric {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Hostlist, ExpandsRangesListsAndPlainNames) {
  EXPECT_THAT(*ExpandHostlist("tux[0-3,7],login1"),
              ElementsAre("tux0", "tux1", "tux2", "tux3", "tux7", "login1"));
  EXPECT_THAT(*ExpandHostlist("node[08-11]"), ElementsAre("node08", "node09", "node10", "node11"));
  EXPECT_THAT(*ExpandHostlist("s5"), ElementsAre("s5"));
}

TEST(Hostlist, SeveralBracketsGiveEveryCombinationLeftmostSlowest) {
  EXPECT_THAT(*ExpandHostlist("su[1-2]-leaf[1-2]"),
              ElementsAre("su1-leaf1", "su1-leaf2", "su2-leaf1", "su2-leaf2"));
}

TEST(Hostlist, MalformedListsNameTheText) {
  EXPECT_THAT(ExpandHostlist("tux[0-3"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"tux[0-3\": unbalanced '['")));
  EXPECT_THAT(ExpandHostlist("tux0-3]"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unbalanced ']'")));
  EXPECT_THAT(ExpandHostlist("tux[5-3]"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("range \"5-3\" runs backwards")));
  EXPECT_THAT(ExpandHostlist("tux[a-b]"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"a\" is not a number")));
  EXPECT_THAT(ExpandHostlist(""), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ExpandHostlist("n[0-9999999]"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("too long")));
}

TEST(Hostlist, CompressesToRangesKeepingWidths) {
  EXPECT_EQ(CompressHostlist({"node01", "node02", "node03", "node04", "node07"}), "node[01-04,07]");
  std::vector<std::string> tux;
  for (int i = 0; i < 16; ++i) {
    tux.push_back("tux" + std::to_string(i));
  }
  EXPECT_EQ(CompressHostlist(tux), "tux[0-15]");
  EXPECT_EQ(CompressHostlist({"b2", "a1", "b1", "login"}), "b[1-2],a1,login");
  EXPECT_EQ(CompressHostlist({"s5"}), "s5");
}

TEST(Hostlist, CompressThenExpandGivesTheNamesBack) {
  for (const char* list : {"dgx[001-127]", "su1-dgx[01-31],su2-dgx[01-32]", "tux[0-3,7,10-12]",
                           "rack[01-02]-tray[01-18]", "n[8-12],n[099-101]"}) {
    SCOPED_TRACE(list);
    std::vector<std::string> names = *ExpandHostlist(list);
    std::vector<std::string> again = *ExpandHostlist(CompressHostlist(names));
    std::sort(names.begin(), names.end());
    std::sort(again.begin(), again.end());
    EXPECT_EQ(names, again);
  }
}

}  // namespace
}  // namespace gpufleet::fabric
