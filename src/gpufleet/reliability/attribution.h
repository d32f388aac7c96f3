// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/ids.h"
#include "gpufleet/core/status.h"
#include "gpufleet/reliability/inventory.h"
#include "gpufleet/reliability/outcome.h"

// Failure attribution: which GPUs and nodes fail more jobs than their exposure explains.
//
// Every run is an outcome record. A failure is counted against a device when a hardware XID or
// failing health check names it (attributed), or when the failure names no device and the device
// was part of a small run (unattributed; at most `max_shared_gpus` GPUs). Under the null
// hypothesis that the device is as reliable as the fleet, its count is Poisson with mean
//   expected = gpu_rate (or node_rate) x GPU-hours on the device
//            + sum over its small runs of unattributed_rate(size bucket) x run GPUs x run hours,
// so a device in many long or large runs is expected to see more failures. The fleet rates come
// from the whole window (with a weak prior), re-estimated without the runs of devices flagged in
// the previous pass so that a few bad devices do not inflate the base rate. Each device gets the
// exact one-sided Poisson p-value; Benjamini-Hochberg q-values are computed within each device
// kind; a device is flagged when q <= alpha, it has at least `min_failures` failures and at
// least `min_rate_ratio` times its expectation. Flagged devices explain away: an unattributed
// failure of a run that held a GPU flagged in the previous pass counts only for the strongest
// such GPU, not for the GPUs that shared the run with it, and nodes are tested without the runs
// that involved a flagged GPU of theirs, so one bad GPU condemns neither its neighbours nor its
// node. A GPU is flagged only with a failure that singles it out (named it, or held no other GPU
// of its node); a node flagged on unattributed failures only needs them spread over its GPUs.
// docs/reliability.md explains the method.
namespace gpufleet::reliability {

struct AttributionOptions {
  double alpha = 0.05;          // false-discovery rate, per device kind
  int min_failures = 3;         // never flag on fewer counted failures
  double min_rate_ratio = 4.0;  // failures / expected at least this
  // An unattributed failure is evidence against the devices of a run of at most this many GPUs;
  // larger runs are left out of such counts and of their expectation alike.
  int max_shared_gpus = 8;
  // A node flagged only on unattributed failures must have them spread over at least this many
  // of its GPUs (counting the failed runs that held one GPU of it); failures that fell on one or
  // two GPUs point at those GPUs, not at the node.
  int min_node_spread_gpus = 3;
  // Runs that ended longer ago are forgotten; zero keeps everything.
  Duration window = std::chrono::hours(24 * 30);
  // Passes (>= 1); each estimates the rates without the runs of the devices flagged in the pass
  // before and lets those devices explain away shared failures. Stops early when nothing changes.
  int max_passes = 4;
  // Each fleet rate starts from this prior rate (per GPU-hour) worth `prior_failures` failures;
  // it matters only while the fleet has little history.
  double prior_rate_per_gpu_hour = 1e-4;
  double prior_failures = 1.0;
  // How many top-ranked devices a report lists besides the flagged ones.
  int report_top = 20;
  // False when the records' GPUs stand for slots of their nodes rather than the GPUs the runs
  // really held (Slurm accounting names a job's nodes and GPU count, not its GPU indices): GPUs
  // are still tested and ranked but never flagged, so that none explains away its node's
  // failures. Set min_node_spread_gpus to 1 with it: the spread over GPUs is not known either.
  bool flag_gpus = true;

  // kInvalidArgument naming the field: alpha outside (0, 1), min_failures < 1, min_rate_ratio or
  // prior rate not positive, prior_failures negative, max_shared_gpus or min_node_spread_gpus
  // < 1, negative window, max_passes < 1, report_top < 0.
  Status Validate() const;
};

// Unattributed failures of runs of `min_gpus`..`max_gpus` GPUs.
struct SizeBucketRate {
  int min_gpus = 1;
  int max_gpus = 1;
  int failures = 0;
  double job_gpu_hours = 0;
  double rate = 0;  // per job GPU-hour, with the prior
};

// The fleet's base rates as estimated in the last pass.
struct FleetRates {
  double gpu_hours = 0;  // exposure of the runs the rates were estimated on
  int runs = 0;
  int gpu_blamed_failures = 0;   // failures naming a GPU (one per GPU named)
  int node_blamed_failures = 0;  // failures naming a node
  int unattributed_failures = 0;
  double gpu_rate = 0;                               // per GPU-hour
  double node_rate = 0;                              // per GPU-hour on the node
  double unattributed_rate = 0;                      // pooled over sizes, per job GPU-hour
  std::vector<SizeBucketRate> unattributed_by_size;  // sizes 1, 2, 3-4, 5-8, ... with any runs
};

// The evidence about one device.
struct DeviceEvidence {
  Device device;
  std::string leaf;
  int runs = 0;                 // runs on the device that count (in the window, since its reset)
  int failures = 0;             // counted failures
  int attributed_failures = 0;  // of which named the device (or, for a node, the node itself)
  // GPUs: failures that single it out, by naming it or in a run that held no other GPU of its
  // node. A GPU needs one to be flagged: hangs of jobs that took a whole node are shared alike
  // by all its GPUs and do not say which one is bad.
  int singling_failures = 0;
  double gpu_hours = 0;   // exposure on the device
  double expected = 0;    // failures expected at the fleet's rates
  int gpus_involved = 0;  // nodes: distinct GPUs of one-GPU-on-the-node failed runs
  double p_value = 1;
  double q_value = 1;
  bool flagged = false;
  std::map<int, int> xids;                   // XID -> times reported on the device
  std::map<std::string, int> health_checks;  // check -> times failed or warned

  // failures / expected (infinite for failures with nothing expected, 0 for none).
  double RateRatio() const;
  // True when an XID on the device asks for an immediate drain (xid_catalog.h).
  bool HasDrainNowXid() const;
};

struct AttributionReport {
  MonoTime time;
  int passes = 0;
  int runs = 0;         // in the window
  int failed_runs = 0;  // attributed or unattributed (application errors left out)
  int unattributed_failed_runs = 0;
  int application_failed_runs = 0;
  FleetRates rates;
  int gpus_tested = 0;  // devices with at least one run that counts
  int nodes_tested = 0;
  // Flagged devices, ranked: q-value, then p-value, then more failures first.
  std::vector<DeviceEvidence> suspects;
  // The `report_top` best-ranked devices that were not flagged.
  std::vector<DeviceEvidence> runners_up;
};

// "These k devices (x% of the fleet's GPUs) were involved in y% of failed runs; quarantining
// them would have avoided z failures." A failed run involves a device when it named the device,
// or named no device and ran on it with at most `max_shared_gpus` GPUs (the failures the
// attribution counts against devices).
struct FailureConcentration {
  int devices = 0;
  int gpus = 0;  // GPUs they cover (a node counts its GPUs once)
  double fleet_share = 0;
  int failed_runs = 0;  // attributed or unattributed, in the window
  int failed_runs_involving = 0;
  double failed_share = 0;
  // Failures the same runs would have had on average devices (the fleet's rates), and the
  // difference: what taking the devices out of service would have saved.
  double expected_involving = 0;
  double avoidable = 0;
};

// How many failed runs involved one device.
struct DeviceFailures {
  Device device;
  int failed_runs = 0;
};

// What a run reports when it ends.
struct JobEnd {
  JobId job;
  ExitReason exit_reason = ExitReason::kSucceeded;
  std::vector<XidEvent> xids;
  std::vector<HealthEvent> health_events;
};

// Keeps the outcome records of a window and tests every device against the fleet. Pure: no IO;
// time comes from the injected clock (run start and end, the window, resets). Not thread-safe.
class AttributionEngine {
 public:
  // kInvalidArgument for bad options. REQUIRES: `inventory` and `clock` outlive the engine.
  static Result<AttributionEngine> Create(const FleetInventory& inventory, const Clock& clock,
                                          AttributionOptions options);

  // A run of `job` started now on `gpus`. kInvalidArgument for an empty job id, a negative
  // attempt, no GPUs, an unknown or repeated GPU; kAlreadyExists when a run of the job is
  // already going. Nothing changes on error.
  Status JobStarted(const JobId& job, int attempt, const std::vector<GpuUuid>& gpus);

  // The run of `end.job` ended now: builds its outcome record, keeps it and returns it (for the
  // store). kNotFound, naming the job, when no run of it was started; kInvalidArgument (see
  // ValidateOutcome) for XIDs or health events on devices the run did not hold. Nothing changes
  // on error.
  Result<OutcomeRecord> JobEnded(const JobEnd& end);

  // A finished record from elsewhere (the store, after a restart). kInvalidArgument as
  // ValidateOutcome. Nothing changes on error.
  Status AddOutcome(const OutcomeRecord& record);

  // Forgets the evidence against `device` before now: a repaired or released device starts
  // clean. kNotFound for a device the inventory does not know.
  Status ResetDevice(const Device& device);

  // Tests every device on the runs of the window.
  AttributionReport Analyze() const;

  // The share of failures `devices` were involved in, with the rates of `report` (unknown
  // devices are skipped).
  FailureConcentration Concentration(const std::vector<Device>& devices,
                                     const FleetRates& rates) const;

  // Devices of `kind` with at least one failed run in the window involving them (as for
  // Concentration), most first (ties by device index).
  std::vector<DeviceFailures> FailuresByDevice(DeviceKind kind) const;

  int running_jobs() const { return static_cast<int>(running_.size()); }
  int stored_runs() const { return static_cast<int>(records_.size()); }
  const AttributionOptions& options() const { return options_; }

 private:
  struct Running {
    int attempt = 0;
    MonoTime start;
    std::vector<GpuUuid> gpus;
  };
  struct HealthMark {
    int gpu = -1;  // -1: the node as a whole
    int node = 0;
    std::string check;
  };
  // A record in dense indices, GPUs grouped by node.
  struct Stored {
    int64_t start_nanos = 0;
    int64_t end_nanos = 0;
    double hours = 0;
    uint64_t job_hash = 0;  // tells runs of one job apart from others
    FailureKind kind = FailureKind::kNone;
    std::vector<int> gpus;                   // sorted by node
    std::vector<std::pair<int, int>> nodes;  // (node, GPUs of the run on it), in `gpus` order
    std::vector<int> blamed_gpus;
    std::vector<int> blamed_nodes;
    std::vector<std::pair<int, int>> xids;  // (GPU, XID)
    std::vector<HealthMark> health;
    int size() const { return static_cast<int>(gpus.size()); }
  };
  struct Pass;

  AttributionEngine(const FleetInventory& inventory, const Clock& clock,
                    AttributionOptions options);

  void Store(const OutcomeRecord& record);
  int64_t WindowStart() const;
  FleetRates EstimateRates(const std::vector<const Stored*>& live,
                           const std::vector<bool>& excluded_gpus,
                           const std::vector<bool>& excluded_nodes) const;
  double UnattributedRate(const FleetRates& rates, int size) const;
  bool CountsForUnattributed(const Stored& record) const;

  const FleetInventory& inventory_;
  const Clock& clock_;
  AttributionOptions options_;
  std::unordered_map<std::string, Running> running_;
  std::deque<Stored> records_;
  std::vector<int64_t> gpu_since_;  // evidence from runs starting before this is ignored
  std::vector<int64_t> node_since_;
  std::vector<int> gpu_slot_;  // position of each GPU on its node
};

// The size bucket of a run of `gpus` GPUs: 0 for 1, 1 for 2, 2 for 3-4, 3 for 5-8, ...
int SizeBucket(int gpus);

}  // namespace gpufleet::reliability
