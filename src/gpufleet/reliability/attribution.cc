// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/attribution.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "gpufleet/reliability/statistics.h"
#include "gpufleet/reliability/xid_catalog.h"

namespace gpufleet::reliability {
namespace {

constexpr double kNanosPerHour = 3.6e12;
constexpr int kMaxBuckets = 32;

// (count + prior_failures) / (exposure + prior exposure): the rate with a prior worth
// `prior_failures` failures at `prior_rate`.
double ShrunkRate(double count, double exposure, double prior_rate, double prior_failures) {
  const double denominator = exposure + prior_failures / prior_rate;
  return denominator > 0 ? (count + prior_failures) / denominator : prior_rate;
}

std::pair<int, int> BucketRange(int bucket) {
  if (bucket == 0) {
    return {1, 1};
  }
  return {(1 << (bucket - 1)) + 1, 1 << bucket};
}

bool Contains(const std::vector<int>& values, int value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// Failures counted against devices of one kind, with their exposure.
struct Tally {
  std::vector<int> runs;
  std::vector<int> failures;
  std::vector<int> attributed;
  std::vector<int> singled_out;  // failures that named the device or held no other GPU of its node
  std::vector<double> gpu_hours;
  std::vector<double> shared;  // [device * buckets + bucket]: job GPU-hours of small runs
  int buckets = 0;

  Tally(int devices, int bucket_count)
      : runs(devices),
        failures(devices),
        attributed(devices),
        singled_out(devices),
        gpu_hours(devices),
        shared(static_cast<size_t>(devices) * bucket_count),
        buckets(bucket_count) {}
};

struct Tested {
  int index = 0;
  double expected = 0;
  double p = 1;
  double q = 1;
  bool flagged = false;
};

}  // namespace

int SizeBucket(int gpus) {
  int bucket = 0;
  int64_t cap = 1;
  while (cap < gpus) {
    cap *= 2;
    ++bucket;
  }
  return bucket;
}

Status AttributionOptions::Validate() const {
  if (!(alpha > 0 && alpha < 1)) {
    return InvalidArgumentError(fmt::format("alpha: {} (must be in (0, 1))", alpha));
  }
  if (min_failures < 1) {
    return InvalidArgumentError(fmt::format("min_failures: {} (must be >= 1)", min_failures));
  }
  if (!(min_rate_ratio > 0) || std::isinf(min_rate_ratio)) {
    return InvalidArgumentError(
        fmt::format("min_rate_ratio: {} (must be positive and finite)", min_rate_ratio));
  }
  if (max_shared_gpus < 1 || max_shared_gpus > (1 << 20)) {
    return InvalidArgumentError(
        fmt::format("max_shared_gpus: {} (must be 1..1048576)", max_shared_gpus));
  }
  if (window.count() < 0) {
    return InvalidArgumentError(fmt::format("window: {} ns (must be >= 0)", window.count()));
  }
  if (min_node_spread_gpus < 1) {
    return InvalidArgumentError(
        fmt::format("min_node_spread_gpus: {} (must be >= 1)", min_node_spread_gpus));
  }
  if (max_passes < 1) {
    return InvalidArgumentError(fmt::format("max_passes: {} (must be >= 1)", max_passes));
  }
  if (!(prior_rate_per_gpu_hour > 0) || std::isinf(prior_rate_per_gpu_hour)) {
    return InvalidArgumentError(fmt::format(
        "prior_rate_per_gpu_hour: {} (must be positive and finite)", prior_rate_per_gpu_hour));
  }
  if (!(prior_failures >= 0) || std::isinf(prior_failures)) {
    return InvalidArgumentError(
        fmt::format("prior_failures: {} (must be >= 0 and finite)", prior_failures));
  }
  if (report_top < 0) {
    return InvalidArgumentError(fmt::format("report_top: {} (must be >= 0)", report_top));
  }
  return Status::Ok();
}

double DeviceEvidence::RateRatio() const {
  if (failures == 0) {
    return 0;
  }
  return expected > 0 ? failures / expected : std::numeric_limits<double>::infinity();
}

bool DeviceEvidence::HasDrainNowXid() const {
  for (const auto& [xid, count] : xids) {
    if (count > 0 && ClassifyXid(xid) == XidAction::kDrainNow) {
      return true;
    }
  }
  return false;
}

AttributionEngine::AttributionEngine(const FleetInventory& inventory, const Clock& clock,
                                     AttributionOptions options)
    : inventory_(inventory),
      clock_(clock),
      options_(options),
      gpu_since_(inventory.gpu_count(), std::numeric_limits<int64_t>::min()),
      node_since_(inventory.node_count(), std::numeric_limits<int64_t>::min()),
      gpu_slot_(inventory.gpu_count(), 0) {
  for (int node = 0; node < inventory.node_count(); ++node) {
    const std::vector<int>& gpus = inventory.gpus_of_node(node);
    for (size_t slot = 0; slot < gpus.size(); ++slot) {
      gpu_slot_[gpus[slot]] = static_cast<int>(slot);
    }
  }
}

Result<AttributionEngine> AttributionEngine::Create(const FleetInventory& inventory,
                                                    const Clock& clock,
                                                    AttributionOptions options) {
  GPUFLEET_RETURN_IF_ERROR(options.Validate());
  return AttributionEngine(inventory, clock, options);
}

Status AttributionEngine::JobStarted(const JobId& job, int attempt,
                                     const std::vector<GpuUuid>& gpus) {
  if (job.empty()) {
    return InvalidArgumentError("job: empty id");
  }
  if (attempt < 0) {
    return InvalidArgumentError(fmt::format("attempt: {} (must be >= 0)", attempt));
  }
  if (gpus.empty()) {
    return InvalidArgumentError(fmt::format("gpus: job \"{}\" holds no GPU", job.value()));
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (inventory_.GpuIndex(gpus[i].value()) < 0) {
      return InvalidArgumentError(fmt::format("gpus[{}]: unknown GPU \"{}\"", i, gpus[i].value()));
    }
    if (!seen.insert(gpus[i].value()).second) {
      return InvalidArgumentError(
          fmt::format("gpus[{}]: GPU \"{}\" listed twice", i, gpus[i].value()));
    }
  }
  if (running_.count(job.value()) > 0) {
    return AlreadyExistsError(fmt::format("job \"{}\" already has a run going", job.value()));
  }
  running_.emplace(job.value(), Running{attempt, clock_.Now(), gpus});
  return Status::Ok();
}

Result<OutcomeRecord> AttributionEngine::JobEnded(const JobEnd& end) {
  const auto it = running_.find(end.job.value());
  if (it == running_.end()) {
    return NotFoundError(
        fmt::format("outcome for unknown job \"{}\": no run of it was started", end.job.value()));
  }
  OutcomeRecord record;
  record.job = end.job;
  record.attempt = it->second.attempt;
  record.exit_reason = end.exit_reason;
  record.start = it->second.start;
  record.end = clock_.Now();
  record.gpus = it->second.gpus;
  std::set<std::string> nodes;
  for (const GpuUuid& gpu : record.gpus) {
    const NodeId& node =
        inventory_.node_id(inventory_.node_of_gpu(inventory_.GpuIndex(gpu.value())));
    if (nodes.insert(node.value()).second) {
      record.nodes.push_back(node);
    }
  }
  record.xids = end.xids;
  record.health_events = end.health_events;
  GPUFLEET_RETURN_IF_ERROR(ValidateOutcome(record, inventory_));
  running_.erase(it);
  Store(record);
  return record;
}

Status AttributionEngine::AddOutcome(const OutcomeRecord& record) {
  GPUFLEET_RETURN_IF_ERROR(ValidateOutcome(record, inventory_));
  Store(record);
  return Status::Ok();
}

Status AttributionEngine::ResetDevice(const Device& device) {
  const int index = inventory_.IndexOf(device);
  if (index < 0) {
    return NotFoundError(fmt::format("unknown device: {}", device.ToString()));
  }
  std::vector<int64_t>& since = device.kind == DeviceKind::kGpu ? gpu_since_ : node_since_;
  since[index] = clock_.Now().nanos;
  return Status::Ok();
}

int64_t AttributionEngine::WindowStart() const {
  if (options_.window.count() == 0) {
    return std::numeric_limits<int64_t>::min();
  }
  return clock_.Now().nanos - options_.window.count();
}

void AttributionEngine::Store(const OutcomeRecord& record) {
  Stored stored;
  stored.start_nanos = record.start.nanos;
  stored.end_nanos = record.end.nanos;
  stored.hours = static_cast<double>(record.end.nanos - record.start.nanos) / kNanosPerHour;
  stored.job_hash = std::hash<std::string>()(record.job.value());
  for (const GpuUuid& gpu : record.gpus) {
    stored.gpus.push_back(inventory_.GpuIndex(gpu.value()));
  }
  std::stable_sort(stored.gpus.begin(), stored.gpus.end(), [this](int a, int b) {
    return inventory_.node_of_gpu(a) < inventory_.node_of_gpu(b);
  });
  for (int gpu : stored.gpus) {
    const int node = inventory_.node_of_gpu(gpu);
    if (stored.nodes.empty() || stored.nodes.back().first != node) {
      stored.nodes.emplace_back(node, 0);
    }
    ++stored.nodes.back().second;
  }
  const FailureAttribution attribution = AttributeFailure(record);
  stored.kind = attribution.kind;
  for (const GpuUuid& gpu : attribution.gpus) {
    stored.blamed_gpus.push_back(inventory_.GpuIndex(gpu.value()));
  }
  for (const NodeId& node : attribution.nodes) {
    stored.blamed_nodes.push_back(inventory_.NodeIndex(node.value()));
  }
  for (const XidEvent& event : record.xids) {
    stored.xids.emplace_back(inventory_.GpuIndex(event.gpu.value()), event.xid);
  }
  for (const HealthEvent& event : record.health_events) {
    stored.health.push_back(
        HealthMark{event.gpu.empty() ? -1 : inventory_.GpuIndex(event.gpu.value()),
                   inventory_.NodeIndex(event.node.value()), event.check});
  }
  // Runs without GPUs carry no GPU-hours to weigh failures against: they are validated and then
  // left out of the statistics.
  if (stored.gpus.empty()) {
    return;
  }
  records_.push_back(std::move(stored));
  const int64_t window_start = WindowStart();
  while (!records_.empty() && records_.front().end_nanos < window_start) {
    records_.pop_front();
  }
}

bool AttributionEngine::CountsForUnattributed(const Stored& record) const {
  return record.size() <= options_.max_shared_gpus;
}

FleetRates AttributionEngine::EstimateRates(const std::vector<const Stored*>& live,
                                            const std::vector<bool>& excluded_gpus,
                                            const std::vector<bool>& excluded_nodes) const {
  FleetRates rates;
  std::vector<int> bucket_failures(kMaxBuckets);
  std::vector<double> bucket_hours(kMaxBuckets);
  std::vector<int> bucket_runs(kMaxBuckets);
  for (const Stored* record : live) {
    const bool excluded =
        std::any_of(record->gpus.begin(), record->gpus.end(),
                    [&](int gpu) { return excluded_gpus[gpu]; }) ||
        std::any_of(record->nodes.begin(), record->nodes.end(),
                    [&](const std::pair<int, int>& node) { return excluded_nodes[node.first]; });
    if (excluded) {
      continue;
    }
    const double job_gpu_hours = record->size() * record->hours;
    const int bucket = std::min(SizeBucket(record->size()), kMaxBuckets - 1);
    ++rates.runs;
    rates.gpu_hours += job_gpu_hours;
    bucket_hours[bucket] += job_gpu_hours;
    ++bucket_runs[bucket];
    if (record->kind == FailureKind::kAttributed) {
      rates.gpu_blamed_failures += static_cast<int>(record->blamed_gpus.size());
      rates.node_blamed_failures += static_cast<int>(record->blamed_nodes.size());
    } else if (record->kind == FailureKind::kUnattributed) {
      ++rates.unattributed_failures;
      ++bucket_failures[bucket];
    }
  }
  const double prior_rate = options_.prior_rate_per_gpu_hour;
  const double prior = options_.prior_failures;
  rates.gpu_rate = ShrunkRate(rates.gpu_blamed_failures, rates.gpu_hours, prior_rate, prior);
  rates.node_rate = ShrunkRate(rates.node_blamed_failures, rates.gpu_hours, prior_rate, prior);
  rates.unattributed_rate =
      ShrunkRate(rates.unattributed_failures, rates.gpu_hours, prior_rate, prior);
  for (int bucket = 0; bucket < kMaxBuckets; ++bucket) {
    if (bucket_runs[bucket] == 0) {
      continue;
    }
    // Each size shrinks toward the pooled rate, so a size with few runs borrows from the rest.
    const auto [min_gpus, max_gpus] = BucketRange(bucket);
    rates.unattributed_by_size.push_back(SizeBucketRate{
        min_gpus, max_gpus, bucket_failures[bucket], bucket_hours[bucket],
        rates.unattributed_rate > 0 ? ShrunkRate(bucket_failures[bucket], bucket_hours[bucket],
                                                 rates.unattributed_rate, prior)
                                    : 0.0});
  }
  return rates;
}

double AttributionEngine::UnattributedRate(const FleetRates& rates, int size) const {
  for (const SizeBucketRate& bucket : rates.unattributed_by_size) {
    if (size >= bucket.min_gpus && size <= bucket.max_gpus) {
      return bucket.rate;
    }
  }
  return rates.unattributed_rate;
}

AttributionReport AttributionEngine::Analyze() const {
  AttributionReport report;
  report.time = clock_.Now();
  const int64_t window_start = WindowStart();
  std::vector<const Stored*> live;
  for (const Stored& record : records_) {
    if (record.end_nanos >= window_start) {
      live.push_back(&record);
      report.runs += 1;
      report.failed_runs +=
          record.kind == FailureKind::kAttributed || record.kind == FailureKind::kUnattributed;
      report.unattributed_failed_runs += record.kind == FailureKind::kUnattributed;
      report.application_failed_runs += record.kind == FailureKind::kApplication;
    }
  }
  const int gpu_count = inventory_.gpu_count();
  const int node_count = inventory_.node_count();
  const int shared_buckets = SizeBucket(options_.max_shared_gpus) + 1;

  // GPU counts. A run that fails again and again without naming a device counts once against
  // each of its devices: a job that keeps crashing on its own is more likely broken than its
  // devices. An unattributed failure of a run that held a GPU flagged in the previous pass counts
  // only for the strongest such GPU (smallest p-value): it explains the failure, so the GPUs that
  // happened to share the run with it (the rest of its node, for 8-GPU jobs) are not blamed too.
  auto tally_gpus = [&](const std::vector<double>& flagged_p) {
    Tally tally(gpu_count, shared_buckets);
    std::set<std::pair<uint64_t, int>> counted_unattributed;
    for (const Stored* record : live) {
      const bool shared = CountsForUnattributed(*record);
      // Ties go to the lowest index, the same in every run, so that GPUs with the same evidence
      // do not trade it back and forth between passes.
      int explained_by = -1;
      if (shared && record->kind == FailureKind::kUnattributed) {
        for (int gpu : record->gpus) {
          if (flagged_p[gpu] >= 0 &&
              (explained_by < 0 || flagged_p[gpu] < flagged_p[explained_by] ||
               (flagged_p[gpu] == flagged_p[explained_by] && gpu < explained_by))) {
            explained_by = gpu;
          }
        }
      }
      const double job_gpu_hours = record->size() * record->hours;
      const int bucket = SizeBucket(record->size());
      size_t offset = 0;
      for (const auto& [node, count] : record->nodes) {
        const size_t begin = offset;
        offset += count;
        for (size_t i = begin; i < offset; ++i) {
          const int gpu = record->gpus[i];
          if (record->start_nanos < gpu_since_[gpu] || (explained_by >= 0 && gpu != explained_by)) {
            continue;
          }
          ++tally.runs[gpu];
          tally.gpu_hours[gpu] += record->hours;
          if (shared) {
            tally.shared[static_cast<size_t>(gpu) * shared_buckets + bucket] += job_gpu_hours;
          }
          if (record->kind == FailureKind::kAttributed && Contains(record->blamed_gpus, gpu)) {
            ++tally.failures[gpu];
            ++tally.attributed[gpu];
            ++tally.singled_out[gpu];
          } else if (record->kind == FailureKind::kUnattributed && shared &&
                     counted_unattributed.emplace(record->job_hash, gpu).second) {
            ++tally.failures[gpu];
            tally.singled_out[gpu] += count == 1;
          }
        }
      }
    }
    return tally;
  };

  // Tests the devices of one tally: expected counts, exact p-values, q-values, flags.
  auto test = [&](const Tally& tally, double blamed_rate, const FleetRates& rates) {
    std::vector<double> bucket_rates(shared_buckets);
    for (int bucket = 0; bucket < shared_buckets; ++bucket) {
      bucket_rates[bucket] = UnattributedRate(rates, BucketRange(bucket).second);
    }
    std::vector<Tested> tested;
    for (size_t device = 0; device < tally.runs.size(); ++device) {
      if (tally.runs[device] == 0) {
        continue;
      }
      double expected = blamed_rate * tally.gpu_hours[device];
      for (int bucket = 0; bucket < shared_buckets; ++bucket) {
        expected += bucket_rates[bucket] * tally.shared[device * shared_buckets + bucket];
      }
      tested.push_back(Tested{static_cast<int>(device), expected,
                              PoissonUpperTail(tally.failures[device], expected)});
    }
    std::vector<double> p_values(tested.size());
    for (size_t i = 0; i < tested.size(); ++i) {
      p_values[i] = tested[i].p;
    }
    const std::vector<double> q_values = BenjaminiHochberg(p_values);
    for (size_t i = 0; i < tested.size(); ++i) {
      Tested& t = tested[i];
      t.q = q_values[i];
      const int failures = tally.failures[t.index];
      t.flagged = t.q <= options_.alpha && failures >= options_.min_failures &&
                  failures >= options_.min_rate_ratio * t.expected;
    }
    return tested;
  };

  std::vector<bool> excluded_gpus(gpu_count, false);
  std::vector<bool> excluded_nodes(node_count, false);
  std::vector<double> flagged_p(gpu_count, -1.0);  // p-value of each flagged GPU, else -1
  std::vector<Tested> tested_gpus;
  std::vector<Tested> tested_nodes;
  Tally gpus(gpu_count, shared_buckets);
  Tally nodes(node_count, shared_buckets);
  std::vector<uint64_t> node_spread(node_count);  // GPU slots in a node's unattributed failures
  for (int pass = 1; pass <= options_.max_passes; ++pass) {
    report.passes = pass;
    report.rates = EstimateRates(live, excluded_gpus, excluded_nodes);
    gpus = tally_gpus(flagged_p);
    tested_gpus = test(gpus, report.rates.gpu_rate, report.rates);
    std::vector<bool> flagged_gpus(gpu_count, false);
    std::fill(flagged_p.begin(), flagged_p.end(), -1.0);
    for (Tested& t : tested_gpus) {
      // Evidence that every GPU of a node shares (hangs of jobs that took the whole node) does
      // not say which GPU is bad: it needs at least one failure that singles this one out.
      if (gpus.singled_out[t.index] == 0 || !options_.flag_gpus) {
        t.flagged = false;
      }
      flagged_gpus[t.index] = t.flagged;
      if (t.flagged) {
        flagged_p[t.index] = t.p;
      }
    }
    // Nodes, without the runs that involved a flagged GPU of theirs: that GPU explains them.
    nodes = Tally(node_count, shared_buckets);
    std::fill(node_spread.begin(), node_spread.end(), 0);
    std::set<std::pair<uint64_t, int>> counted_nodes;
    for (const Stored* record : live) {
      const bool shared = CountsForUnattributed(*record);
      const double job_gpu_hours = record->size() * record->hours;
      const int bucket = SizeBucket(record->size());
      size_t offset = 0;
      for (const auto& [node, count] : record->nodes) {
        const size_t begin = offset;
        offset += count;
        if (record->start_nanos < node_since_[node] ||
            std::any_of(record->gpus.begin() + static_cast<std::ptrdiff_t>(begin),
                        record->gpus.begin() + static_cast<std::ptrdiff_t>(offset),
                        [&](int gpu) { return flagged_gpus[gpu]; })) {
          continue;
        }
        ++nodes.runs[node];
        nodes.gpu_hours[node] += count * record->hours;
        if (shared) {
          nodes.shared[static_cast<size_t>(node) * shared_buckets + bucket] += job_gpu_hours;
        }
        if (record->kind == FailureKind::kAttributed && Contains(record->blamed_nodes, node)) {
          ++nodes.failures[node];
          ++nodes.attributed[node];
        } else if (record->kind == FailureKind::kUnattributed && shared &&
                   counted_nodes.emplace(record->job_hash, node).second) {
          ++nodes.failures[node];
          // Only a run that held one GPU of the node says which GPU the failure fell on.
          if (count == 1) {
            node_spread[node] |= uint64_t{1} << std::min(gpu_slot_[record->gpus[begin]], 63);
          }
        }
      }
    }
    tested_nodes = test(nodes, report.rates.node_rate, report.rates);
    std::vector<bool> flagged_nodes(node_count, false);
    for (Tested& t : tested_nodes) {
      // Failures that never named the node and fell on one or two of its GPUs point at those
      // GPUs, not at the node.
      if (nodes.attributed[t.index] == 0 &&
          std::popcount(node_spread[t.index]) < options_.min_node_spread_gpus) {
        t.flagged = false;
      }
      flagged_nodes[t.index] = t.flagged;
    }
    if (flagged_gpus == excluded_gpus && flagged_nodes == excluded_nodes) {
      break;
    }
    excluded_gpus = std::move(flagged_gpus);
    excluded_nodes = std::move(flagged_nodes);
  }
  report.gpus_tested = static_cast<int>(tested_gpus.size());
  report.nodes_tested = static_cast<int>(tested_nodes.size());

  // Rank both kinds together and keep the flagged and the best of the rest.
  struct Ranked {
    DeviceKind kind;
    const Tested* tested;
    int failures;
  };
  std::vector<Ranked> ranked;
  ranked.reserve(tested_gpus.size() + tested_nodes.size());
  for (const Tested& t : tested_gpus) {
    ranked.push_back(Ranked{DeviceKind::kGpu, &t, gpus.failures[t.index]});
  }
  for (const Tested& t : tested_nodes) {
    ranked.push_back(Ranked{DeviceKind::kNode, &t, nodes.failures[t.index]});
  }
  auto before = [](const Ranked& a, const Ranked& b) {
    if (a.tested->flagged != b.tested->flagged) {
      return a.tested->flagged;
    }
    if (a.tested->q != b.tested->q) {
      return a.tested->q < b.tested->q;
    }
    if (a.tested->p != b.tested->p) {
      return a.tested->p < b.tested->p;
    }
    if (a.failures != b.failures) {
      return a.failures > b.failures;
    }
    return std::make_pair(a.kind, a.tested->index) < std::make_pair(b.kind, b.tested->index);
  };
  std::sort(ranked.begin(), ranked.end(), before);
  std::vector<DeviceEvidence> listed;
  int runners_up = 0;
  for (const Ranked& r : ranked) {
    if (!r.tested->flagged && runners_up++ >= options_.report_top) {
      break;
    }
    const Tally& tally = r.kind == DeviceKind::kGpu ? gpus : nodes;
    const int index = r.tested->index;
    DeviceEvidence evidence;
    if (r.kind == DeviceKind::kGpu) {
      evidence.device = Device::OfGpu(inventory_.gpu_uuid(index));
      evidence.leaf = inventory_.leaf_name(inventory_.leaf_of_node(inventory_.node_of_gpu(index)));
    } else {
      evidence.device = Device::OfNode(inventory_.node_id(index));
      evidence.leaf = inventory_.leaf_name(inventory_.leaf_of_node(index));
    }
    evidence.runs = tally.runs[index];
    evidence.failures = tally.failures[index];
    evidence.attributed_failures = tally.attributed[index];
    evidence.singling_failures = tally.singled_out[index];
    evidence.gpu_hours = tally.gpu_hours[index];
    evidence.expected = r.tested->expected;
    if (r.kind == DeviceKind::kNode) {
      evidence.gpus_involved = std::popcount(node_spread[index]);
    }
    evidence.p_value = r.tested->p;
    evidence.q_value = r.tested->q;
    evidence.flagged = r.tested->flagged;
    listed.push_back(std::move(evidence));
  }

  // XIDs and health checks of the listed devices, from the runs that count for them.
  std::unordered_map<int, size_t> listed_gpus;
  std::unordered_map<int, size_t> listed_nodes;
  for (size_t i = 0; i < listed.size(); ++i) {
    const int index = inventory_.IndexOf(listed[i].device);
    (listed[i].device.kind == DeviceKind::kGpu ? listed_gpus : listed_nodes)[index] = i;
  }
  for (const Stored* record : live) {
    for (const auto& [gpu, xid] : record->xids) {
      const int node = inventory_.node_of_gpu(gpu);
      if (auto it = listed_gpus.find(gpu);
          it != listed_gpus.end() && record->start_nanos >= gpu_since_[gpu]) {
        ++listed[it->second].xids[xid];
      }
      if (auto it = listed_nodes.find(node);
          it != listed_nodes.end() && record->start_nanos >= node_since_[node]) {
        ++listed[it->second].xids[xid];
      }
    }
    for (const HealthMark& mark : record->health) {
      if (auto it = listed_gpus.find(mark.gpu);
          mark.gpu >= 0 && it != listed_gpus.end() && record->start_nanos >= gpu_since_[mark.gpu]) {
        ++listed[it->second].health_checks[mark.check];
      }
      if (auto it = listed_nodes.find(mark.node);
          it != listed_nodes.end() && record->start_nanos >= node_since_[mark.node]) {
        ++listed[it->second].health_checks[mark.check];
      }
    }
  }
  for (DeviceEvidence& evidence : listed) {
    (evidence.flagged ? report.suspects : report.runners_up).push_back(std::move(evidence));
  }
  return report;
}

FailureConcentration AttributionEngine::Concentration(const std::vector<Device>& devices,
                                                      const FleetRates& rates) const {
  FailureConcentration out;
  std::vector<bool> chosen_gpus(inventory_.gpu_count(), false);
  std::vector<bool> chosen_nodes(inventory_.node_count(), false);
  std::vector<bool> covered(inventory_.gpu_count(), false);
  for (const Device& device : devices) {
    const int index = inventory_.IndexOf(device);
    if (index < 0) {
      continue;
    }
    ++out.devices;
    if (device.kind == DeviceKind::kGpu) {
      chosen_gpus[index] = true;
      covered[index] = true;
    } else {
      chosen_nodes[index] = true;
      for (int gpu : inventory_.gpus_of_node(index)) {
        covered[gpu] = true;
      }
    }
  }
  out.gpus = static_cast<int>(std::count(covered.begin(), covered.end(), true));
  out.fleet_share =
      inventory_.gpu_count() > 0 ? static_cast<double>(out.gpus) / inventory_.gpu_count() : 0.0;
  const int64_t window_start = WindowStart();
  for (const Stored& record : records_) {
    if (record.end_nanos < window_start) {
      continue;
    }
    int covered_gpus = 0;
    int on_chosen_nodes = 0;
    for (int gpu : record.gpus) {
      const bool on_chosen_node = chosen_nodes[inventory_.node_of_gpu(gpu)];
      covered_gpus += chosen_gpus[gpu] || on_chosen_node;
      on_chosen_nodes += on_chosen_node;
    }
    const bool failed =
        record.kind == FailureKind::kAttributed || record.kind == FailureKind::kUnattributed;
    out.failed_runs += failed;
    if (covered_gpus == 0) {
      continue;
    }
    const bool shared = CountsForUnattributed(record);
    bool involved = record.kind == FailureKind::kUnattributed && shared;
    if (record.kind == FailureKind::kAttributed) {
      for (int gpu : record.blamed_gpus) {
        involved = involved || chosen_gpus[gpu] || chosen_nodes[inventory_.node_of_gpu(gpu)];
      }
      for (int node : record.blamed_nodes) {
        involved = involved || chosen_nodes[node];
      }
    }
    out.failed_runs_involving += involved;
    out.expected_involving +=
        record.hours * (rates.gpu_rate * covered_gpus + rates.node_rate * on_chosen_nodes +
                        (shared ? UnattributedRate(rates, record.size()) * record.size() : 0.0));
  }
  out.failed_share =
      out.failed_runs > 0 ? static_cast<double>(out.failed_runs_involving) / out.failed_runs : 0;
  out.avoidable = std::max(0.0, out.failed_runs_involving - out.expected_involving);
  return out;
}

std::vector<DeviceFailures> AttributionEngine::FailuresByDevice(DeviceKind kind) const {
  const int count = kind == DeviceKind::kGpu ? inventory_.gpu_count() : inventory_.node_count();
  std::vector<int> failed(count, 0);
  const int64_t window_start = WindowStart();
  for (const Stored& record : records_) {
    if (record.end_nanos < window_start) {
      continue;
    }
    if (record.kind == FailureKind::kUnattributed) {
      if (!CountsForUnattributed(record)) {
        continue;
      }
      if (kind == DeviceKind::kGpu) {
        for (int gpu : record.gpus) {
          ++failed[gpu];
        }
      } else {
        for (const auto& node : record.nodes) {
          ++failed[node.first];
        }
      }
    } else if (record.kind == FailureKind::kAttributed) {
      if (kind == DeviceKind::kGpu) {
        for (int gpu : record.blamed_gpus) {
          ++failed[gpu];
        }
      } else {
        std::set<int> named(record.blamed_nodes.begin(), record.blamed_nodes.end());
        for (int gpu : record.blamed_gpus) {
          named.insert(inventory_.node_of_gpu(gpu));
        }
        for (int node : named) {
          ++failed[node];
        }
      }
    }
  }
  std::vector<int> order;
  for (int i = 0; i < count; ++i) {
    if (failed[i] > 0) {
      order.push_back(i);
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return failed[a] > failed[b]; });
  std::vector<DeviceFailures> out;
  out.reserve(order.size());
  for (int i : order) {
    out.push_back(DeviceFailures{kind == DeviceKind::kGpu ? Device::OfGpu(inventory_.gpu_uuid(i))
                                                          : Device::OfNode(inventory_.node_id(i)),
                                 failed[i]});
  }
  return out;
}

}  // namespace gpufleet::reliability
