// SPDX-License-Identifier: Apache-2.0
// A fake libnvidia-ml: a shared library that exports the NVML functions NvmlProbe resolves and
// answers from a JSON script, so the real loader (dlopen, dlsym, versioned symbols, struct
// versions, error codes) is tested without a GPU. The script format and the control functions
// are documented in fake_nvml.h. Built three ways: complete; without
// nvmlDeviceGetHandleByIndex_v2 (GPUFLEET_FAKE_NVML_WITHOUT_HANDLE_BY_INDEX, a required
// function); and as an old driver (GPUFLEET_FAKE_NVML_LEGACY) without the optional
// nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetTemperatureV, nvmlDeviceGetCurrentClocksEventReasons,
// nvmlDeviceGetRemappedRows, GPM and event functions.
//
// Thread-safe: one mutex guards the scripted state.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/agent/nvml_api.h"

// The exported C symbols keep NVML's names.
// NOLINTBEGIN(readability-identifier-naming, google-runtime-int)
#define GPUFLEET_FAKE_NVML_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

namespace nvml = gpufleet::agent::nvml;
using Json = nlohmann::json;

constexpr uintptr_t kMigStride = 256;  // handle = 1 + gpu + kMigStride * (mig + 1)
constexpr unsigned int kMaxMigDevices = 7;

struct Event {
  int device = 0;
  unsigned long long code = 0;
  unsigned int gpu_instance_id = UINT32_MAX;
};

struct GpmSampleData {
  int device = -1;
  uint64_t sequence = 0;
};

struct State {
  std::mutex mu;
  std::optional<Json> script;
  std::string last_error;
  int init_count = 0;
  std::map<std::string, int, std::less<>> calls;
  std::deque<Event> events;
  std::map<int, unsigned long long> registered;  // device -> event mask
  uint64_t gpm_sequence = 0;
};

State& GetState() {
  static State* state = new State();  // never destroyed: calls may come during unload
  return *state;
}

const std::map<std::string_view, nvml::Return>& ErrorsByName() {
  static const auto* names = new std::map<std::string_view, nvml::Return>{
      {"NOT_SUPPORTED", nvml::Return::kNotSupported},
      {"NO_PERMISSION", nvml::Return::kNoPermission},
      {"GPU_IS_LOST", nvml::Return::kGpuIsLost},
      {"UNKNOWN", nvml::Return::kUnknown},
      {"DRIVER_NOT_LOADED", nvml::Return::kDriverNotLoaded},
      {"NOT_FOUND", nvml::Return::kNotFound},
      {"INVALID_ARGUMENT", nvml::Return::kInvalidArgument},
      {"TIMEOUT", nvml::Return::kTimeout},
      {"LIB_RM_VERSION_MISMATCH", nvml::Return::kLibRmVersionMismatch},
  };
  return *names;
}

// Keys a script may hold; a value key holds a number (or object) or the name of the error to
// answer. Unknown keys and error names fail the load, so a typo in a test cannot pass silently.
const std::set<std::string_view>& DeviceKeys() {
  static const auto* keys = new std::set<std::string_view>{"name",
                                                           "uuid",
                                                           "pci_bus_id",
                                                           "lost",
                                                           "xid_events",
                                                           "xids",
                                                           "mig",
                                                           "gpm",
                                                           "memory",
                                                           "utilization",
                                                           "temperature_c",
                                                           "slowdown_temperature_c",
                                                           "power_mw",
                                                           "sm_clock_mhz",
                                                           "mem_clock_mhz",
                                                           "ecc_dbe_volatile",
                                                           "remapped_rows",
                                                           "pcie_replay",
                                                           "memory_temperature_c",
                                                           "total_energy_mj",
                                                           "encoder_util",
                                                           "decoder_util",
                                                           "nvlink_data_kib",
                                                           "clocks_event_reasons",
                                                           "minor_number",
                                                           "cpu_affinity",
                                                           "nvlinks",
                                                           "serial",
                                                           "vbios_version"};
  return *keys;
}
const std::set<std::string_view>& MigKeys() {
  static const auto* keys = new std::set<std::string_view>{"uuid", "profile", "gpu_instance_id",
                                                           "compute_instance_id", "memory"};
  return *keys;
}
const std::set<std::string_view>& TopKeys() {
  static const auto* keys = new std::set<std::string_view>{
      "devices", "driver_version", "cuda_driver_version", "nvml_version", "init"};
  return *keys;
}
const std::set<std::string_view>& TextKeys() {
  static const auto* keys =
      new std::set<std::string_view>{"name",   "uuid",          "pci_bus_id",     "profile",
                                     "serial", "vbios_version", "driver_version", "nvml_version"};
  return *keys;
}

bool ValidateObject(const Json& object, const std::set<std::string_view>& allowed,
                    const std::string& where, std::string& error) {
  if (!object.is_object()) {
    error = "fake nvml script: " + where + " must be an object";
    return false;
  }
  for (const auto& [key, value] : object.items()) {
    if (!allowed.contains(key)) {
      error = "fake nvml script: " + where + ": unknown key \"" + key + "\"";
      return false;
    }
    if (value.is_string() && !TextKeys().contains(key) &&
        !ErrorsByName().contains(value.get<std::string>())) {
      error = "fake nvml script: " + where + "." + key + ": unknown error name \"" +
              value.get<std::string>() + "\"";
      return false;
    }
  }
  return true;
}

bool Validate(const Json& script, std::string& error) {
  if (!ValidateObject(script, TopKeys(), "script", error)) {
    return false;
  }
  if (!script.contains("devices") || !script["devices"].is_array()) {
    error = "fake nvml script: \"devices\" must be an array";
    return false;
  }
  for (size_t d = 0; d < script["devices"].size(); ++d) {
    const Json& device = script["devices"][d];
    const std::string where = "devices[" + std::to_string(d) + "]";
    if (!ValidateObject(device, DeviceKeys(), where, error)) {
      return false;
    }
    if (device.contains("mig")) {
      if (!device["mig"].is_array() || device["mig"].size() > kMaxMigDevices) {
        error = "fake nvml script: " + where + ".mig must be an array of at most 7 instances";
        return false;
      }
      for (size_t m = 0; m < device["mig"].size(); ++m) {
        if (!ValidateObject(device["mig"][m], MigKeys(), where + ".mig[" + std::to_string(m) + "]",
                            error)) {
          return false;
        }
      }
    }
  }
  return true;
}

// REQUIRES: state.mu held.
bool LoadLocked(State& state, const std::string& text) {
  Json script = Json::parse(text, nullptr, false);
  if (script.is_discarded()) {
    state.last_error = "fake nvml script: not valid JSON";
    return false;
  }
  if (!Validate(script, state.last_error)) {
    return false;
  }
  state.events.clear();
  const Json& devices = script["devices"];
  for (size_t d = 0; d < devices.size(); ++d) {
    if (!devices[d].contains("xids")) {
      continue;
    }
    for (const Json& xid : devices[d]["xids"]) {
      Event event;
      event.device = static_cast<int>(d);
      if (xid.is_object()) {
        event.code = xid.value("code", 0ULL);
        event.gpu_instance_id = xid.value("gpu_instance_id", UINT32_MAX);
      } else {
        event.code = xid.get<unsigned long long>();
      }
      state.events.push_back(event);
    }
  }
  state.script = std::move(script);
  return true;
}

// One call: counts it and holds the lock.
class Call {
 public:
  explicit Call(const char* function) : state_(GetState()), lock_(state_.mu) {
    ++state_.calls[function];
  }

  State& state() { return state_; }
  bool initialized() const { return state_.init_count > 0 && state_.script.has_value(); }
  const Json& script() const { return *state_.script; }
  const Json& devices() const { return (*state_.script)["devices"]; }

 private:
  State& state_;
  std::lock_guard<std::mutex> lock_;
};

// A call about one device handle: resolves the handle first, as NVML's device functions do, so
// each function goes on only once status() is kSuccess.
class DeviceCall : public Call {
 public:
  DeviceCall(const char* function, nvml::Device handle)
      : Call(function), status_(Resolve(handle)) {}

  // kSuccess, or why the handle names no device: not initialised, a bad handle, a lost GPU.
  nvml::Return status() const { return status_; }
  bool ok() const { return status_ == nvml::Return::kSuccess; }

  // The GPU's script entry and index; for a MIG device handle, of the GPU that holds it.
  const Json& device() const { return *device_; }
  int gpu() const { return gpu_; }
  // The MIG instance's entry; nullptr for a whole-GPU handle.
  const Json* mig() const { return mig_; }
  // The entry of what the handle names: the MIG instance's, else the GPU's.
  const Json& entry() const { return mig_ != nullptr ? *mig_ : *device_; }

 private:
  // A handle is 1 + gpu + kMigStride * (mig + 1), mig -1 for a whole GPU.
  nvml::Return Resolve(nvml::Device handle) {
    const auto value = reinterpret_cast<uintptr_t>(handle.handle);
    if (!initialized()) {
      return nvml::Return::kUninitialized;
    }
    if (value == 0) {
      return nvml::Return::kInvalidArgument;
    }
    gpu_ = static_cast<int>((value - 1) % kMigStride);
    const int mig = static_cast<int>((value - 1) / kMigStride) - 1;
    if (gpu_ >= static_cast<int>(devices().size())) {
      return nvml::Return::kInvalidArgument;
    }
    device_ = &devices()[static_cast<size_t>(gpu_)];
    if (mig >= 0) {
      if (!device_->contains("mig") || !(*device_)["mig"].is_array() ||
          mig >= static_cast<int>((*device_)["mig"].size())) {
        return nvml::Return::kInvalidArgument;
      }
      mig_ = &(*device_)["mig"][static_cast<size_t>(mig)];
    }
    if (device_->value("lost", false)) {
      return nvml::Return::kGpuIsLost;
    }
    return nvml::Return::kSuccess;
  }

  const Json* device_ = nullptr;
  const Json* mig_ = nullptr;
  int gpu_ = 0;
  nvml::Return status_;  // after the fields Resolve sets
};

// A scripted value: absent -> NOT_SUPPORTED, a string -> that error, otherwise success.
nvml::Return Lookup(const Json& object, const char* key, const Json*& value) {
  if (!object.contains(key)) {
    return nvml::Return::kNotSupported;
  }
  const Json& entry = object[key];
  if (entry.is_string()) {
    return ErrorsByName().at(entry.get<std::string>());
  }
  value = &entry;
  return nvml::Return::kSuccess;
}

template <typename T>
nvml::Return ReadNumber(const Json& object, const char* key, T* out) {
  const Json* value = nullptr;
  const nvml::Return rc = Lookup(object, key, value);
  if (rc == nvml::Return::kSuccess) {
    *out = value->get<T>();
  }
  return rc;
}

// A getter that answers one number of the GPU's script entry.
template <typename T>
nvml::Return DeviceNumber(const char* function, nvml::Device handle, const char* key, T* out) {
  DeviceCall call(function, handle);
  if (!call.ok()) {
    return call.status();
  }
  return ReadNumber(call.device(), key, out);
}

nvml::Return CopyString(const std::string& text, char* buffer, unsigned int length) {
  if (buffer == nullptr) {
    return nvml::Return::kInvalidArgument;
  }
  if (text.size() + 1 > length) {
    return nvml::Return::kInsufficientSize;
  }
  std::memcpy(buffer, text.c_str(), text.size() + 1);
  return nvml::Return::kSuccess;
}

constexpr unsigned long long kMiB = 1ULL << 20;

}  // namespace

// ---- control functions, found by tests with dlsym --------------------------------------------

// Replaces the script; returns 0, or -1 with the reason in gpufleet_fake_nvml_last_error().
// Handles stay valid across loads, so a test can change what a GPU answers between samples.
GPUFLEET_FAKE_NVML_EXPORT int gpufleet_fake_nvml_load_script(const char* json) {
  State& state = GetState();
  std::lock_guard<std::mutex> lock(state.mu);
  return LoadLocked(state, json == nullptr ? "" : json) ? 0 : -1;
}

GPUFLEET_FAKE_NVML_EXPORT const char* gpufleet_fake_nvml_last_error() {
  State& state = GetState();
  std::lock_guard<std::mutex> lock(state.mu);
  return state.last_error.c_str();
}

// How often `function` was called since the last reset.
GPUFLEET_FAKE_NVML_EXPORT int gpufleet_fake_nvml_call_count(const char* function) {
  State& state = GetState();
  std::lock_guard<std::mutex> lock(state.mu);
  const auto it = state.calls.find(function);
  return it == state.calls.end() ? 0 : it->second;
}

// Forgets the script, the call counts, the events and the initialisation.
GPUFLEET_FAKE_NVML_EXPORT void gpufleet_fake_nvml_reset() {
  State& state = GetState();
  std::lock_guard<std::mutex> lock(state.mu);
  state.script.reset();
  state.last_error.clear();
  state.init_count = 0;
  state.calls.clear();
  state.events.clear();
  state.registered.clear();
}

// ---- NVML ------------------------------------------------------------------------------------

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlInit_v2() {
  Call call("nvmlInit_v2");
  State& state = call.state();
  if (!state.script.has_value()) {
    // Without a script from a test, the environment may name a script file.
    const char* path = std::getenv("GPUFLEET_FAKE_NVML_SCRIPT");
    if (path == nullptr) {
      return nvml::Return::kDriverNotLoaded;
    }
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in || !LoadLocked(state, text.str())) {
      return nvml::Return::kDriverNotLoaded;
    }
  }
  if (state.script->contains("init")) {
    return ErrorsByName().at((*state.script)["init"].get<std::string>());
  }
  ++state.init_count;
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlShutdown() {
  Call call("nvmlShutdown");
  if (call.state().init_count == 0) {
    return nvml::Return::kUninitialized;
  }
  --call.state().init_count;
  if (call.state().init_count == 0) {
    call.state().registered.clear();
  }
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT const char* nvmlErrorString(nvml::Return result) {
  return nvml::ReturnName(result);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlSystemGetDriverVersion(char* version,
                                                                  unsigned int length) {
  Call call("nvmlSystemGetDriverVersion");
  if (!call.initialized()) {
    return nvml::Return::kUninitialized;
  }
  return CopyString(call.script().value("driver_version", "550.54.15"), version, length);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlSystemGetCudaDriverVersion_v2(int* version) {
  Call call("nvmlSystemGetCudaDriverVersion_v2");
  if (!call.initialized()) {
    return nvml::Return::kUninitialized;
  }
  return ReadNumber(call.script(), "cuda_driver_version", version);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlSystemGetNVMLVersion(char* version,
                                                                unsigned int length) {
  Call call("nvmlSystemGetNVMLVersion");
  if (!call.initialized()) {
    return nvml::Return::kUninitialized;
  }
  if (!call.script().contains("nvml_version")) {
    return nvml::Return::kNotSupported;
  }
  return CopyString(call.script()["nvml_version"].get<std::string>(), version, length);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetCount_v2(unsigned int* count) {
  Call call("nvmlDeviceGetCount_v2");
  if (!call.initialized()) {
    return nvml::Return::kUninitialized;
  }
  *count = static_cast<unsigned int>(call.devices().size());
  return nvml::Return::kSuccess;
}

#ifndef GPUFLEET_FAKE_NVML_WITHOUT_HANDLE_BY_INDEX
GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                                                     nvml::Device* device) {
  Call call("nvmlDeviceGetHandleByIndex_v2");
  if (!call.initialized()) {
    return nvml::Return::kUninitialized;
  }
  if (index >= call.devices().size()) {
    return nvml::Return::kInvalidArgument;
  }
  device->handle = reinterpret_cast<void*>(uintptr_t{1} + index);
  return nvml::Return::kSuccess;
}
#endif

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetName(nvml::Device handle, char* name,
                                                         unsigned int length) {
  DeviceCall call("nvmlDeviceGetName", handle);
  if (!call.ok()) {
    return call.status();
  }
  std::string text = call.device().value("name", "NVIDIA H100 80GB HBM3");
  if (call.mig() != nullptr) {
    text += " MIG " + call.mig()->value("profile", "");
  }
  return CopyString(text, name, length);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetUUID(nvml::Device handle, char* uuid,
                                                         unsigned int length) {
  DeviceCall call("nvmlDeviceGetUUID", handle);
  if (!call.ok()) {
    return call.status();
  }
  return CopyString(call.entry().value("uuid", ""), uuid, length);
}

namespace {

// A text key of a whole GPU (not of a MIG device); absent: NVML_ERROR_NOT_SUPPORTED.
nvml::Return DeviceText(const char* function, const char* key, nvml::Device handle, char* buffer,
                        unsigned int length) {
  DeviceCall call(function, handle);
  if (!call.ok()) {
    return call.status();
  }
  if (call.mig() != nullptr || !call.device().contains(key)) {
    return nvml::Return::kNotSupported;
  }
  return CopyString(call.device()[key].get<std::string>(), buffer, length);
}

}  // namespace

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetSerial(nvml::Device handle, char* serial,
                                                           unsigned int length) {
  return DeviceText("nvmlDeviceGetSerial", "serial", handle, serial, length);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetVbiosVersion(nvml::Device handle, char* version,
                                                                 unsigned int length) {
  return DeviceText("nvmlDeviceGetVbiosVersion", "vbios_version", handle, version, length);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetPciInfo_v3(nvml::Device handle,
                                                               nvml::PciInfo* pci) {
  DeviceCall call("nvmlDeviceGetPciInfo_v3", handle);
  if (!call.ok()) {
    return call.status();
  }
  *pci = nvml::PciInfo{};
  const std::string bus_id = call.device().value("pci_bus_id", "00000000:00:00.0");
  return CopyString(bus_id, pci->bus_id, sizeof(pci->bus_id));
}

// "minor_number": N; absent: NOT_SUPPORTED.
GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetMinorNumber(nvml::Device handle,
                                                                unsigned int* minor) {
  return DeviceNumber("nvmlDeviceGetMinorNumber", handle, "minor_number", minor);
}

// "cpu_affinity": [CPU ids]; absent: NOT_SUPPORTED.
GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetCpuAffinity(
    nvml::Device handle, unsigned int words,
    unsigned long* mask) {  // NOLINT(google-runtime-int): NVML's type
  DeviceCall call("nvmlDeviceGetCpuAffinity", handle);
  if (!call.ok()) {
    return call.status();
  }
  const Json* cpus = nullptr;
  const nvml::Return rc = Lookup(call.device(), "cpu_affinity", cpus);
  if (rc != nvml::Return::kSuccess) {
    return rc;
  }
  constexpr unsigned int kBits = 8 * sizeof(mask[0]);
  std::fill(mask, mask + words, 0UL);
  for (const Json& cpu : *cpus) {
    const unsigned int id = cpu.get<unsigned int>();
    if (id / kBits < words) {
      mask[id / kBits] |= 1UL << (id % kBits);
    }
  }
  return nvml::Return::kSuccess;
}

namespace {

// "nvlinks": [remote PCI bus id of link 0, ...]; "" is an inactive link; links past the list's
// end answer INVALID_ARGUMENT, as past a GPU's last link.
nvml::Return ScriptedNvlink(const char* function, nvml::Device handle, unsigned int link,
                            std::string& remote) {
  DeviceCall call(function, handle);
  if (!call.ok()) {
    return call.status();
  }
  const Json* links = nullptr;
  const nvml::Return rc = Lookup(call.device(), "nvlinks", links);
  if (rc != nvml::Return::kSuccess) {
    return rc;
  }
  if (!links->is_array() || link >= links->size()) {
    return nvml::Return::kInvalidArgument;
  }
  remote = (*links)[link].get<std::string>();
  return nvml::Return::kSuccess;
}

}  // namespace

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetNvLinkState(nvml::Device handle,
                                                                unsigned int link, int* active) {
  std::string remote;
  const nvml::Return rc = ScriptedNvlink("nvmlDeviceGetNvLinkState", handle, link, remote);
  if (rc == nvml::Return::kSuccess) {
    *active = remote.empty() ? 0 : nvml::kFeatureEnabled;
  }
  return rc;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetNvLinkRemotePciInfo_v2(nvml::Device handle,
                                                                           unsigned int link,
                                                                           nvml::PciInfo* pci) {
  std::string remote;
  const nvml::Return rc =
      ScriptedNvlink("nvmlDeviceGetNvLinkRemotePciInfo_v2", handle, link, remote);
  if (rc != nvml::Return::kSuccess) {
    return rc;
  }
  if (remote.empty()) {
    return nvml::Return::kNotSupported;
  }
  *pci = nvml::PciInfo{};
  return CopyString(remote, pci->bus_id, sizeof(pci->bus_id));
}

namespace {

// The memory of a GPU or MIG device: {"total_mib", "reserved_mib", "used_mib"} or an error.
nvml::Return ScriptedMemory(const Json& entry, unsigned long long& total,
                            unsigned long long& reserved, unsigned long long& used) {
  const Json* memory = nullptr;
  const nvml::Return rc = Lookup(entry, "memory", memory);
  if (rc != nvml::Return::kSuccess) {
    return rc;
  }
  total = memory->value("total_mib", 0ULL) * kMiB;
  reserved = memory->value("reserved_mib", 0ULL) * kMiB;
  used = memory->value("used_mib", 0ULL) * kMiB;
  return nvml::Return::kSuccess;
}

}  // namespace

#ifndef GPUFLEET_FAKE_NVML_LEGACY
GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetMemoryInfo_v2(nvml::Device handle,
                                                                  nvml::MemoryV2* memory) {
  DeviceCall call("nvmlDeviceGetMemoryInfo_v2", handle);
  if (!call.ok()) {
    return call.status();
  }
  // The real library checks the struct version; a bare 2 is the classic mistake.
  if (memory->version != nvml::kMemoryV2Version) {
    return nvml::Return::kArgumentVersionMismatch;
  }
  unsigned long long total = 0;
  unsigned long long reserved = 0;
  unsigned long long used = 0;
  const nvml::Return rc = ScriptedMemory(call.entry(), total, reserved, used);
  if (rc == nvml::Return::kSuccess) {
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - reserved - used;
  }
  return rc;
}
#endif

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetMemoryInfo(nvml::Device handle,
                                                               nvml::MemoryV1* memory) {
  DeviceCall call("nvmlDeviceGetMemoryInfo", handle);
  if (!call.ok()) {
    return call.status();
  }
  unsigned long long total = 0;
  unsigned long long reserved = 0;
  unsigned long long used = 0;
  const nvml::Return rc = ScriptedMemory(call.entry(), total, reserved, used);
  if (rc == nvml::Return::kSuccess) {
    // Version 1 counts the reserved memory as used.
    memory->total = total;
    memory->used = used + reserved;
    memory->free = total - reserved - used;
  }
  return rc;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetUtilizationRates(
    nvml::Device handle, nvml::Utilization* utilization) {
  DeviceCall call("nvmlDeviceGetUtilizationRates", handle);
  if (!call.ok()) {
    return call.status();
  }
  const Json* value = nullptr;
  const nvml::Return rc = Lookup(call.device(), "utilization", value);
  if (rc == nvml::Return::kSuccess) {
    utilization->gpu = value->value("gpu", 0U);
    utilization->memory = value->value("memory", 0U);
  }
  return rc;
}

#ifndef GPUFLEET_FAKE_NVML_LEGACY
GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetTemperatureV(nvml::Device handle,
                                                                 nvml::Temperature* temperature) {
  DeviceCall call("nvmlDeviceGetTemperatureV", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (temperature->version != nvml::kTemperatureV1Version ||
      temperature->sensor_type != nvml::kTemperatureGpu) {
    return nvml::Return::kArgumentVersionMismatch;
  }
  return ReadNumber(call.device(), "temperature_c", &temperature->temperature);
}
#endif

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetTemperature(nvml::Device handle, int sensor,
                                                                unsigned int* temperature) {
  DeviceCall call("nvmlDeviceGetTemperature", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (sensor != nvml::kTemperatureGpu) {
    return nvml::Return::kInvalidArgument;
  }
  return ReadNumber(call.device(), "temperature_c", temperature);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetTemperatureThreshold(nvml::Device handle,
                                                                         int threshold,
                                                                         unsigned int* temp) {
  DeviceCall call("nvmlDeviceGetTemperatureThreshold", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (threshold != nvml::kTemperatureThresholdSlowdown) {
    return nvml::Return::kNotSupported;
  }
  return ReadNumber(call.device(), "slowdown_temperature_c", temp);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetPowerUsage(nvml::Device handle,
                                                               unsigned int* milliwatts) {
  return DeviceNumber("nvmlDeviceGetPowerUsage", handle, "power_mw", milliwatts);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetClockInfo(nvml::Device handle, int type,
                                                              unsigned int* mhz) {
  DeviceCall call("nvmlDeviceGetClockInfo", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (type == nvml::kClockSm) {
    return ReadNumber(call.device(), "sm_clock_mhz", mhz);
  }
  if (type == nvml::kClockMem) {
    return ReadNumber(call.device(), "mem_clock_mhz", mhz);
  }
  return nvml::Return::kNotSupported;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetTotalEccErrors(nvml::Device handle,
                                                                   int error_type, int counter_type,
                                                                   unsigned long long* count) {
  DeviceCall call("nvmlDeviceGetTotalEccErrors", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (error_type != nvml::kMemoryErrorUncorrected || counter_type != nvml::kVolatileEcc) {
    return nvml::Return::kNotSupported;
  }
  return ReadNumber(call.device(), "ecc_dbe_volatile", count);
}

#ifndef GPUFLEET_FAKE_NVML_LEGACY
GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetRemappedRows(nvml::Device handle,
                                                                 unsigned int* correctable,
                                                                 unsigned int* uncorrectable,
                                                                 unsigned int* pending,
                                                                 unsigned int* failure) {
  DeviceCall call("nvmlDeviceGetRemappedRows", handle);
  if (!call.ok()) {
    return call.status();
  }
  const Json* rows = nullptr;
  const nvml::Return rc = Lookup(call.device(), "remapped_rows", rows);
  if (rc == nvml::Return::kSuccess) {
    *correctable = rows->value("correctable", 0U);
    *uncorrectable = rows->value("uncorrectable", 0U);
    *pending = rows->value("pending", 0U);
    *failure = rows->value("failure", 0U);
  }
  return rc;
}
#endif

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetPcieReplayCounter(nvml::Device handle,
                                                                      unsigned int* count) {
  return DeviceNumber("nvmlDeviceGetPcieReplayCounter", handle, "pcie_replay", count);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetTotalEnergyConsumption(
    nvml::Device handle, unsigned long long* millijoules) {
  return DeviceNumber("nvmlDeviceGetTotalEnergyConsumption", handle, "total_energy_mj",
                      millijoules);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetEncoderUtilization(
    nvml::Device handle, unsigned int* percent, unsigned int* sampling_period_us) {
  *sampling_period_us = 1'000'000;
  return DeviceNumber("nvmlDeviceGetEncoderUtilization", handle, "encoder_util", percent);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetDecoderUtilization(
    nvml::Device handle, unsigned int* percent, unsigned int* sampling_period_us) {
  *sampling_period_us = 1'000'000;
  return DeviceNumber("nvmlDeviceGetDecoderUtilization", handle, "decoder_util", percent);
}

// Fields: 82 from "memory_temperature_c" (unsigned int); 138 and 139 with the all-links scope
// from "nvlink_data_kib" ({"tx", "rx"}, unsigned long long); any other NOT_SUPPORTED. As the real
// library, SUCCESS once any value was filled.
GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetFieldValues(nvml::Device handle, int count,
                                                                nvml::FieldValue* values) {
  DeviceCall call("nvmlDeviceGetFieldValues", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (count <= 0 || values == nullptr) {
    return nvml::Return::kInvalidArgument;
  }
  bool any = false;
  for (int i = 0; i < count; ++i) {
    nvml::FieldValue& field = values[i];
    field.nvml_return = nvml::Return::kNotSupported;
    if (field.field_id == nvml::kFieldMemoryTemp) {
      field.value_type = nvml::kValueTypeUnsignedInt;
      field.nvml_return = ReadNumber(call.device(), "memory_temperature_c", &field.value.ui);
    } else if ((field.field_id == nvml::kFieldNvlinkThroughputDataTx ||
                field.field_id == nvml::kFieldNvlinkThroughputDataRx) &&
               field.scope_id == nvml::kScopeAllLinks) {
      const Json* traffic = nullptr;
      field.value_type = nvml::kValueTypeUnsignedLongLong;
      field.nvml_return = Lookup(call.device(), "nvlink_data_kib", traffic);
      if (field.nvml_return == nvml::Return::kSuccess) {
        field.nvml_return =
            ReadNumber(*traffic, field.field_id == nvml::kFieldNvlinkThroughputDataTx ? "tx" : "rx",
                       &field.value.ull);
      }
    }
    any = any || field.nvml_return == nvml::Return::kSuccess;
  }
  return any ? nvml::Return::kSuccess : nvml::Return::kNotSupported;
}

#ifndef GPUFLEET_FAKE_NVML_LEGACY
GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetCurrentClocksEventReasons(
    nvml::Device handle, unsigned long long* reasons) {
  return DeviceNumber("nvmlDeviceGetCurrentClocksEventReasons", handle, "clocks_event_reasons",
                      reasons);
}
#endif

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetCurrentClocksThrottleReasons(
    nvml::Device handle, unsigned long long* reasons) {
  return DeviceNumber("nvmlDeviceGetCurrentClocksThrottleReasons", handle, "clocks_event_reasons",
                      reasons);
}

// ---- MIG: a device with a "mig" array has MIG enabled with those instances --------------------

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetMigMode(nvml::Device handle,
                                                            unsigned int* current,
                                                            unsigned int* pending) {
  DeviceCall call("nvmlDeviceGetMigMode", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (!call.device().contains("mig")) {
    return nvml::Return::kNotSupported;
  }
  *current = nvml::kMigEnabled;
  *pending = nvml::kMigEnabled;
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetMaxMigDeviceCount(nvml::Device handle,
                                                                      unsigned int* count) {
  DeviceCall call("nvmlDeviceGetMaxMigDeviceCount", handle);
  if (!call.ok()) {
    return call.status();
  }
  *count = call.device().contains("mig") ? kMaxMigDevices : 0;
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetMigDeviceHandleByIndex(nvml::Device handle,
                                                                           unsigned int index,
                                                                           nvml::Device* out) {
  DeviceCall call("nvmlDeviceGetMigDeviceHandleByIndex", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (call.mig() != nullptr || !call.device().contains("mig")) {
    return nvml::Return::kInvalidArgument;
  }
  if (index >= call.device()["mig"].size()) {
    return nvml::Return::kNotFound;
  }
  const auto value = reinterpret_cast<uintptr_t>(handle.handle) + kMigStride * (index + 1);
  out->handle = reinterpret_cast<void*>(value);
  return nvml::Return::kSuccess;
}

namespace {

nvml::Return MigId(const char* function, const char* key, nvml::Device handle, unsigned int* id) {
  DeviceCall call(function, handle);
  if (!call.ok()) {
    return call.status();
  }
  if (call.mig() == nullptr) {
    return nvml::Return::kNotSupported;
  }
  return ReadNumber(*call.mig(), key, id);
}

}  // namespace

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetGpuInstanceId(nvml::Device handle,
                                                                  unsigned int* id) {
  return MigId("nvmlDeviceGetGpuInstanceId", "gpu_instance_id", handle, id);
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetComputeInstanceId(nvml::Device handle,
                                                                      unsigned int* id) {
  return MigId("nvmlDeviceGetComputeInstanceId", "compute_instance_id", handle, id);
}

// ---- events: each device's "xids" are queued when the script loads ---------------------------

#ifndef GPUFLEET_FAKE_NVML_LEGACY
GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlEventSetCreate(nvml::EventSet* set) {
  Call call("nvmlEventSetCreate");
  if (!call.initialized()) {
    return nvml::Return::kUninitialized;
  }
  set->handle = &call.state();
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlEventSetFree(nvml::EventSet set) {
  Call call("nvmlEventSetFree");
  return set.handle == &call.state() ? nvml::Return::kSuccess : nvml::Return::kInvalidArgument;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceGetSupportedEventTypes(nvml::Device handle,
                                                                        unsigned long long* types) {
  DeviceCall call("nvmlDeviceGetSupportedEventTypes", handle);
  if (!call.ok()) {
    return call.status();
  }
  *types = call.device().value("xid_events", true)
               ? nvml::kEventXidCriticalError | nvml::kEventGpuUnavailable | 0x2ULL
               : 0x2ULL;
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceRegisterEvents(nvml::Device handle,
                                                                unsigned long long types,
                                                                nvml::EventSet set) {
  DeviceCall call("nvmlDeviceRegisterEvents", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (set.handle != &call.state()) {
    return nvml::Return::kInvalidArgument;
  }
  if ((types & nvml::kEventXidCriticalError) != 0 && !call.device().value("xid_events", true)) {
    return nvml::Return::kNotSupported;
  }
  call.state().registered[call.gpu()] |= types;
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlEventSetWait_v2(nvml::EventSet set,
                                                           nvml::EventData* data,
                                                           unsigned int /*timeout_ms*/) {
  Call call("nvmlEventSetWait_v2");
  if (!call.initialized() || set.handle != &call.state()) {
    return nvml::Return::kInvalidArgument;
  }
  State& state = call.state();
  // Events of GPUs that did not register for XIDs are never delivered.
  while (!state.events.empty()) {
    const Event event = state.events.front();
    state.events.pop_front();
    const auto registered = state.registered.find(event.device);
    if (registered == state.registered.end() ||
        (registered->second & nvml::kEventXidCriticalError) == 0) {
      continue;
    }
    *data = nvml::EventData{};
    data->device.handle = reinterpret_cast<void*>(uintptr_t{1} + event.device);
    data->event_type = nvml::kEventXidCriticalError;
    data->event_data = event.code;
    data->gpu_instance_id = event.gpu_instance_id;
    data->compute_instance_id = UINT32_MAX;
    return nvml::Return::kSuccess;
  }
  return nvml::Return::kTimeout;
}

// ---- GPM: a device with a "gpm" object ({"sm_util", "dram_bw_util", "any_tensor_util",
// "graphics_util"} in percent, {"pcie_tx_mib_per_s", "pcie_rx_mib_per_s"} in MiB/s)
// supports it -----------------------------------------------------------------------------------

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlGpmQueryDeviceSupport(nvml::Device handle,
                                                                 nvml::GpmSupport* support) {
  DeviceCall call("nvmlGpmQueryDeviceSupport", handle);
  if (!call.ok()) {
    return call.status();
  }
  if (support->version != nvml::kGpmSupportVersion) {
    return nvml::Return::kArgumentVersionMismatch;
  }
  support->is_supported_device = call.device().contains("gpm") ? 1 : 0;
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlGpmSampleAlloc(nvml::GpmSample* sample) {
  Call call("nvmlGpmSampleAlloc");
  sample->handle = new GpmSampleData();
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlGpmSampleFree(nvml::GpmSample sample) {
  Call call("nvmlGpmSampleFree");
  delete static_cast<GpmSampleData*>(sample.handle);
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlGpmSampleGet(nvml::Device handle,
                                                        nvml::GpmSample sample) {
  DeviceCall call("nvmlGpmSampleGet", handle);
  if (!call.ok()) {
    return call.status();
  }
  auto* data = static_cast<GpmSampleData*>(sample.handle);
  data->device = call.gpu();
  data->sequence = ++call.state().gpm_sequence;
  return nvml::Return::kSuccess;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlGpmMetricsGet(nvml::GpmMetricsGet* request) {
  Call call("nvmlGpmMetricsGet");
  if (!call.initialized()) {
    return nvml::Return::kUninitialized;
  }
  if (request->version != nvml::kGpmMetricsGetVersion) {
    return nvml::Return::kArgumentVersionMismatch;
  }
  const auto* first = static_cast<const GpmSampleData*>(request->sample1.handle);
  const auto* second = static_cast<const GpmSampleData*>(request->sample2.handle);
  // The real library needs two samples of one GPU, in order.
  if (first == nullptr || second == nullptr || first->device < 0 ||
      first->device != second->device || first->sequence >= second->sequence ||
      request->num_metrics > static_cast<unsigned int>(nvml::kGpmMetricMax)) {
    return nvml::Return::kInvalidArgument;
  }
  const Json& device = call.devices()[static_cast<size_t>(first->device)];
  if (!device.contains("gpm")) {
    return nvml::Return::kNotSupported;
  }
  const Json& gpm = device["gpm"];
  for (unsigned int i = 0; i < request->num_metrics; ++i) {
    nvml::GpmMetric& metric = request->metrics[i];
    const char* key = metric.metric_id == nvml::kGpmMetricSmUtil          ? "sm_util"
                      : metric.metric_id == nvml::kGpmMetricDramBwUtil    ? "dram_bw_util"
                      : metric.metric_id == nvml::kGpmMetricAnyTensorUtil ? "any_tensor_util"
                      : metric.metric_id == nvml::kGpmMetricGraphicsUtil  ? "graphics_util"
                      : metric.metric_id == nvml::kGpmMetricPcieTxPerSec  ? "pcie_tx_mib_per_s"
                      : metric.metric_id == nvml::kGpmMetricPcieRxPerSec  ? "pcie_rx_mib_per_s"
                                                                          : "";
    metric.nvml_return = ReadNumber(gpm, key, &metric.value);
  }
  return nvml::Return::kSuccess;
}
#endif

// ---- traps: functions that change device state, which the probe must never call ------------

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceSetMigMode(nvml::Device, unsigned int,
                                                            nvml::Return*) {
  Call call("nvmlDeviceSetMigMode");
  return nvml::Return::kNoPermission;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceSetPersistenceMode(nvml::Device, int) {
  Call call("nvmlDeviceSetPersistenceMode");
  return nvml::Return::kNoPermission;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceSetPowerManagementLimit(nvml::Device,
                                                                         unsigned int) {
  Call call("nvmlDeviceSetPowerManagementLimit");
  return nvml::Return::kNoPermission;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceSetApplicationsClocks(nvml::Device, unsigned int,
                                                                       unsigned int) {
  Call call("nvmlDeviceSetApplicationsClocks");
  return nvml::Return::kNoPermission;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceSetGpuLockedClocks(nvml::Device, unsigned int,
                                                                    unsigned int) {
  Call call("nvmlDeviceSetGpuLockedClocks");
  return nvml::Return::kNoPermission;
}

GPUFLEET_FAKE_NVML_EXPORT nvml::Return nvmlDeviceClearEccErrorCounts(nvml::Device, int) {
  Call call("nvmlDeviceClearEccErrorCounts");
  return nvml::Return::kNoPermission;
}

// The names of every function called since the last reset, comma-separated (valid until the
// next call into the library).
GPUFLEET_FAKE_NVML_EXPORT const char* gpufleet_fake_nvml_called_functions() {
  State& state = GetState();
  std::lock_guard<std::mutex> lock(state.mu);
  static std::string names;
  names.clear();
  for (const auto& [name, count] : state.calls) {
    names += names.empty() ? "" : ",";
    names += name;
  }
  return names.c_str();
}

// NOLINTEND(readability-identifier-naming, google-runtime-int)
