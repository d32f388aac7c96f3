// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string_view>

namespace gpufleet {

// A file embedded in the binary at build time by cmake/EmbedFiles.cmake (gpufleet_embed_files in
// cmake/GpufleetTargets.cmake): the dashboard's files, the simulator reports' chart library.
struct EmbeddedFile {
  std::string_view path;   // the name it was embedded under, e.g. "/assets/app.js"
  std::string_view bytes;  // static storage
};

}  // namespace gpufleet
