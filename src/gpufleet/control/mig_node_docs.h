// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <map>
#include <string>
#include <vector>

#include "gpufleet/core/mig.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/json_fields.h"

// The MIG part of the stored node documents (docs/agent.md, "MIG layouts"). Each MIG-enabled GPU
// of a node document carries:
//   "mig_instances": [{"profile", "start"}]          the layout the server wants; the scheduler
//                                                    sees it (NodeFromJson)
//   "mig_devices":   [{"uuid", "profile", "start"}]  what the agent last reported
//   "mig_error":     why the agent could not apply the wanted layout; absent when it did
// The instances a placement creates (`mig_created`) are not stored with the node: they belong to
// the placement and go when it ends, as the scheduling view's snapshot forgets them.
namespace gpufleet::control {

using wire::Json;

// `[{"profile", "start"}]` <-> instances (free); lenient like the other stored-document readers.
std::vector<MigInstance> MigInstancesFromJson(const Json& list);
Json MigInstancesToJsonList(const std::vector<MigInstance>& instances);

// True when both hold the same instances (profile and start), whatever the order and `in_use`.
bool SameMigInstances(const std::vector<MigInstance>& a, const std::vector<MigInstance>& b);

// The instances the placements of an active `job` on `node` created, by the NVML index their GPU
// has in `node_doc` now (found by UUID), added to `created`.
void AddCreatedMigInstances(const wire::JobRecord& job, const std::string& node,
                            const Json& node_doc, std::map<int, std::vector<MigInstance>>& created);

// The layouts to send the agent of `node_doc`: for each MIG-enabled GPU whose reported devices
// differ from the wanted instances (the stored layout plus `created`), the full wanted set.
std::vector<wire::WantedMigLayout> MigLayoutsToApply(
    const Json& node_doc, const std::map<int, std::vector<MigInstance>>& created);

// The reported device of `gpu_doc` with this profile and start; nullptr when there is none.
const Json* FindMigDevice(const Json& gpu_doc, const std::string& profile, int start);

}  // namespace gpufleet::control
