// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/xid_catalog.h"

#include <gtest/gtest.h>

namespace gpufleet::reliability {
namespace {

TEST(XidCatalog, ClassifiesTheCatalogRows) {
  const struct {
    int xid;
    XidAction action;
  } cases[] = {
      {13, XidAction::kApplication},    {31, XidAction::kApplication},
      {43, XidAction::kApplication},    {45, XidAction::kApplication},
      {68, XidAction::kApplication},    {92, XidAction::kMonitor},
      {121, XidAction::kMonitor},       {63, XidAction::kDrainAfterJob},
      {94, XidAction::kDrainAfterJob},  {109, XidAction::kDrainAfterJob},
      {46, XidAction::kDrainNow},       {48, XidAction::kDrainNow},
      {74, XidAction::kDrainNow},       {79, XidAction::kDrainNow},
      {95, XidAction::kDrainNow},       {119, XidAction::kDrainNow},
      {147, XidAction::kDrainNow},      {160, XidAction::kDrainNow},
      {999, XidAction::kDrainAfterJob},  // unknown: a hardware fault, as the device plugin does
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.xid);
    EXPECT_EQ(ClassifyXid(c.xid), c.action);
  }
  EXPECT_TRUE(XidBlamesGpu(79));
  EXPECT_TRUE(XidBlamesGpu(63));
  EXPECT_FALSE(XidBlamesGpu(13));
  EXPECT_FALSE(XidBlamesGpu(92));
  EXPECT_STREQ(XidActionName(XidAction::kDrainNow), "drain-now");
}

}  // namespace
}  // namespace gpufleet::reliability
