// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"

// `gpufleet sim chaos` (docs/simulation.md): per seed, a small fleet (SimFleet: the production
// server and agents in one process on simulated time) runs a workload under a seeded schedule of
// faults, then heals and must drain, and the control plane's invariants are checked on the
// physical record. Each seed picks its own fault rates (swarm testing), some faults off; the same
// seed replays bit for bit.
namespace gpufleet::fleetsim {

// Bugs a test plants to show that the harness catches them (each is a decorator of a real part).
enum class PlantedBug {
  kNone,
  // The runner reports a task gone as soon as it is told to stop, while it still runs its
  // stop delay: its GPU is given to the next task too early.
  kEarlyRelease,
  // The runner ignores the lease deadline: a node cut off keeps running its tasks.
  kSkippedFence,
  // The store acknowledges one commit that creates a job without keeping it.
  kLostWrite,
  // With two servers, the store takes the commits of a server that no longer holds the leader
  // lease (no fencing): a leader waking from a pause writes over its successor's decisions.
  kUnfencedCommits,
  // The lease's fence gets the stop grace less the fence margin (the bug issue 37 found: the
  // margin taken twice, SIGKILL 14 s after SIGTERM instead of 30 s).
  kShortFenceGrace,
};

// "none", "early-release", "skipped-fence", "lost-write", "unfenced-commits",
// "short-fence-grace".
std::string_view PlantedBugName(PlantedBug bug);
// kInvalidArgument naming the valid names.
Result<PlantedBug> ParsePlantedBug(std::string_view name);

struct ChaosOptions {
  // Faults and submissions happen during the fault phase; then every fault heals and the fleet
  // must drain (every job final, every task gone) within the settle limit.
  Duration fault_phase = std::chrono::minutes(10);
  Duration settle_limit = std::chrono::minutes(40);
  int min_nodes = 3;
  int max_nodes = 5;
  int gpus_per_node = 4;
  int min_jobs = 12;
  int max_jobs = 28;
  PlantedBug planted = PlantedBug::kNone;
  // Keep every seed's event log tail, not only a failing one's.
  bool keep_events = false;
};

struct SeedOutcome {
  uint64_t seed = 0;
  std::vector<std::string> violations;
  // Faults injected, by kind (link faults as the link counted them).
  std::map<std::string, int> faults;
  int jobs = 0;
  size_t task_runs = 0;
  // A digest of the whole event log: two runs of one seed must give the same.
  uint64_t digest = 0;
  // The last events before the end (a failing seed's way there), and the command that replays it.
  std::string events;
  std::string replay;
};

// One seed. Errors are the harness's own (a fleet that cannot be made), not violations.
Result<SeedOutcome> RunChaosSeed(uint64_t seed, const ChaosOptions& options);

struct ChaosReport {
  uint64_t first_seed = 0;
  uint64_t last_seed = 0;
  std::vector<SeedOutcome> failing;
  std::map<std::string, int> faults;
  int64_t jobs = 0;
  int64_t task_runs = 0;
  int64_t violations = 0;
};

// Seeds first..last on up to `threads` threads; the report is the same for any thread count.
Result<ChaosReport> RunChaos(uint64_t first, uint64_t last, const ChaosOptions& options,
                             int threads);

// {"seeds", "violations", "faults": {kind: count}, "jobs", "task_runs", "failing": [{"seed",
// "violations", "replay", "events"}]}.
nlohmann::json ChaosReportJson(const ChaosReport& report);

// The command that replays one seed.
std::string ReplayCommand(uint64_t seed, const ChaosOptions& options);

}  // namespace gpufleet::fleetsim
