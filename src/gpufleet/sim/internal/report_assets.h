// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <vector>

#include "gpufleet/core/embedded_file.h"

// The chart library of the simulator's HTML reports (uPlot from web/node_modules, the dashboard's
// own), embedded in the binary at build time (src/gpufleet/sim/CMakeLists.txt lists the files),
// so that a report is one self-contained file.
namespace gpufleet::sim::internal {

// "uPlot.iife.min.js" and "uPlot.min.css". Thread-safe.
const std::vector<EmbeddedFile>& EmbeddedFiles();

}  // namespace gpufleet::sim::internal
