// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace gpufleet::sim {

// Runs body(i) for i in [0, count) on up to `threads` threads (the caller's among them). Each
// index runs exactly once; results written to slot i are therefore identical to a serial run.
inline void ParallelFor(size_t count, int threads, const std::function<void(size_t)>& body) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < count; i = next++) {
      body(i);
    }
  };
  std::vector<std::thread> pool;
  const size_t extra = std::min<size_t>(count, static_cast<size_t>(std::max(1, threads))) - 1;
  for (size_t t = 0; t < extra && count > 0; ++t) {
    pool.emplace_back(worker);
  }
  worker();
  for (std::thread& thread : pool) {
    thread.join();
  }
}

}  // namespace gpufleet::sim
