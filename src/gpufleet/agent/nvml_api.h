// SPDX-License-Identifier: Apache-2.0
#pragma once

// gpufleet's own declarations of the part of NVML's C ABI that the agent uses, so that the build
// needs no NVIDIA headers and the binary runs where no driver is installed: the library is
// opened with dlopen and every function is looked up with dlsym under its versioned symbol name
// (NVML's header maps e.g. `nvmlInit` to `nvmlInit_v2` with macros, which dlsym cannot see).
// Layouts follow NVML API 13 (go-nvml `pkg/nvml/nvml.h`); the static_asserts pin the sizes and
// offsets checked against that header. Names are gpufleet-style; each type notes its NVML name.

#include <climits>
#include <cstddef>
#include <cstdint>

namespace gpufleet::agent::nvml {

// nvmlReturn_t.
enum class Return : int {
  kSuccess = 0,
  kUninitialized = 1,
  kInvalidArgument = 2,
  kNotSupported = 3,
  kNoPermission = 4,
  kAlreadyInitialized = 5,
  kNotFound = 6,
  kInsufficientSize = 7,
  kInsufficientPower = 8,
  kDriverNotLoaded = 9,
  kTimeout = 10,
  kIrqIssue = 11,
  kLibraryNotFound = 12,
  kFunctionNotFound = 13,
  kCorruptedInforom = 14,
  kGpuIsLost = 15,
  kResetRequired = 16,
  kOperatingSystem = 17,
  kLibRmVersionMismatch = 18,
  kInUse = 19,
  kMemory = 20,
  kNoData = 21,
  kVgpuEccNotSupported = 22,
  kInsufficientResources = 23,
  kFreqNotSupported = 24,
  kArgumentVersionMismatch = 25,
  kDeprecated = 26,
  kNotReady = 27,
  kGpuNotFound = 28,
  kInvalidState = 29,
  kResetTypeNotSupported = 30,
  kUnknown = 999,
};

// The NVML macro name of a code, e.g. "NVML_ERROR_GPU_IS_LOST"; "NVML_ERROR_UNRECOGNIZED" for a
// code this header does not list.
inline const char* ReturnName(Return code) {
  switch (code) {
    case Return::kSuccess:
      return "NVML_SUCCESS";
    case Return::kUninitialized:
      return "NVML_ERROR_UNINITIALIZED";
    case Return::kInvalidArgument:
      return "NVML_ERROR_INVALID_ARGUMENT";
    case Return::kNotSupported:
      return "NVML_ERROR_NOT_SUPPORTED";
    case Return::kNoPermission:
      return "NVML_ERROR_NO_PERMISSION";
    case Return::kAlreadyInitialized:
      return "NVML_ERROR_ALREADY_INITIALIZED";
    case Return::kNotFound:
      return "NVML_ERROR_NOT_FOUND";
    case Return::kInsufficientSize:
      return "NVML_ERROR_INSUFFICIENT_SIZE";
    case Return::kInsufficientPower:
      return "NVML_ERROR_INSUFFICIENT_POWER";
    case Return::kDriverNotLoaded:
      return "NVML_ERROR_DRIVER_NOT_LOADED";
    case Return::kTimeout:
      return "NVML_ERROR_TIMEOUT";
    case Return::kIrqIssue:
      return "NVML_ERROR_IRQ_ISSUE";
    case Return::kLibraryNotFound:
      return "NVML_ERROR_LIBRARY_NOT_FOUND";
    case Return::kFunctionNotFound:
      return "NVML_ERROR_FUNCTION_NOT_FOUND";
    case Return::kCorruptedInforom:
      return "NVML_ERROR_CORRUPTED_INFOROM";
    case Return::kGpuIsLost:
      return "NVML_ERROR_GPU_IS_LOST";
    case Return::kResetRequired:
      return "NVML_ERROR_RESET_REQUIRED";
    case Return::kOperatingSystem:
      return "NVML_ERROR_OPERATING_SYSTEM";
    case Return::kLibRmVersionMismatch:
      return "NVML_ERROR_LIB_RM_VERSION_MISMATCH";
    case Return::kInUse:
      return "NVML_ERROR_IN_USE";
    case Return::kMemory:
      return "NVML_ERROR_MEMORY";
    case Return::kNoData:
      return "NVML_ERROR_NO_DATA";
    case Return::kVgpuEccNotSupported:
      return "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED";
    case Return::kInsufficientResources:
      return "NVML_ERROR_INSUFFICIENT_RESOURCES";
    case Return::kFreqNotSupported:
      return "NVML_ERROR_FREQ_NOT_SUPPORTED";
    case Return::kArgumentVersionMismatch:
      return "NVML_ERROR_ARGUMENT_VERSION_MISMATCH";
    case Return::kDeprecated:
      return "NVML_ERROR_DEPRECATED";
    case Return::kNotReady:
      return "NVML_ERROR_NOT_READY";
    case Return::kGpuNotFound:
      return "NVML_ERROR_GPU_NOT_FOUND";
    case Return::kInvalidState:
      return "NVML_ERROR_INVALID_STATE";
    case Return::kResetTypeNotSupported:
      return "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED";
    case Return::kUnknown:
      return "NVML_ERROR_UNKNOWN";
  }
  return "NVML_ERROR_UNRECOGNIZED";
}

// Opaque handles (nvmlDevice_t, nvmlEventSet_t, nvmlGpmSample_t): one pointer each.
struct Device {
  void* handle = nullptr;
};
struct EventSet {
  void* handle = nullptr;
};
struct GpmSample {
  void* handle = nullptr;
};

// Buffer sizes (NVML_DEVICE_*_BUFFER_SIZE, NVML_SYSTEM_*_BUFFER_SIZE); the _V2 sizes are the
// larger ones newer drivers may fill.
inline constexpr unsigned int kDeviceUuidBufferSize = 96;
inline constexpr unsigned int kDeviceNameBufferSize = 96;
inline constexpr unsigned int kSystemDriverVersionBufferSize = 80;
inline constexpr unsigned int kSystemNvmlVersionBufferSize = 80;
inline constexpr unsigned int kDeviceSerialBufferSize = 30;
inline constexpr unsigned int kDeviceVbiosVersionBufferSize = 32;

// nvmlTemperatureSensors_t, nvmlTemperatureThresholds_t, nvmlClockType_t.
inline constexpr int kTemperatureGpu = 0;
inline constexpr int kTemperatureThresholdSlowdown = 1;
inline constexpr int kClockSm = 1;
inline constexpr int kClockMem = 2;

// nvmlMemoryErrorType_t and nvmlEccCounterType_t.
inline constexpr int kMemoryErrorUncorrected = 1;
inline constexpr int kVolatileEcc = 0;

// NVML_DEVICE_MIG_ENABLE.
inline constexpr unsigned int kMigEnabled = 1;

// NVML_NVLINK_MAX_LINKS (API 12: 18, a B200 has 18 NVLink 5 links) and NVML_FEATURE_ENABLED,
// the nvmlEnableState_t of an active link.
inline constexpr unsigned int kNvlinkMaxLinks = 18;
inline constexpr int kFeatureEnabled = 1;

// nvmlEventType* bits.
inline constexpr unsigned long long kEventXidCriticalError = 0x8;   // NOLINT(google-runtime-int)
inline constexpr unsigned long long kEventGpuUnavailable = 0x4000;  // NOLINT(google-runtime-int)

// nvmlClocksEventReason* bits (the deprecated name is "throttle reason").
inline constexpr uint64_t kClocksEventGpuIdle = 0x1;
inline constexpr uint64_t kClocksEventApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kClocksEventSwPowerCap = 0x4;
inline constexpr uint64_t kClocksEventHwSlowdown = 0x8;
inline constexpr uint64_t kClocksEventSyncBoost = 0x10;
inline constexpr uint64_t kClocksEventSwThermalSlowdown = 0x20;
inline constexpr uint64_t kClocksEventHwThermalSlowdown = 0x40;
inline constexpr uint64_t kClocksEventHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kClocksEventDisplayClockSetting = 0x100;

// NVML_GPM_METRIC_* ids (percent, 0-100) and struct versions.
inline constexpr unsigned int kGpmMetricGraphicsUtil = 1;
inline constexpr unsigned int kGpmMetricSmUtil = 2;
inline constexpr unsigned int kGpmMetricAnyTensorUtil = 5;
inline constexpr unsigned int kGpmMetricDramBwUtil = 10;
// MiB per second, not percent.
inline constexpr unsigned int kGpmMetricPcieTxPerSec = 20;
inline constexpr unsigned int kGpmMetricPcieRxPerSec = 21;
inline constexpr unsigned int kGpmMetricsGetVersion = 1;
inline constexpr unsigned int kGpmSupportVersion = 1;
// NVML_GPM_METRIC_MAX in API 13. The library fills only `num_metrics` entries, so the array
// size does not have to match the driver's.
inline constexpr int kGpmMetricMax = 333;

// nvmlPciInfo_t.
struct PciInfo {
  char bus_id_legacy[16];  // "%04X:%02X:%02X.0"
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_sub_system_id;
  char bus_id[32];  // "%08X:%02X:%02X.0", dcgm-exporter's pci_bus_id
};
static_assert(sizeof(PciInfo) == 68);
static_assert(offsetof(PciInfo, bus_id) == 36);

// nvmlUtilization_t: percent of the last sample period (1/6 s to 1 s depending on the product).
struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};
static_assert(sizeof(Utilization) == 8);

// nvmlMemory_t (v1): `used` includes the memory the driver reserves.
struct MemoryV1 {
  unsigned long long total;  // NOLINT(google-runtime-int)
  unsigned long long free;   // NOLINT(google-runtime-int)
  unsigned long long used;   // NOLINT(google-runtime-int)
};
static_assert(sizeof(MemoryV1) == 24);

// nvmlMemory_v2_t: `used` excludes `reserved`.
struct MemoryV2 {
  unsigned int version;
  unsigned long long total;     // NOLINT(google-runtime-int)
  unsigned long long reserved;  // NOLINT(google-runtime-int)
  unsigned long long free;      // NOLINT(google-runtime-int)
  unsigned long long used;      // NOLINT(google-runtime-int)
};
static_assert(sizeof(MemoryV2) == 40);

// NVML_STRUCT_VERSION(data, ver): the size in the low bits, the version in the top byte. The
// driver rejects a bare `2` with NVML_ERROR_ARGUMENT_VERSION_MISMATCH.
constexpr unsigned int StructVersion(size_t size, unsigned int version) {
  return static_cast<unsigned int>(size) | (version << 24U);
}
inline constexpr unsigned int kMemoryV2Version = StructVersion(sizeof(MemoryV2), 2);
static_assert(kMemoryV2Version == 0x02000028);

// nvmlTemperature_t, read by nvmlDeviceGetTemperatureV (newer drivers).
struct Temperature {
  unsigned int version;
  int sensor_type;
  int temperature;
};
static_assert(sizeof(Temperature) == 12);
inline constexpr unsigned int kTemperatureV1Version = StructVersion(sizeof(Temperature), 1);
static_assert(kTemperatureV1Version == 0x0100000C);

// nvmlEventData_t.
struct EventData {
  Device device;
  unsigned long long event_type;  // NOLINT(google-runtime-int)
  unsigned long long event_data;  // NOLINT(google-runtime-int): the XID; 999 = unknown XID
  unsigned int gpu_instance_id;   // UINT_MAX when not MIG
  unsigned int compute_instance_id;
};
static_assert(sizeof(EventData) == 32);

// NVML_FI_DEV_* field ids for nvmlDeviceGetFieldValues.
inline constexpr unsigned int kFieldMemoryTemp = 82;               // C, unsigned int
inline constexpr unsigned int kFieldNvlinkThroughputDataTx = 138;  // KiB, unsigned long long
inline constexpr unsigned int kFieldNvlinkThroughputDataRx = 139;
// scopeId for a field summed over every NVLink of the GPU.
inline constexpr unsigned int kScopeAllLinks = 0xFFFFFFFFu;

// nvmlValueType_t values.
inline constexpr int kValueTypeDouble = 0;
inline constexpr int kValueTypeUnsignedInt = 1;
inline constexpr int kValueTypeUnsignedLong = 2;
inline constexpr int kValueTypeUnsignedLongLong = 3;
inline constexpr int kValueTypeSignedLongLong = 4;
inline constexpr int kValueTypeSignedInt = 5;

// nvmlFieldValue_t: `value` is valid only when `nvml_return` is kSuccess, of `value_type`.
struct FieldValue {
  unsigned int field_id;
  unsigned int scope_id;
  long long timestamp;     // NOLINT(google-runtime-int)
  long long latency_usec;  // NOLINT(google-runtime-int)
  int value_type;
  Return nvml_return;
  union {
    double d;
    unsigned int ui;
    unsigned long ul;        // NOLINT(google-runtime-int)
    unsigned long long ull;  // NOLINT(google-runtime-int)
    long long sll;           // NOLINT(google-runtime-int)
    int si;
  } value;
};
static_assert(sizeof(FieldValue) == 40);

// nvmlGpmSupport_t.
struct GpmSupport {
  unsigned int version;
  unsigned int is_supported_device;
};

// nvmlGpmMetric_t: `value` is valid only when `nvml_return` is kSuccess.
struct GpmMetric {
  unsigned int metric_id;
  Return nvml_return;
  double value;
  struct {
    char* short_name;
    char* long_name;
    char* unit;
  } metric_info;
};
static_assert(sizeof(GpmMetric) == 40);

// nvmlGpmMetricsGet_t.
struct GpmMetricsGet {
  unsigned int version;
  unsigned int num_metrics;
  GpmSample sample1;
  GpmSample sample2;
  GpmMetric metrics[kGpmMetricMax];
};
static_assert(sizeof(GpmMetricsGet) == 13344);

// Function types, one per symbol the agent resolves. Every one returns nvmlReturn_t.
// NOLINTBEGIN(google-runtime-int)
using InitFn = Return (*)();
using ShutdownFn = Return (*)();
using ErrorStringFn = const char* (*)(Return);
using SystemGetStringFn = Return (*)(char*, unsigned int);
using SystemGetCudaDriverVersionFn = Return (*)(int*);
using DeviceGetCountFn = Return (*)(unsigned int*);
using DeviceGetHandleByIndexFn = Return (*)(unsigned int, Device*);
using DeviceGetStringFn = Return (*)(Device, char*, unsigned int);
using DeviceGetPciInfoFn = Return (*)(Device, PciInfo*);
using DeviceGetUintFn = Return (*)(Device, unsigned int*);
using DeviceGetUllFn = Return (*)(Device, unsigned long long*);
using DeviceGetMemoryInfoFn = Return (*)(Device, MemoryV1*);
using DeviceGetMemoryInfoV2Fn = Return (*)(Device, MemoryV2*);
using DeviceGetUtilizationRatesFn = Return (*)(Device, Utilization*);
using DeviceGetTemperatureFn = Return (*)(Device, int, unsigned int*);
using DeviceGetTemperatureVFn = Return (*)(Device, Temperature*);
using DeviceGetTemperatureThresholdFn = Return (*)(Device, int, unsigned int*);
using DeviceGetClockInfoFn = Return (*)(Device, int, unsigned int*);
using DeviceGetTotalEccErrorsFn = Return (*)(Device, int, int, unsigned long long*);
using DeviceGetRemappedRowsFn = Return (*)(Device, unsigned int*, unsigned int*, unsigned int*,
                                           unsigned int*);
using DeviceGetMigModeFn = Return (*)(Device, unsigned int*, unsigned int*);
using DeviceGetMigDeviceHandleByIndexFn = Return (*)(Device, unsigned int, Device*);
using EventSetCreateFn = Return (*)(EventSet*);
using EventSetFreeFn = Return (*)(EventSet);
using DeviceRegisterEventsFn = Return (*)(Device, unsigned long long, EventSet);
using EventSetWaitFn = Return (*)(EventSet, EventData*, unsigned int);
using GpmQueryDeviceSupportFn = Return (*)(Device, GpmSupport*);
using GpmSampleAllocFn = Return (*)(GpmSample*);
using GpmSampleFreeFn = Return (*)(GpmSample);
using GpmSampleGetFn = Return (*)(Device, GpmSample);
using GpmMetricsGetFn = Return (*)(GpmMetricsGet*);
using DeviceGetCpuAffinityFn = Return (*)(Device, unsigned int, unsigned long*);
using DeviceGetNvLinkStateFn = Return (*)(Device, unsigned int, int*);
using DeviceGetNvLinkRemotePciInfoFn = Return (*)(Device, unsigned int, PciInfo*);
// nvmlDeviceGetEncoderUtilization, nvmlDeviceGetDecoderUtilization: percent, sampling period.
using DeviceGetCodecUtilizationFn = Return (*)(Device, unsigned int*, unsigned int*);
using DeviceGetFieldValuesFn = Return (*)(Device, int, FieldValue*);
// NOLINTEND(google-runtime-int)

}  // namespace gpufleet::agent::nvml
