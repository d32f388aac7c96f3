// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpufleet/agent/diagnostics.h"
#include "gpufleet/agent/gpu_probe.h"

namespace gpufleet::agent {

// The built-in diagnostic's device exercise through the CUDA driver API, opened at run time
// (dlopen of libcuda.so.1, so building needs no CUDA toolkit), with its kernels as PTX text that
// the driver compiles (cuModuleLoadData). On the GPU with the device's PCI bus id it fills a
// buffer with a pattern that each word's index determines through integer hashing (the compute
// check), reads it back on the device counting the words that differ (the memory check), does
// the same with the complement, and compares a slice on the host against the same hash
// computed by the CPU. Where libcuda.so.1 does not load, one check says so, unavailable.
//
// It allocates pattern_mib of device memory for a few seconds at most: run it on a GPU held for
// the diagnostic, not beside a task. Thread-safe: each call has its own buffers, and the driver
// is opened once per process under a lock.
class CudaExercise final : public DeviceExercise {
 public:
  static constexpr const char* kDefaultLibrary = "libcuda.so.1";

  struct Options {
    std::string library = kDefaultLibrary;
    int64_t pattern_mib = 256;
  };

  explicit CudaExercise(Options options) : options_(std::move(options)) {}

  // "cuda.init", then "cuda.pattern" and "cuda.compute": failed with the driver's error or the
  // words that differ, passed with the MiB checked.
  std::vector<DiagnosticCheck> Exercise(const GpuStaticInfo& gpu) override;

 private:
  const Options options_;
};

// The word at `index` of the pattern for `seed`: what the fill kernel writes and the host checks.
uint32_t CudaPatternWord(uint64_t index, uint32_t seed);
// The PTX text of the two kernels, gpufleet_fill and gpufleet_check.
std::string CudaPatternPtx();

}  // namespace gpufleet::agent
