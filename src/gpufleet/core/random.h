// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace gpufleet {

// A seeded pseudo-random source (xoshiro256**, seeded through splitmix64). Every draw is defined
// here rather than by <random> distributions, whose output differs between standard libraries,
// so the same seed gives the same sequence with g++ and clang++. Not thread-safe: one per thread.
class Random {
 public:
  explicit Random(uint64_t seed);

  uint64_t Next();
  // Uniform integer in [0, bound). REQUIRES: bound > 0.
  uint64_t Uniform(uint64_t bound);
  // Uniform double in [0, 1).
  double UniformDouble();

  // Fisher-Yates shuffle, deterministic for a given seed.
  template <typename T>
  void Shuffle(std::vector<T>& items) {
    for (size_t i = items.size(); i > 1; --i) {
      const size_t j = Uniform(i);
      std::swap(items[i - 1], items[j]);
    }
  }

 private:
  uint64_t state_[4];
};

}  // namespace gpufleet
