// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <vector>

#include "gpufleet/core/embedded_file.h"

// The dashboard's files (web/ and the chart library from web/node_modules), embedded in the
// binary at build time by cmake/EmbedFiles.cmake (src/gpufleet/api/CMakeLists.txt lists them).
namespace gpufleet::api::internal {

// Every embedded file, named by the URL path it is served at, in the order CMake lists them.
// Thread-safe.
const std::vector<EmbeddedFile>& EmbeddedFiles();

}  // namespace gpufleet::api::internal
