// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string_view>
#include <vector>

// The dashboard's files (web/ and the chart library from web/node_modules), embedded in the
// binary at build time by cmake/EmbedFiles.cmake (src/gpufleet/api/CMakeLists.txt lists them).
namespace gpufleet::api::internal {

struct EmbeddedFile {
  std::string_view path;   // the URL path it is served at, e.g. "/assets/app.js"
  std::string_view bytes;  // static storage
};

// Every embedded file, in the order CMake lists them. Thread-safe.
const std::vector<EmbeddedFile>& EmbeddedFiles();

}  // namespace gpufleet::api::internal
