// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "gpufleet/fleetsim/chaos.h"
#include "gpufleet/fleetsim/sim_fleet.h"

namespace gpufleet::fleetsim {

// Puts the decorator that plants `bug` into the fleet's options (kNone: none): the tests of the
// chaos harness show that some seed of a CI run catches each planted bug.
void PlantBug(PlantedBug bug, FleetOptions& options);

}  // namespace gpufleet::fleetsim
