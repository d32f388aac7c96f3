// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/cuda_exercise.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>

namespace gpufleet::agent {
namespace {

// The CUDA driver API's types and the functions used, as cuda.h declares them (CUDA 11 and
// later names the versioned entry points, e.g. cuMemAlloc_v2).
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;  // NOLINT: the driver's exact type

struct CudaApi {
  CUresult (*init)(unsigned int) = nullptr;
  CUresult (*device_get_by_pci_bus_id)(CUdevice*, const char*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*primary_ctx_release)(CUdevice) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*ctx_synchronize)() = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*module_unload)(CUmodule) = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*mem_free)(CUdeviceptr) = nullptr;
  CUresult (*memset_d32)(CUdeviceptr, unsigned int, size_t) = nullptr;
  CUresult (*memcpy_dtoh)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                            unsigned int, unsigned int, unsigned int, CUstream, void**,
                            void**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;  // optional
};

// Two kernels over n 32-bit words with a grid-stride loop. gpufleet_fill writes
// hash(index ^ seed) ^ mask to each word; gpufleet_check recomputes it and adds one to *errors
// for each word that differs. The hash (multiply, shift, xor: murmur3's finaliser with the
// golden-ratio multiplier first) is CudaPatternWord; the multipliers are written as the signed
// 32-bit values of 0x9E3779B1 and 0x85EBCA77. PTX 6.0 for sm_50: every driver since CUDA 9
// compiles it for its GPUs. The kernels share their loop and hash, spliced in below.
//
// Registers: %rd1 buffer, %rd2 n, %r1 seed, %r2 mask; the loop's index %rd3, stride %rd5; the
// word's address %rd7 and its pattern %r7. LABEL_ is each kernel's own prefix of its labels.
constexpr char kPtxLoopHead[] = R"(
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mul.wide.u32 %rd3, %r3, %r4;
    cvt.u64.u32 %rd4, %r5;
    add.s64 %rd3, %rd3, %rd4;
    mov.u32 %r6, %nctaid.x;
    mul.wide.u32 %rd5, %r6, %r4;
LABEL_LOOP:
    setp.ge.u64 %p1, %rd3, %rd2;
    @%p1 bra LABEL_DONE;
    cvt.u32.u64 %r7, %rd3;
    xor.b32 %r7, %r7, %r1;
    mul.lo.s32 %r7, %r7, -1640531535;
    shr.u32 %r8, %r7, 15;
    xor.b32 %r7, %r7, %r8;
    mul.lo.s32 %r7, %r7, -2048144777;
    shr.u32 %r8, %r7, 13;
    xor.b32 %r7, %r7, %r8;
    xor.b32 %r7, %r7, %r2;
    shl.b64 %rd6, %rd3, 2;
    add.s64 %rd7, %rd1, %rd6;
)";
constexpr char kPtxLoopTail[] = R"(
    add.s64 %rd3, %rd3, %rd5;
    bra LABEL_LOOP;
LABEL_DONE:
    ret;
}
)";

// `text` with its labels' LABEL_ prefix replaced by `prefix`.
std::string Labelled(std::string text, std::string_view prefix) {
  for (size_t at = text.find("LABEL_"); at != std::string::npos; at = text.find("LABEL_", at)) {
    text.replace(at, 6, prefix);
  }
  return text;
}

}  // namespace

std::string CudaPatternPtx() {
  return std::string(R"(
.version 6.0
.target sm_50
.address_size 64

.visible .entry gpufleet_fill(
    .param .u64 fill_buf,
    .param .u64 fill_n,
    .param .u32 fill_seed,
    .param .u32 fill_mask)
{
    .reg .pred %p<2>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [fill_buf];
    ld.param.u64 %rd2, [fill_n];
    ld.param.u32 %r1, [fill_seed];
    ld.param.u32 %r2, [fill_mask];
)") + Labelled(kPtxLoopHead, "FILL_") +
         R"(
    st.global.u32 [%rd7], %r7;
)" + Labelled(kPtxLoopTail, "FILL_") +
         R"(
.visible .entry gpufleet_check(
    .param .u64 check_buf,
    .param .u64 check_n,
    .param .u32 check_seed,
    .param .u32 check_mask,
    .param .u64 check_errors)
{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [check_buf];
    ld.param.u64 %rd2, [check_n];
    ld.param.u32 %r1, [check_seed];
    ld.param.u32 %r2, [check_mask];
    ld.param.u64 %rd8, [check_errors];
    cvta.to.global.u64 %rd8, %rd8;
)" + Labelled(kPtxLoopHead, "CHECK_") +
         R"(
    ld.global.u32 %r9, [%rd7];
    setp.ne.s32 %p2, %r9, %r7;
    @%p2 atom.global.add.u32 %r10, [%rd8], 1;
)" + Labelled(kPtxLoopTail, "CHECK_");
}

namespace {

constexpr unsigned int kBlockThreads = 256;
constexpr unsigned int kGridBlocks = 1024;
// Words compared on the host after each fill: the device's arithmetic against the CPU's.
constexpr size_t kHostCheckedWords = 256 * 1024;

template <typename Fn>
bool Bind(void* library, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(library, name));
  return out != nullptr;
}

// Opens the driver once per process and keeps it: libcuda is not made to be unloaded while its
// threads may still run. nullptr with `error` set when it does not load or lacks a function.
const CudaApi* LoadCuda(const std::string& library_path, std::string& error) {
  static std::mutex mu;
  static std::map<std::string, std::pair<std::unique_ptr<CudaApi>, std::string>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto found = loaded.find(library_path);
  if (found == loaded.end()) {
    auto api = std::make_unique<CudaApi>();
    std::string why;
    dlerror();
    void* library = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* text = dlerror();
      why = fmt::format("{} not found ({})", library_path, text != nullptr ? text : "dlopen");
    } else {
      const std::pair<const char*, bool> bound[] = {
          {"cuInit", Bind(library, "cuInit", api->init)},
          {"cuDeviceGetByPCIBusId",
           Bind(library, "cuDeviceGetByPCIBusId", api->device_get_by_pci_bus_id)},
          {"cuDeviceGet", Bind(library, "cuDeviceGet", api->device_get)},
          {"cuDevicePrimaryCtxRetain",
           Bind(library, "cuDevicePrimaryCtxRetain", api->primary_ctx_retain)},
          {"cuDevicePrimaryCtxRelease_v2",
           Bind(library, "cuDevicePrimaryCtxRelease_v2", api->primary_ctx_release)},
          {"cuCtxSetCurrent", Bind(library, "cuCtxSetCurrent", api->ctx_set_current)},
          {"cuCtxSynchronize", Bind(library, "cuCtxSynchronize", api->ctx_synchronize)},
          {"cuModuleLoadData", Bind(library, "cuModuleLoadData", api->module_load_data)},
          {"cuModuleGetFunction", Bind(library, "cuModuleGetFunction", api->module_get_function)},
          {"cuModuleUnload", Bind(library, "cuModuleUnload", api->module_unload)},
          {"cuMemAlloc_v2", Bind(library, "cuMemAlloc_v2", api->mem_alloc)},
          {"cuMemFree_v2", Bind(library, "cuMemFree_v2", api->mem_free)},
          {"cuMemsetD32_v2", Bind(library, "cuMemsetD32_v2", api->memset_d32)},
          {"cuMemcpyDtoH_v2", Bind(library, "cuMemcpyDtoH_v2", api->memcpy_dtoh)},
          {"cuLaunchKernel", Bind(library, "cuLaunchKernel", api->launch_kernel)},
      };
      Bind(library, "cuGetErrorString", api->get_error_string);
      for (const auto& [name, ok] : bound) {
        if (!ok && why.empty()) {
          why = fmt::format("{} lacks {} (driver older than CUDA 11?)", library_path, name);
        }
      }
    }
    found = loaded
                .emplace(library_path,
                         std::make_pair(why.empty() ? std::move(api) : nullptr, std::move(why)))
                .first;
  }
  error = found->second.second;
  return found->second.first.get();
}

// One run on one device; each method returns the failing call's description, empty on success.
class PatternRun {
 public:
  PatternRun(const CudaApi& api, CUdevice device) : api_(api), device_(device) {}
  ~PatternRun() {
    if (buffer_ != 0) {
      api_.mem_free(buffer_);
    }
    if (errors_ != 0) {
      api_.mem_free(errors_);
    }
    if (module_ != nullptr) {
      api_.module_unload(module_);
    }
    if (context_ != nullptr) {
      api_.primary_ctx_release(device_);
    }
  }
  PatternRun(const PatternRun&) = delete;
  PatternRun& operator=(const PatternRun&) = delete;

  std::string Named(const char* call, CUresult result) const {
    const char* text = nullptr;
    if (api_.get_error_string != nullptr) {
      api_.get_error_string(result, &text);
    }
    return fmt::format("{}: CUDA error {}{}{}", call, result, text != nullptr ? " " : "",
                       text != nullptr ? text : "");
  }

  std::string Open() {
    if (CUresult r = api_.primary_ctx_retain(&context_, device_); r != 0) {
      context_ = nullptr;
      return Named("cuDevicePrimaryCtxRetain", r);
    }
    if (CUresult r = api_.ctx_set_current(context_); r != 0) {
      return Named("cuCtxSetCurrent", r);
    }
    return "";
  }

  std::string LoadKernels() {
    const std::string ptx = CudaPatternPtx();
    if (CUresult r = api_.module_load_data(&module_, ptx.c_str()); r != 0) {
      module_ = nullptr;
      return Named("cuModuleLoadData", r);
    }
    if (CUresult r = api_.module_get_function(&fill_, module_, "gpufleet_fill"); r != 0) {
      return Named("cuModuleGetFunction(gpufleet_fill)", r);
    }
    if (CUresult r = api_.module_get_function(&check_, module_, "gpufleet_check"); r != 0) {
      return Named("cuModuleGetFunction(gpufleet_check)", r);
    }
    return "";
  }

  std::string Allocate(size_t words) {
    words_ = words;
    if (CUresult r = api_.mem_alloc(&buffer_, words * sizeof(uint32_t)); r != 0) {
      buffer_ = 0;
      return Named("cuMemAlloc", r);
    }
    if (CUresult r = api_.mem_alloc(&errors_, sizeof(uint32_t)); r != 0) {
      errors_ = 0;
      return Named("cuMemAlloc", r);
    }
    return "";
  }

  // Fills with the pattern of (seed, mask), checks it on the device and a slice of it on the
  // host; the words that differ on each side.
  std::string Pass(uint32_t seed, uint32_t mask, uint64_t& device_errors, uint64_t& host_errors) {
    if (CUresult r = api_.memset_d32(errors_, 0, 1); r != 0) {
      return Named("cuMemsetD32", r);
    }
    uint64_t n = words_;
    void* fill_args[] = {&buffer_, &n, &seed, &mask};
    if (CUresult r = api_.launch_kernel(fill_, kGridBlocks, 1, 1, kBlockThreads, 1, 1, 0, nullptr,
                                        fill_args, nullptr);
        r != 0) {
      return Named("cuLaunchKernel(gpufleet_fill)", r);
    }
    void* check_args[] = {&buffer_, &n, &seed, &mask, &errors_};
    if (CUresult r = api_.launch_kernel(check_, kGridBlocks, 1, 1, kBlockThreads, 1, 1, 0, nullptr,
                                        check_args, nullptr);
        r != 0) {
      return Named("cuLaunchKernel(gpufleet_check)", r);
    }
    if (CUresult r = api_.ctx_synchronize(); r != 0) {
      return Named("cuCtxSynchronize", r);
    }
    uint32_t counted = 0;
    if (CUresult r = api_.memcpy_dtoh(&counted, errors_, sizeof(counted)); r != 0) {
      return Named("cuMemcpyDtoH", r);
    }
    device_errors += counted;
    std::vector<uint32_t> slice(std::min(words_, kHostCheckedWords));
    if (CUresult r = api_.memcpy_dtoh(slice.data(), buffer_, slice.size() * sizeof(uint32_t));
        r != 0) {
      return Named("cuMemcpyDtoH", r);
    }
    for (size_t i = 0; i < slice.size(); ++i) {
      host_errors += slice[i] != (CudaPatternWord(i, seed) ^ mask) ? 1 : 0;
    }
    return "";
  }

 private:
  const CudaApi& api_;
  const CUdevice device_;
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction fill_ = nullptr;
  CUfunction check_ = nullptr;
  CUdeviceptr buffer_ = 0;
  CUdeviceptr errors_ = 0;
  size_t words_ = 0;
};

}  // namespace

uint32_t CudaPatternWord(uint64_t index, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(index) ^ seed;
  x *= 0x9E3779B1u;
  x ^= x >> 15;
  x *= 0x85EBCA77u;
  x ^= x >> 13;
  return x;
}

std::vector<DiagnosticCheck> CudaExercise::Exercise(const GpuStaticInfo& gpu) {
  std::string error;
  const CudaApi* api = LoadCuda(options_.library, error);
  if (api == nullptr) {
    return {{"cuda", DiagnosticVerdict::kUnavailable, error}};
  }
  // The node's trouble (driver, permissions), not the device's: unavailable.
  if (CUresult r = api->init(0); r != 0) {
    return {
        {"cuda.init", DiagnosticVerdict::kUnavailable, fmt::format("cuInit: CUDA error {}", r)}};
  }
  CUdevice device = 0;
  // NVML and CUDA number GPUs differently; the PCI bus id names the same device in both.
  const CUresult found = gpu.pci_bus_id.empty()
                             ? api->device_get(&device, gpu.index)
                             : api->device_get_by_pci_bus_id(&device, gpu.pci_bus_id.c_str());
  if (found != 0) {
    return {{"cuda.init", DiagnosticVerdict::kFailed,
             fmt::format("the driver does not open GPU {} ({}): CUDA error {}", gpu.index,
                         gpu.pci_bus_id, found)}};
  }
  PatternRun run(*api, device);
  if (std::string failed = run.Open(); !failed.empty()) {
    return {{"cuda.init", DiagnosticVerdict::kFailed, failed}};
  }
  // A kernel this build cannot load, or memory another process holds, says nothing of the
  // device: unavailable, so that a healthy GPU is never quarantined for it.
  if (std::string failed = run.LoadKernels(); !failed.empty()) {
    return {{"cuda.init", DiagnosticVerdict::kUnavailable, failed}};
  }
  const size_t words =
      static_cast<size_t>(std::max<int64_t>(options_.pattern_mib, 1)) * 1024 * 1024 / 4;
  if (std::string failed = run.Allocate(words); !failed.empty()) {
    return {{"cuda.init", DiagnosticVerdict::kUnavailable, failed}};
  }
  std::vector<DiagnosticCheck> checks = {{"cuda.init", DiagnosticVerdict::kPassed, ""}};
  uint64_t device_errors = 0;
  uint64_t host_errors = 0;
  for (const auto& [seed, mask] : {std::pair<uint32_t, uint32_t>{0x5eed1234u, 0u},
                                   std::pair<uint32_t, uint32_t>{0x5eed1234u, 0xffffffffu}}) {
    if (std::string failed = run.Pass(seed, mask, device_errors, host_errors); !failed.empty()) {
      checks.push_back({"cuda.pattern", DiagnosticVerdict::kFailed, failed});
      return checks;
    }
  }
  checks.push_back({"cuda.pattern",
                    device_errors == 0 ? DiagnosticVerdict::kPassed : DiagnosticVerdict::kFailed,
                    device_errors == 0
                        ? fmt::format("{} MiB written and read back twice (pattern and complement)",
                                      options_.pattern_mib)
                        : fmt::format("{} words of {} MiB read back differently", device_errors,
                                      options_.pattern_mib)});
  checks.push_back(
      {"cuda.compute", host_errors == 0 ? DiagnosticVerdict::kPassed : DiagnosticVerdict::kFailed,
       host_errors == 0
           ? "the device's hashes match the host's"
           : fmt::format("{} of the device's hashes differ from the host's", host_errors)});
  return checks;
}

}  // namespace gpufleet::agent
