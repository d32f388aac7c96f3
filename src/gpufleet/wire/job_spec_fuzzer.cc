// SPDX-License-Identifier: Apache-2.0
// libFuzzer entry point for the job spec parser. On any bytes ParseJobSpec must return (no crash,
// hang, leak or undefined behaviour), and a spec it accepts must come back the same through
// JobSpecToYaml and JobSpecToJson. Built by CMake only with clang; see CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gpufleet/wire/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const gpufleet::GpuCatalog* const catalog =
      new gpufleet::GpuCatalog(gpufleet::GpuCatalog::Default());
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const gpufleet::Result<gpufleet::Job> job = gpufleet::wire::ParseJobSpec(text, *catalog);
  if (!job.ok()) {
    return 0;
  }
  const nlohmann::json expected = gpufleet::wire::JobSpecToJson(*job);
  for (const std::string& again : {gpufleet::wire::JobSpecToYaml(*job), expected.dump()}) {
    const gpufleet::Result<gpufleet::Job> reparsed = gpufleet::wire::ParseJobSpec(again, *catalog);
    if (!reparsed.ok() || gpufleet::wire::JobSpecToJson(*reparsed) != expected) {
      std::fprintf(stderr, "round trip failed: %s\n--- written:\n%s\n",
                   reparsed.status().ToString().c_str(), again.c_str());
      std::abort();
    }
  }
  return 0;
}
