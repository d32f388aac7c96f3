// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/bound.h"

#include <Cbc_C_Interface.h>
#include <Clp_C_Interface.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/scheduler/snapshot.h"
#include "gpufleet/sim/fill.h"
#include "gpufleet/sim/fill_report.h"

namespace gpufleet::sim {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// The largest CPU (and memory) cut: at most q pods each above 1/(q+1) of a node share it.
constexpr int kMaxSizeCut = 8;

bool Compatible(const PackingNodeType& type, const PackingPodShape& shape) {
  if (shape.cpu_milli > type.cpu_milli || shape.memory_mib > type.memory_mib ||
      shape.gpus > type.gpus) {
    return false;
  }
  return shape.allowed_models.empty() ||
         std::binary_search(shape.allowed_models.begin(), shape.allowed_models.end(), type.model);
}

// The maximal multisets of `sizes` (distinct, descending, each < 1000) whose sum fits one GPU:
// no size can be added to one. Each is a count per size.
Result<std::vector<std::vector<int>>> MaximalSharePatterns(const std::vector<int64_t>& sizes,
                                                           int limit) {
  std::vector<std::vector<int>> patterns;
  if (sizes.empty()) {
    return patterns;
  }
  const int64_t smallest = sizes.back();
  std::vector<int> counts(sizes.size(), 0);
  bool overflow = false;
  // Depth-first over sizes, largest first; a leaf is maximal when the smallest size no longer
  // fits in what is left.
  auto visit = [&](auto&& self, size_t i, int64_t left) -> void {
    if (overflow) {
      return;
    }
    if (i == sizes.size()) {
      if (left < smallest) {
        if (static_cast<int>(patterns.size()) >= limit) {
          overflow = true;
          return;
        }
        patterns.push_back(counts);
      }
      return;
    }
    for (int64_t k = left / sizes[i]; k >= 0; --k) {
      counts[i] = static_cast<int>(k);
      self(self, i + 1, left - k * sizes[i]);
    }
    counts[i] = 0;
  };
  visit(visit, 0, kMilliPerUnit);
  if (overflow) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("max_gpu_patterns: more than {} share patterns per GPU for share "
                              "sizes {}",
                              limit, fmt::join(sizes, ",")));
  }
  return patterns;
}

// A sparse linear program, min c'x, rows <= upper bound, columns in [0, upper]. Thread-compatible.
class Model {
 public:
  int AddRow(double upper) {
    row_upper_.push_back(upper);
    return static_cast<int>(row_upper_.size()) - 1;
  }
  int AddColumn(double objective, double upper, bool integer) {
    objective_.push_back(objective);
    column_upper_.push_back(upper);
    integer_.push_back(integer);
    entries_.emplace_back();
    return static_cast<int>(objective_.size()) - 1;
  }
  void Set(int row, int column, double value) { entries_[column].emplace_back(row, value); }

  int rows() const { return static_cast<int>(row_upper_.size()); }
  int columns() const { return static_cast<int>(objective_.size()); }

  struct Csc {
    std::vector<CoinBigIndex> start;
    std::vector<int> index;
    std::vector<double> value;
  };
  const std::vector<double>& objective() const { return objective_; }
  const std::vector<double>& column_upper() const { return column_upper_; }
  const std::vector<double>& row_upper() const { return row_upper_; }
  bool integer(int column) const { return integer_[column]; }

  Csc ToCsc() const {
    Csc csc;
    csc.start.push_back(0);
    for (const auto& column : entries_) {
      for (const auto& [row, value] : column) {
        csc.index.push_back(row);
        csc.value.push_back(value);
      }
      csc.start.push_back(static_cast<CoinBigIndex>(csc.index.size()));
    }
    return csc;
  }

 private:
  std::vector<double> objective_;
  std::vector<double> column_upper_;
  std::vector<bool> integer_;
  std::vector<double> row_upper_;
  std::vector<std::vector<std::pair<int, double>>> entries_;
};

struct ClpDeleter {
  void operator()(Clp_Simplex* model) const { Clp_deleteModel(model); }
};
struct CbcDeleter {
  void operator()(Cbc_Model* model) const { Cbc_deleteModel(model); }
};

// The LP optimum of `model` (min sense).
Result<double> SolveLp(const Model& model) {
  std::unique_ptr<Clp_Simplex, ClpDeleter> clp(Clp_newModel());
  const Model::Csc csc = model.ToCsc();
  const std::vector<double> lower(model.columns(), 0.0);
  const std::vector<double> row_lower(model.rows(), -kInfinity);
  Clp_loadProblem(clp.get(), model.columns(), model.rows(), csc.start.data(), csc.index.data(),
                  csc.value.data(), lower.data(), model.column_upper().data(),
                  model.objective().data(), row_lower.data(), model.row_upper().data());
  Clp_setLogLevel(clp.get(), 0);
  Clp_initialSolve(clp.get());
  if (Clp_isProvenOptimal(clp.get()) == 0) {
    return InternalError(
        fmt::format("clp: the LP relaxation ended with status {}", Clp_status(clp.get())));
  }
  return Clp_objectiveValue(clp.get());
}

struct MipOutcome {
  double dual_bound = 0;  // min sense: no integer solution is below it
  double primal = kInfinity;
  bool optimal = false;
  bool time_limited = false;
};

Result<MipOutcome> SolveMip(const Model& model, double seconds) {
  std::unique_ptr<Cbc_Model, CbcDeleter> cbc(Cbc_newModel());
  const Model::Csc csc = model.ToCsc();
  const std::vector<double> lower(model.columns(), 0.0);
  const std::vector<double> row_lower(model.rows(), -kInfinity);
  Cbc_loadProblem(cbc.get(), model.columns(), model.rows(), csc.start.data(), csc.index.data(),
                  csc.value.data(), lower.data(), model.column_upper().data(),
                  model.objective().data(), row_lower.data(), model.row_upper().data());
  for (int column = 0; column < model.columns(); ++column) {
    if (model.integer(column)) {
      Cbc_setInteger(cbc.get(), column);
    }
  }
  Cbc_setObjSense(cbc.get(), 1);  // minimise
  Cbc_setLogLevel(cbc.get(), 0);
  Cbc_setParameter(cbc.get(), "timeMode", "elapsed");
  Cbc_setMaximumSeconds(cbc.get(), seconds);
  Cbc_solve(cbc.get());
  if (Cbc_isAbandoned(cbc.get()) != 0 || Cbc_isProvenInfeasible(cbc.get()) != 0) {
    return InternalError(fmt::format("cbc: the branch and bound ended with status {}/{}",
                                     Cbc_status(cbc.get()), Cbc_secondaryStatus(cbc.get())));
  }
  MipOutcome outcome;
  outcome.dual_bound = Cbc_getBestPossibleObjValue(cbc.get());
  outcome.optimal = Cbc_isProvenOptimal(cbc.get()) != 0;
  outcome.time_limited = Cbc_isSecondsLimitReached(cbc.get()) != 0;
  if (Cbc_bestSolution(cbc.get()) != nullptr) {
    outcome.primal = Cbc_getObjValue(cbc.get());
  }
  if (outcome.optimal && std::isfinite(outcome.primal)) {
    // A finished search proves the incumbent optimal; CBC's best possible can lag behind it.
    outcome.dual_bound = std::max(outcome.dual_bound, outcome.primal);
  }
  return outcome;
}

using ShapeKey = std::tuple<int64_t, int64_t, int, int64_t, std::vector<std::string>>;
using TypeKey = std::tuple<int64_t, int64_t, int, std::string>;

}  // namespace

Result<PackingProblem> AggregatePacking(const Cluster& cluster, const std::vector<Job>& pods,
                                        const GpuCatalog& catalog) {
  PackingProblem problem;
  std::map<TypeKey, int> types;
  for (const Node& node : cluster.nodes) {
    std::string model;
    for (const Gpu& gpu : node.gpus) {
      const std::string canonical = catalog.Canonical(gpu.model);
      if (!model.empty() && canonical != model) {
        return InvalidArgumentError(
            fmt::format("node {}: GPUs of two models ({}, {}); the bound needs one per node",
                        node.id.value(), model, canonical));
      }
      model = canonical;
    }
    const TypeKey key{node.capacity.cpu_milli, node.capacity.memory_mib,
                      static_cast<int>(node.gpus.size()), model};
    if (auto [it, added] = types.emplace(key, static_cast<int>(problem.node_types.size())); added) {
      problem.node_types.push_back({node.capacity.cpu_milli, node.capacity.memory_mib,
                                    static_cast<int>(node.gpus.size()), model, 1});
    } else {
      ++problem.node_types[it->second].count;
    }
    problem.capacity_milli += kMilliPerUnit * static_cast<int64_t>(node.gpus.size());
  }
  std::map<ShapeKey, int> shapes;
  for (const Job& pod : pods) {
    if (pod.groups.size() != 1 || pod.groups[0].replicas != 1) {
      return InvalidArgumentError(fmt::format(
          "pod {}: {} groups of {} tasks; the bound packs single-task pods", pod.id.value(),
          pod.groups.size(), pod.groups.empty() ? 0 : pod.groups[0].replicas));
    }
    const TaskRequest& request = pod.groups[0].request;
    PackingPodShape shape;
    shape.cpu_milli = request.host.cpu_milli;
    shape.memory_mib = request.host.memory_mib;
    if (std::holds_alternative<NoGpu>(request.gpus)) {
      continue;  // places no GPU milli: leaving it out never lowers the maximum
    }
    if (const auto* whole = std::get_if<WholeGpus>(&request.gpus)) {
      if (whole->count < 1) {
        return InvalidArgumentError(
            fmt::format("pod {}: gpus {} (must be at least 1)", pod.id.value(), whole->count));
      }
      shape.gpus = whole->count;
      shape.gpu_milli = kMilliPerUnit;
    } else if (const auto* share = std::get_if<FractionalGpu>(&request.gpus)) {
      if (share->gpu_milli < 1 || share->gpu_milli > kMilliPerUnit) {
        return InvalidArgumentError(fmt::format("pod {}: gpu_milli {} (must be 1..1000)",
                                                pod.id.value(), share->gpu_milli));
      }
      shape.gpus = 1;
      shape.gpu_milli = share->gpu_milli;
    } else {
      return InvalidArgumentError(fmt::format(
          "pod {}: a MIG request; the bound models whole GPUs and shares only", pod.id.value()));
    }
    if (shape.cpu_milli < 0 || shape.memory_mib < 0) {
      return InvalidArgumentError(fmt::format("pod {}: negative cpu_milli {} or memory_mib {}",
                                              pod.id.value(), shape.cpu_milli, shape.memory_mib));
    }
    for (const std::string& name : pod.allowed_gpu_models) {
      const std::string canonical = catalog.Canonical(name);
      shape.allowed_models.push_back(canonical.empty() ? name : canonical);
    }
    std::sort(shape.allowed_models.begin(), shape.allowed_models.end());
    shape.allowed_models.erase(
        std::unique(shape.allowed_models.begin(), shape.allowed_models.end()),
        shape.allowed_models.end());
    problem.requested_milli += shape.GpuMilliEach();
    const ShapeKey key{shape.cpu_milli, shape.memory_mib, shape.gpus, shape.gpu_milli,
                       shape.allowed_models};
    if (auto [it, added] = shapes.emplace(key, static_cast<int>(problem.pod_shapes.size()));
        added) {
      shape.count = 1;
      problem.pod_shapes.push_back(std::move(shape));
    } else {
      ++problem.pod_shapes[it->second].count;
    }
  }
  return problem;
}

// The model (docs/policies.md has the argument). Per node type t with N nodes of G GPUs:
//   x[t,s]  pods of shape s on type-t nodes (integer, <= count of s)
//   y[t,p]  type-t GPUs filled by pattern p: a maximal multiset of the share sizes that fit
//           one GPU, or the whole-GPU pattern (integer)
// rows: sum_t x[t,s] <= count(s); sum_p y[t,p] <= N G; per share size m,
// sum_{s: m} x[t,s] <= sum_p a(p,m) y[t,p]; sum_{whole s} k(s) x[t,s] <= y[t,whole];
// sum_s cpu(s) x[t,s] <= N cpu(t), the same for memory; at most floor(G/k) pods of k or more
// whole GPUs per node; at most q pods above 1/(q+1) of a node's CPU (memory) per node.
Result<PackingBound> SolvePackingBound(const PackingProblem& problem,
                                       const PackingBoundOptions& options) {
  if (options.time_limit_seconds <= 0 || !std::isfinite(options.time_limit_seconds)) {
    return InvalidArgumentError(
        fmt::format("time_limit_seconds: {} (must be positive)", options.time_limit_seconds));
  }
  if (options.max_gpu_patterns < 1) {
    return InvalidArgumentError(
        fmt::format("max_gpu_patterns: {} (must be at least 1)", options.max_gpu_patterns));
  }
  Model model;
  PackingBound bound;
  std::vector<int> shape_rows;
  for (const PackingPodShape& shape : problem.pod_shapes) {
    shape_rows.push_back(model.AddRow(shape.count));
  }
  std::map<std::vector<int64_t>, std::vector<std::vector<int>>> pattern_cache;
  for (const PackingNodeType& type : problem.node_types) {
    if (type.gpus == 0) {
      continue;  // no GPU milli can be placed there
    }
    std::vector<size_t> fitting;
    std::vector<int64_t> share_sizes;
    bool any_whole = false;
    for (size_t s = 0; s < problem.pod_shapes.size(); ++s) {
      const PackingPodShape& shape = problem.pod_shapes[s];
      if (!Compatible(type, shape)) {
        continue;
      }
      fitting.push_back(s);
      if (shape.gpu_milli < kMilliPerUnit) {
        share_sizes.push_back(shape.gpu_milli);
      } else {
        any_whole = true;
      }
    }
    if (fitting.empty()) {
      continue;
    }
    std::sort(share_sizes.rbegin(), share_sizes.rend());
    share_sizes.erase(std::unique(share_sizes.begin(), share_sizes.end()), share_sizes.end());
    auto cached = pattern_cache.find(share_sizes);
    if (cached == pattern_cache.end()) {
      GPUFLEET_ASSIGN_OR_RETURN(std::vector<std::vector<int>> patterns,
                                MaximalSharePatterns(share_sizes, options.max_gpu_patterns));
      cached = pattern_cache.emplace(share_sizes, std::move(patterns)).first;
    }
    const std::vector<std::vector<int>>& patterns = cached->second;
    const double nodes = type.count;
    const double gpus = nodes * type.gpus;

    const int gpu_row = model.AddRow(gpus);
    std::vector<int> size_rows;
    for (size_t m = 0; m < share_sizes.size(); ++m) {
      size_rows.push_back(model.AddRow(0));
    }
    const int whole_row = any_whole ? model.AddRow(0) : -1;
    const int cpu_row = model.AddRow(nodes * static_cast<double>(type.cpu_milli));
    const int memory_row = model.AddRow(nodes * static_cast<double>(type.memory_mib));

    for (const std::vector<int>& pattern : patterns) {
      const int column = model.AddColumn(0, gpus, true);
      model.Set(gpu_row, column, 1);
      for (size_t m = 0; m < pattern.size(); ++m) {
        if (pattern[m] > 0) {
          model.Set(size_rows[m], column, -pattern[m]);
        }
      }
      ++bound.gpu_patterns;
    }
    if (any_whole) {
      const int column = model.AddColumn(0, gpus, true);
      model.Set(gpu_row, column, 1);
      model.Set(whole_row, column, -1);
      ++bound.gpu_patterns;
    }

    // Per-node cuts, summed over the type's nodes: each holds at most floor(G / k) pods of k or
    // more whole GPUs, and at most q pods that each need more than 1/(q+1) of its CPU (memory).
    std::map<int, int> whole_cut_rows;  // k -> row
    for (size_t s : fitting) {
      const PackingPodShape& shape = problem.pod_shapes[s];
      if (shape.gpu_milli == kMilliPerUnit && shape.gpus >= 2) {
        whole_cut_rows.emplace(shape.gpus, 0);
      }
    }
    for (auto& [k, row] : whole_cut_rows) {
      row = model.AddRow(nodes * (type.gpus / k));
    }
    auto size_cut_rows = [&](auto size_of, int64_t capacity) {
      std::vector<int> rows(kMaxSizeCut + 1, -1);
      size_t previous_members = 0;
      for (int q = 1; q <= kMaxSizeCut; ++q) {
        size_t members = 0;
        for (size_t s : fitting) {
          members += size_of(problem.pod_shapes[s]) * (q + 1) > capacity ? 1 : 0;
        }
        // A cut with the same members as the previous one is weaker than it.
        if (members > 0 && members != previous_members) {
          rows[q] = model.AddRow(nodes * q);
        }
        previous_members = members;
      }
      return rows;
    };
    const std::vector<int> cpu_cuts =
        size_cut_rows([](const PackingPodShape& shape) { return shape.cpu_milli; }, type.cpu_milli);
    const std::vector<int> memory_cuts = size_cut_rows(
        [](const PackingPodShape& shape) { return shape.memory_mib; }, type.memory_mib);

    for (size_t s : fitting) {
      const PackingPodShape& shape = problem.pod_shapes[s];
      const int column =
          model.AddColumn(-static_cast<double>(shape.GpuMilliEach()), shape.count, true);
      model.Set(shape_rows[s], column, 1);
      if (shape.gpu_milli < kMilliPerUnit) {
        const size_t m =
            static_cast<size_t>(std::find(share_sizes.begin(), share_sizes.end(), shape.gpu_milli) -
                                share_sizes.begin());
        model.Set(size_rows[m], column, 1);
      } else {
        model.Set(whole_row, column, shape.gpus);
        for (const auto& [k, row] : whole_cut_rows) {
          if (shape.gpus >= k) {
            model.Set(row, column, 1);
          }
        }
      }
      model.Set(cpu_row, column, static_cast<double>(shape.cpu_milli));
      model.Set(memory_row, column, static_cast<double>(shape.memory_mib));
      for (int q = 1; q <= kMaxSizeCut; ++q) {
        if (cpu_cuts[q] >= 0 && shape.cpu_milli * (q + 1) > type.cpu_milli) {
          model.Set(cpu_cuts[q], column, 1);
        }
        if (memory_cuts[q] >= 0 && shape.memory_mib * (q + 1) > type.memory_mib) {
          model.Set(memory_cuts[q], column, 1);
        }
      }
    }
  }
  bound.variables = model.columns();
  bound.constraints = model.rows();
  // The model's own limits: every pod's GPUs, every GPU of the cluster.
  const int64_t trivial = std::min(problem.requested_milli, problem.capacity_milli);
  if (model.columns() == 0) {
    bound.placed_milli_bound = 0;
    bound.proven_optimal = true;
    return bound;
  }
  GPUFLEET_ASSIGN_OR_RETURN(const double lp_minimum, SolveLp(model));
  bound.lp_bound = -lp_minimum;
  double best = bound.lp_bound;
  if (!options.lp_only) {
    GPUFLEET_ASSIGN_OR_RETURN(const MipOutcome mip, SolveMip(model, options.time_limit_seconds));
    bound.mip_dual_bound = -mip.dual_bound;
    bound.mip_primal = std::isfinite(mip.primal) ? -mip.primal : -1;
    bound.proven_optimal = mip.optimal;
    bound.time_limited = mip.time_limited;
    // Both bound the same maximum. A dual bound below a feasible point (placing nothing, or
    // CBC's incumbent) cannot be one: CBC reported no bound, and the LP's stands.
    const double feasible = std::max(0.0, bound.mip_primal);
    if (std::isfinite(bound.mip_dual_bound) && bound.mip_dual_bound >= feasible - 1e-6) {
      best = std::min(best, bound.mip_dual_bound);
    }
  }
  // Placed milli-units are integers: round up, trusting the solvers to 1e-6.
  const auto rounded = static_cast<int64_t>(std::ceil(best - 1e-6));
  bound.placed_milli_bound = std::clamp<int64_t>(rounded, 0, trivial);
  return bound;
}

Result<FillBound> RunFillBound(const Cluster& cluster, const std::vector<Job>& pods,
                               const GpuCatalog& catalog, uint64_t seed, double load_target,
                               const PackingBoundOptions& options) {
  GPUFLEET_ASSIGN_OR_RETURN(const scheduler::ClusterSnapshot snapshot,
                            scheduler::ClusterSnapshot::Build(cluster, catalog));
  const int64_t capacity = snapshot.TotalGpuMilli();
  if (capacity == 0) {
    return InvalidArgumentError("cluster: no GPUs to fill");
  }
  const std::vector<Job> order = FillArrivalOrder(pods, capacity, load_target, seed);
  const std::vector<size_t> events = FillEventsAt(order, capacity, 100);
  if (events.empty()) {
    return InvalidArgumentError(fmt::format(
        "load_target: {} (no arrival reaches the 100 % point; must be at least 1)", load_target));
  }
  if (options.checkpoints < 1) {
    return InvalidArgumentError(
        fmt::format("checkpoints: {} (must be at least 1)", options.checkpoints));
  }
  FillBound result;
  result.seed = seed;
  result.total_gpus = snapshot.TotalGpus();
  result.pods_packed = static_cast<int>(events.back() + 1);
  result.events = static_cast<int>(events.size());
  // Checkpoint j ends at event ceil(j |E| / K) - 1 of the point, the last at its last event.
  const size_t count = std::min(events.size(), static_cast<size_t>(options.checkpoints));
  std::vector<size_t> ends;
  for (size_t j = 1; j <= count; ++j) {
    ends.push_back(events[(j * events.size() + count - 1) / count - 1]);
  }
  std::vector<int64_t> placed;  // bound per checkpoint
  for (const size_t end_index : ends) {
    const std::vector<Job> prefix(order.begin(),
                                  order.begin() + static_cast<std::ptrdiff_t>(end_index + 1));
    GPUFLEET_ASSIGN_OR_RETURN(const PackingProblem problem,
                              AggregatePacking(cluster, prefix, catalog));
    if (problem.capacity_milli != capacity) {
      return InternalError(fmt::format("bound: capacity {} but the snapshot has {}",
                                       problem.capacity_milli, capacity));
    }
    GPUFLEET_ASSIGN_OR_RETURN(result.solve, SolvePackingBound(problem, options));
    placed.push_back(result.solve.placed_milli_bound);
    result.time_limited = result.time_limited || result.solve.time_limited;
  }
  result.checkpoints = static_cast<int>(ends.size());
  double sum = 0;
  size_t next = 0;
  for (const size_t event : events) {
    while (ends[next] < event) {
      ++next;
    }
    sum += static_cast<double>(placed[next]);
  }
  const double mean = sum / static_cast<double>(events.size());
  // As FillResult::UnallocatedGpusAt computes it from the mean allocation.
  const auto unallocated = [&](double milli) {
    return result.total_gpus * (1.0 - milli / static_cast<double>(capacity));
  };
  result.unallocated_gpus_bound = unallocated(mean);
  result.unallocated_gpus_bound_last = unallocated(static_cast<double>(placed.back()));
  return result;
}

void WriteBoundJson(const std::vector<FillBound>& bounds, std::ostream& out) {
  using Json = nlohmann::ordered_json;
  Json runs = Json::array();
  std::vector<double> values;
  bool any_time_limited = false;
  for (const FillBound& bound : bounds) {
    Json run = Json::object();
    run["seed"] = bound.seed;
    run["total_gpus"] = bound.total_gpus;
    run["pods_packed"] = bound.pods_packed;
    run["events"] = bound.events;
    run["checkpoints"] = bound.checkpoints;
    run["unallocated_gpus_bound"] = bound.unallocated_gpus_bound;
    run["unallocated_gpus_bound_last_prefix"] = bound.unallocated_gpus_bound_last;
    run["lp_bound_milli"] = bound.solve.lp_bound;
    run["mip_dual_bound_milli"] =
        bound.solve.mip_dual_bound < 0 ? Json() : Json(bound.solve.mip_dual_bound);
    run["proven_optimal"] = bound.solve.proven_optimal;
    run["time_limited"] = bound.time_limited;
    run["variables"] = bound.solve.variables;
    run["constraints"] = bound.solve.constraints;
    runs.push_back(std::move(run));
    values.push_back(bound.unallocated_gpus_bound);
    any_time_limited = any_time_limited || bound.time_limited;
  }
  Json json = Json::object();
  json["mode"] = "bound";
  json["runs"] = std::move(runs);
  json["median_unallocated_gpus_bound"] = values.empty() ? Json() : Json(Median(values));
  json["any_time_limited"] = any_time_limited;
  out << json.dump() << "\n";
}

}  // namespace gpufleet::sim
