// SPDX-License-Identifier: Apache-2.0
// A thread that runs a step every interval until it is stopped: the start/stop/loop that the
// server's scheduling loop and the agent's telemetry sampler each need.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "gpufleet/core/clock.h"

namespace gpufleet {

// Thread-safe: Wake may be called from any thread, also from the step itself; Start and Stop
// from the owning thread, not racing each other. Stop is also called by the destructor, so a
// step that uses its owner's members must be stopped by the owner's destructor first.
class PeriodicThread {
 public:
  PeriodicThread() = default;
  ~PeriodicThread() { Stop(); }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Starts a thread that runs `step` at once, then again `interval` after each step ends (or as
  // soon as Wake was called), until Stop. REQUIRES: not running.
  void Start(Duration interval, std::function<void()> step);

  // Runs the next step without waiting out the interval; a wake during a step runs one more step
  // right after it. Does nothing when not running.
  void Wake();

  // Wakes the thread, lets a step in progress finish and joins the thread; no step runs after it
  // returns. Idempotent; the thread may be started again afterwards.
  void Stop();

  bool running() const { return thread_.joinable(); }

 private:
  void Run(Duration interval, const std::function<void()>& step);

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  bool woken_ = false;     // guarded by mu_
  std::thread thread_;
};

}  // namespace gpufleet
