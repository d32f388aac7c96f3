// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/periodic_thread.h"

#include <utility>

namespace gpufleet {

void PeriodicThread::Start(Duration interval, std::function<void()> step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
    woken_ = false;
  }
  thread_ = std::thread([this, interval, step = std::move(step)] { Run(interval, step); });
}

void PeriodicThread::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

void PeriodicThread::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void PeriodicThread::Run(Duration interval, const std::function<void()>& step) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    woken_ = false;
    lock.unlock();
    step();
    lock.lock();
    cv_.wait_for(lock, interval, [this] { return stopping_ || woken_; });
  }
}

}  // namespace gpufleet
