// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

#include "gpufleet/core/status.h"

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

// run(i) for i in [0, count) on up to `threads` threads, results in index order; the first
// error (by index) is returned instead. `on_done` (called from the worker threads, so it must
// be thread-safe) follows progress.
template <typename T>
Result<std::vector<T>> ParallelMap(size_t count, int threads,
                                   const std::function<Result<T>(size_t)>& run,
                                   const std::function<void()>& on_done) {
  std::vector<Result<T>> results(count, InternalError("not run"));
  ParallelFor(count, threads, [&](size_t i) {
    results[i] = run(i);
    if (on_done) {
      on_done();
    }
  });
  std::vector<T> out;
  out.reserve(count);
  for (Result<T>& result : results) {
    if (!result.ok()) {
      return result.status();
    }
    out.push_back(std::move(result).value());
  }
  return out;
}

}  // namespace gpufleet::sim
