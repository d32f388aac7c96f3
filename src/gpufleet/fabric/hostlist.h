// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"

// Slurm hostlists: "tux[0-3,7],login1", "node[001-128]", "su[1-4]-leaf[1-8]". Numbers keep the
// width of the range's first bound ("node[01-10]" gives node01 .. node10); several bracket groups
// in one name give every combination, leftmost varying slowest.
namespace gpufleet::fabric {

// The names in order. kInvalidArgument naming the text for an unbalanced bracket, a range that
// runs backwards, a non-number inside brackets, or more than a million names.
Result<std::vector<std::string>> ExpandHostlist(std::string_view hostlist);

// The shortest hostlist this code writes for `names`: names that differ only in a trailing number
// fold into ranges ("node[01-04,07]"), prefixes in order of first appearance. Expanding the result
// gives the same names, sorted by number within each prefix.
std::string CompressHostlist(const std::vector<std::string>& names);

}  // namespace gpufleet::fabric
