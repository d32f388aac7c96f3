// SPDX-License-Identifier: Apache-2.0
// The remediation hooks run real commands through /bin/sh on the system clock.
#include "gpufleet/api/remediation_hooks.h"

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/control/outcome_json.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"

namespace gpufleet::api {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(ParseRemediationHooks, TakesOneCommandPerKnownAction) {
  const Result<std::map<std::string, std::string>> hooks =
      ParseRemediationHooks({"reset-gpu=nvidia-smi -r -i \"$GPUFLEET_GPU\"", "ticket=echo x=y"});
  ASSERT_OK(hooks);
  EXPECT_EQ(hooks->at("ticket"), "echo x=y");
  for (const std::string bad : {"reset-gpu", "reboot=true", "ticket=", "=true"}) {
    EXPECT_THAT(ParseRemediationHooks({bad}),
                gpufleet::testing::StatusIs(StatusCode::kInvalidArgument,
                                            HasSubstr("--remediation-hook: \"" + bad + "\"")));
  }
  EXPECT_THAT(ParseRemediationHooks({"ticket=a", "ticket=b"}),
              gpufleet::testing::StatusIs(StatusCode::kInvalidArgument,
                                          HasSubstr("a second hook for ticket")));
}

TEST(RemediationHooks, RunsTheActionsCommandWithItsArgumentsAndNoneOfTheServersEnvironment) {
  store::InMemoryStateStore store;
  store::WriteBatch batch;
  batch.Create(std::string(control::kNodesKind), "n1", "{}");
  batch.Create(std::string(control::kQuarantinesKind), "gpu:GPU-1", "{}");
  ASSERT_OK(store.Commit(batch));
  ::setenv("GPUFLEET_TEST_SECRET", "hunter2", 1);
  SystemClock clock;
  RemediationHooks hooks(
      {{"reset-gpu",
        "echo \"$1 $2 $GPUFLEET_ACTION $GPUFLEET_GPU_UUID secret=$GPUFLEET_TEST_SECRET\""},
       {"ticket", "sleep 5"}},
      store, clock, std::chrono::milliseconds(200));
  EXPECT_EQ(hooks.Start({.action = "reboot-node", .node = "n1", .gpu = 1, .gpu_uuid = "GPU-1"}),
            "no hook configured for reboot-node");
  EXPECT_EQ(hooks.Start({.action = "reset-gpu",
                         .node = "n1",
                         .gpu = 1,
                         .gpu_uuid = "GPU-1",
                         .reason = "diagnostic d1 Failed"}),
            "hook for reset-gpu started");
  EXPECT_EQ(hooks.Start({.action = "ticket", .node = "n1", .gpu = 1, .gpu_uuid = "GPU-1"}),
            "hook for ticket started");
  hooks.WaitIdle();
  const Result<std::vector<store::StoredEvent>> events =
      store.Events(control::kQuarantinesKind, "gpu:GPU-1");
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_THAT((*events)[0].text, StartsWith("remediation reset-gpu hook exited 0 after "));
  EXPECT_THAT((*events)[0].text, EndsWith(" s: n1 1 reset-gpu GPU-1 secret="));
  EXPECT_THAT((*events)[0].text, Not(HasSubstr("hunter2")));
  EXPECT_THAT((*events)[1].text, HasSubstr("remediation ticket hook timed out after"));
  const Result<std::vector<store::StoredEvent>> node_events =
      store.Events(control::kNodesKind, "n1");
  ASSERT_OK(node_events);
  EXPECT_THAT((*node_events)[0].text, HasSubstr("gpu 1: remediation reset-gpu hook exited 0"));
  ::unsetenv("GPUFLEET_TEST_SECRET");
}

}  // namespace
}  // namespace gpufleet::api
