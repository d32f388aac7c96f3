// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/periodic_thread.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

#include <gtest/gtest.h>

namespace gpufleet {
namespace {

// Counts the steps and lets the test wait for the count to reach a number.
class StepCounter {
 public:
  void Step() {
    std::lock_guard<std::mutex> lock(mu_);
    ++steps_;
    cv_.notify_all();
  }
  // Whether `steps` were counted within a minute (a generous bound for a loaded CI machine).
  bool WaitFor(int steps) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::minutes(1), [&] { return steps_ >= steps; });
  }
  int steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int steps_ = 0;
};

constexpr Duration kAnHour = std::chrono::hours(1);

TEST(PeriodicThread, RunsAStepAtOnceThenEveryInterval) {
  StepCounter counter;
  PeriodicThread thread;
  thread.Start(std::chrono::milliseconds(1), [&] { counter.Step(); });
  EXPECT_TRUE(thread.running());
  EXPECT_TRUE(counter.WaitFor(5));
  thread.Stop();
  EXPECT_FALSE(thread.running());
}

TEST(PeriodicThread, WakeRunsTheNextStepWithoutWaitingTheInterval) {
  StepCounter counter;
  PeriodicThread thread;
  thread.Start(kAnHour, [&] { counter.Step(); });
  ASSERT_TRUE(counter.WaitFor(1));
  thread.Wake();
  EXPECT_TRUE(counter.WaitFor(2));
  thread.Wake();
  EXPECT_TRUE(counter.WaitFor(3));
}

TEST(PeriodicThread, StopWakesTheWaitAndNoStepRunsAfterIt) {
  StepCounter counter;
  PeriodicThread thread;
  thread.Start(kAnHour, [&] { counter.Step(); });
  ASSERT_TRUE(counter.WaitFor(1));
  // Returns at once although the next step is an hour away.
  const SystemClock clock;
  const MonoTime before = clock.Now();
  thread.Stop();
  EXPECT_LT(clock.Now() - before, std::chrono::minutes(1));
  EXPECT_EQ(counter.steps(), 1);
  thread.Wake();
  EXPECT_EQ(counter.steps(), 1);
}

TEST(PeriodicThread, StopLetsTheStepInProgressFinish) {
  std::mutex mu;
  std::condition_variable cv;
  bool in_step = false;
  bool finished = false;
  PeriodicThread thread;
  thread.Start(kAnHour, [&] {
    std::unique_lock<std::mutex> lock(mu);
    in_step = true;
    cv.notify_all();
    // Still inside the step when Stop is called: Stop cannot return before this step ends.
    cv.wait_for(lock, std::chrono::milliseconds(50));
    finished = true;
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::minutes(1), [&] { return in_step; }));
  }
  thread.Stop();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(finished);
}

TEST(PeriodicThread, StopIsIdempotentAndTheThreadCanStartAgain) {
  StepCounter counter;
  PeriodicThread thread;
  thread.Stop();
  thread.Start(kAnHour, [&] { counter.Step(); });
  ASSERT_TRUE(counter.WaitFor(1));
  thread.Stop();
  thread.Stop();
  thread.Start(kAnHour, [&] { counter.Step(); });
  EXPECT_TRUE(counter.WaitFor(2));
}

TEST(PeriodicThread, TheDestructorStopsTheThread) {
  StepCounter counter;
  {
    PeriodicThread thread;
    thread.Start(kAnHour, [&] { counter.Step(); });
    ASSERT_TRUE(counter.WaitFor(1));
  }
  EXPECT_EQ(counter.steps(), 1);
}

}  // namespace
}  // namespace gpufleet
