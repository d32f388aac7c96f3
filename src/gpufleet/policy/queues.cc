// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/queues.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <utility>

#include <fmt/format.h>

namespace gpufleet::policy {
namespace {

constexpr double kMilliPerGpu = 1000.0;

bool IsAny(const std::string& model) {
  return model == kAnyGpuModel;
}

int64_t AmountOf(const GpuMilliByModel& amounts, const std::string& model) {
  const auto found = amounts.find(model);
  return found == amounts.end() ? 0 : found->second;
}

GpuMilliByModel Plus(GpuMilliByModel base, const GpuMilliByModel& extra) {
  for (const auto& [model, milli] : extra) {
    base[model] += milli;
  }
  return base;
}

// "" when `path` is well formed, else what is wrong with it.
std::string PathProblem(const std::string& path) {
  if (path.empty()) {
    return "is empty";
  }
  if (path.front() == '/' || path.back() == '/' || path.find("//") != std::string::npos) {
    return "has an empty segment";
  }
  for (const char c : path) {
    if (std::isspace(static_cast<unsigned char>(c)) != 0 ||
        std::iscntrl(static_cast<unsigned char>(c)) != 0) {
      return "contains a space or control character";
    }
  }
  return "";
}

std::string ParentPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// An amount as the user wrote it: in GPUs ("16 GPUs", "0.5 GPUs", "1 GPU").
std::string QuotaGpus(int64_t milli) {
  const std::string number = milli % 1000 == 0
                                 ? fmt::format("{}", milli / 1000)
                                 : fmt::format("{:g}", static_cast<double>(milli) / kMilliPerGpu);
  return fmt::format("{} GPU{}", number, milli == 1000 ? "" : "s");
}

Status CheckAmounts(const std::string& where, const GpuMilliByModel& amounts) {
  for (const auto& [model, milli] : amounts) {
    if (model.empty()) {
      return InvalidArgumentError(fmt::format("{}: empty GPU model name", where));
    }
    if (milli < 0) {
      return InvalidArgumentError(
          fmt::format("{}[\"{}\"]: {} is negative", where, model, QuotaGpus(milli)));
    }
  }
  return Status::Ok();
}

// A limit below the guarantee could never let the queue use what it is promised.
Status CheckLimitCoversGuarantee(const std::string& where, const QueueSpec& spec) {
  for (const auto& [model, limit] : spec.limit) {
    const int64_t guaranteed =
        IsAny(model) ? TotalMilli(spec.guarantee) : AmountOf(spec.guarantee, model);
    if (limit < guaranteed) {
      return InvalidArgumentError(fmt::format("{}.limit[\"{}\"]: {} is below the guarantee of {}",
                                              where, model, QuotaGpus(limit),
                                              QuotaGpus(guaranteed)));
    }
  }
  return Status::Ok();
}

// The children's guarantees must fit in their parent's: per model (the parent's any-model pool
// may cover a child's model) and in total.
Status CheckChildrenFit(const QueueSpec& parent, const std::vector<const QueueSpec*>& children) {
  // An implicit parent was never created: say so, and what creating it takes.
  const auto implicit = [&](const std::string& guarantee) {
    if (!parent.implicit) {
      return std::string();
    }
    std::vector<std::string> names;
    for (const QueueSpec* child : children) {
      names.push_back(fmt::format("\"{}\"", child->path));
    }
    return fmt::format(
        "; \"{}\" was created implicitly as the parent of {}, with no guarantee: create it first "
        "with one that covers its children (gpufleet create queue {} --guarantee {})",
        parent.path, fmt::join(names, ", "), parent.path, guarantee);
  };
  GpuMilliByModel sum;
  for (const QueueSpec* child : children) {
    sum = Plus(std::move(sum), child->guarantee);
  }
  const int64_t parent_any = AmountOf(parent.guarantee, std::string(kAnyGpuModel));
  for (const auto& [model, milli] : sum) {
    if (IsAny(model)) {
      continue;
    }
    const int64_t room = AmountOf(parent.guarantee, model) + parent_any;
    if (milli > room) {
      return InvalidArgumentError(fmt::format(
          "queue \"{}\": its children's guarantees of {} ({}) exceed its own ({}){}", parent.path,
          model, QuotaGpus(milli), QuotaGpus(room),
          implicit(fmt::format("{}={}", model,
                               QuotaGpus(milli).substr(0, QuotaGpus(milli).find(' '))))));
    }
  }
  if (TotalMilli(sum) > TotalMilli(parent.guarantee)) {
    const std::string total = QuotaGpus(TotalMilli(sum));
    return InvalidArgumentError(
        fmt::format("queue \"{}\": its children's guarantees ({} in all) exceed its own ({}){}",
                    parent.path, total, QuotaGpus(TotalMilli(parent.guarantee)),
                    implicit(fmt::format("'*={}'", total.substr(0, total.find(' '))))));
  }
  return Status::Ok();
}

}  // namespace

int64_t TotalMilli(const GpuMilliByModel& amounts) {
  int64_t total = 0;
  for (const auto& [model, milli] : amounts) {
    total += milli;
  }
  return total;
}

int64_t OverGuarantee(const GpuMilliByModel& allocation, const GpuMilliByModel& guarantee) {
  int64_t excess = 0;
  for (const auto& [model, milli] : allocation) {
    if (!IsAny(model)) {
      excess += std::max<int64_t>(0, milli - AmountOf(guarantee, model));
    }
  }
  return std::max<int64_t>(0, excess - AmountOf(guarantee, std::string(kAnyGpuModel)));
}

const char* AdmissionOutcomeName(AdmissionOutcome outcome) {
  switch (outcome) {
    case AdmissionOutcome::kWithinGuarantee:
      return "within guarantee";
    case AdmissionOutcome::kBorrowing:
      return "borrowing";
    case AdmissionOutcome::kOverLimit:
      return "over limit";
    case AdmissionOutcome::kBorrowingNotAllowed:
      return "borrowing not allowed";
    case AdmissionOutcome::kNoIdleQuota:
      return "no idle quota";
  }
  return "unknown";
}

Result<QueueTree> QueueTree::Create(std::vector<QueueSpec> specs, QueueTreeOptions options) {
  if (options.usage_half_life_seconds <= 0) {
    return InvalidArgumentError(
        fmt::format("usage_half_life_seconds: {} (must be > 0)", options.usage_half_life_seconds));
  }
  std::map<std::string, size_t> by_path;
  for (size_t i = 0; i < specs.size(); ++i) {
    const QueueSpec& spec = specs[i];
    const std::string where = fmt::format("queues[{}] (\"{}\")", i, spec.path);
    if (const std::string problem = PathProblem(spec.path); !problem.empty()) {
      return InvalidArgumentError(fmt::format("{}.path: {}", where, problem));
    }
    if (!by_path.emplace(spec.path, i).second) {
      return InvalidArgumentError(fmt::format("{}.path: defined twice", where));
    }
    if (!(std::isfinite(spec.weight) && spec.weight > 0)) {
      return InvalidArgumentError(fmt::format("{}.weight: {} (must be > 0)", where, spec.weight));
    }
    GPUFLEET_RETURN_IF_ERROR(CheckAmounts(where + ".guarantee", spec.guarantee));
    GPUFLEET_RETURN_IF_ERROR(CheckAmounts(where + ".limit", spec.limit));
    GPUFLEET_RETURN_IF_ERROR(CheckLimitCoversGuarantee(where, spec));
  }
  std::map<std::string, std::vector<const QueueSpec*>> children;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string parent = ParentPath(specs[i].path);
    if (parent.empty()) {
      continue;
    }
    if (by_path.count(parent) == 0) {
      return InvalidArgumentError(fmt::format("queues[{}] (\"{}\"): parent \"{}\" is not defined",
                                              i, specs[i].path, parent));
    }
    children[parent].push_back(&specs[i]);
  }
  for (const auto& [parent, kids] : children) {
    GPUFLEET_RETURN_IF_ERROR(CheckChildrenFit(specs[by_path.at(parent)], kids));
  }

  QueueTree tree;
  tree.options_ = options;
  // by_path iterates in path order: a parent (a prefix) comes before its children.
  for (const auto& [path, spec_index] : by_path) {
    Node node;
    node.spec = std::move(specs[spec_index]);
    const std::string parent = ParentPath(path);
    if (!parent.empty()) {
      node.parent = tree.index_.at(parent);
      node.depth = tree.nodes_[node.parent].depth + 1;
      tree.nodes_[node.parent].children.push_back(static_cast<int>(tree.nodes_.size()));
    }
    tree.index_.emplace(path, static_cast<int>(tree.nodes_.size()));
    tree.nodes_.push_back(std::move(node));
  }
  return tree;
}

void QueueTree::SetCapacity(GpuMilliByModel capacity) {
  capacity_ = std::move(capacity);
}

Result<int> QueueTree::IndexOf(const QueueId& queue) const {
  const auto found = index_.find(queue.value());
  if (found == index_.end()) {
    return NotFoundError(fmt::format("queue \"{}\": not defined", queue.value()));
  }
  return found->second;
}

std::vector<int> QueueTree::PathOf(int queue) const {
  std::vector<int> path;
  for (int at = queue; at >= 0; at = nodes_[at].parent) {
    path.push_back(at);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

Status QueueTree::Charge(const JobId& job, const QueueId& queue,
                         const GpuMilliByModel& allocation) {
  GPUFLEET_ASSIGN_OR_RETURN(const int index, IndexOf(queue));
  GPUFLEET_RETURN_IF_ERROR(
      CheckAmounts(fmt::format("job \"{}\" allocation", job.value()), allocation));
  if (charged_.count(job) > 0) {
    return AlreadyExistsError(fmt::format("job \"{}\": already charged to queue \"{}\"",
                                          job.value(), nodes_[charged_.at(job).queue].spec.path));
  }
  GpuMilliByModel held;
  for (const auto& [model, milli] : allocation) {
    if (milli > 0) {
      held.emplace(model, milli);
    }
  }
  for (int at = index; at >= 0; at = nodes_[at].parent) {
    nodes_[at].allocated = Plus(std::move(nodes_[at].allocated), held);
  }
  charged_.emplace(job, Charged{index, std::move(held)});
  return Status::Ok();
}

Status QueueTree::Release(const JobId& job) {
  const auto found = charged_.find(job);
  if (found == charged_.end()) {
    return NotFoundError(fmt::format("job \"{}\": holds nothing in any queue", job.value()));
  }
  for (int at = found->second.queue; at >= 0; at = nodes_[at].parent) {
    GpuMilliByModel& allocated = nodes_[at].allocated;
    for (const auto& [model, milli] : found->second.allocation) {
      auto entry = allocated.find(model);
      entry->second -= milli;
      if (entry->second == 0) {
        allocated.erase(entry);
      }
    }
  }
  charged_.erase(found);
  return Status::Ok();
}

Status QueueTree::Advance(int64_t now_seconds) {
  if (now_seconds < last_advance_seconds_) {
    return InvalidArgumentError(fmt::format("now_seconds: {} is before the last advance at {}",
                                            now_seconds, last_advance_seconds_));
  }
  const double elapsed = static_cast<double>(now_seconds - last_advance_seconds_);
  last_advance_seconds_ = now_seconds;
  if (elapsed == 0) {
    return Status::Ok();
  }
  // Usage u(t) with du/dt = a - u ln2 / h over the interval: the old usage decays by
  // 2^(-t/h), and a constant allocation a adds a (h / ln2)(1 - 2^(-t/h)) GPU-seconds.
  const double half_life = static_cast<double>(options_.usage_half_life_seconds);
  const double decay = std::exp2(-elapsed / half_life);
  const double accrual = half_life / std::numbers::ln2 * (1 - decay);
  for (Node& node : nodes_) {
    for (auto& [model, usage] : node.usage) {
      usage *= decay;
    }
    for (const auto& [model, milli] : node.allocated) {
      node.usage[model] += static_cast<double>(milli) / kMilliPerGpu * accrual;
    }
  }
  return Status::Ok();
}

Status QueueTree::AddUsage(const QueueId& queue, const std::map<std::string, double>& gpu_seconds) {
  GPUFLEET_ASSIGN_OR_RETURN(const int index, IndexOf(queue));
  for (const auto& [model, amount] : gpu_seconds) {
    if (!std::isfinite(amount) || amount < 0) {
      return InvalidArgumentError(fmt::format("usage of {}.{}: {} (must be finite and >= 0)",
                                              queue.value(), model, amount));
    }
  }
  for (const auto& [model, amount] : gpu_seconds) {
    nodes_[index].usage[model] += amount;
  }
  return Status::Ok();
}

Result<Admission> QueueTree::CheckAdmission(const QueueId& queue,
                                            const GpuMilliByModel& request) const {
  GPUFLEET_ASSIGN_OR_RETURN(const int index, IndexOf(queue));
  GPUFLEET_RETURN_IF_ERROR(CheckAmounts("request", request));
  Admission admission;
  // Bottom up: `uncovered` is the part of the request no guarantee below this level covers.
  int64_t uncovered = std::numeric_limits<int64_t>::max();
  for (int at = index; at >= 0; at = nodes_[at].parent) {
    const Node& node = nodes_[at];
    const GpuMilliByModel after = Plus(node.allocated, request);
    for (const auto& [model, limit] : node.spec.limit) {
      const int64_t asked = IsAny(model) ? TotalMilli(request) : AmountOf(request, model);
      const int64_t held =
          IsAny(model) ? TotalMilli(node.allocated) : AmountOf(node.allocated, model);
      if (asked > 0 && held + asked > limit) {
        admission.outcome = AdmissionOutcome::kOverLimit;
        admission.reason =
            fmt::format("queue \"{}\" limit[\"{}\"]: {} milli-GPU held + {} asked > {}",
                        node.spec.path, model, held, asked, limit);
        return admission;
      }
    }
    const int64_t grows = OverGuarantee(after, node.spec.guarantee) -
                          OverGuarantee(node.allocated, node.spec.guarantee);
    uncovered = std::min(uncovered, grows);
    if (at == index) {
      admission.borrowed_milli = uncovered;
    }
    if (uncovered > 0 && !node.spec.may_borrow) {
      admission.outcome = AdmissionOutcome::kBorrowingNotAllowed;
      admission.reason = fmt::format(
          "queue \"{}\" may not borrow: {} milli-GPU of the request exceed its guarantee",
          node.spec.path, uncovered);
      return admission;
    }
  }
  if (admission.borrowed_milli > 0) {
    admission.outcome = AdmissionOutcome::kBorrowing;
  }
  if (uncovered > 0) {
    // Borrowed quota must be idle: the top-level queues together hold less than the cluster.
    for (const auto& [model, milli] : request) {
      const auto capacity = capacity_.find(model);
      if (capacity == capacity_.end()) {
        continue;
      }
      int64_t held = 0;
      for (const Node& node : nodes_) {
        held += node.parent < 0 ? AmountOf(node.allocated, model) : 0;
      }
      if (held + milli > capacity->second) {
        admission.outcome = AdmissionOutcome::kNoIdleQuota;
        admission.reason =
            fmt::format("no idle quota of {}: {} milli-GPU held + {} asked > capacity {}", model,
                        held, milli, capacity->second);
        return admission;
      }
    }
  }
  return admission;
}

double QueueTree::FairShareKey(int queue) const {
  const Node& node = nodes_[queue];
  double dominant = 0;
  for (const auto& [model, usage] : node.usage) {
    const auto capacity = capacity_.find(model);
    const double gpus = capacity != capacity_.end() && capacity->second > 0
                            ? static_cast<double>(capacity->second) / kMilliPerGpu
                            : 1.0;
    dominant = std::max(dominant, usage / gpus);
  }
  return dominant / node.spec.weight;
}

Status QueueTree::Order(std::vector<PendingJob>& jobs) const {
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<size_t> order, OrderedPositions(jobs));
  std::vector<PendingJob> ordered;
  ordered.reserve(jobs.size());
  for (const size_t position : order) {
    ordered.push_back(std::move(jobs[position]));
  }
  jobs = std::move(ordered);
  return Status::Ok();
}

Result<std::vector<size_t>> QueueTree::OrderedPositions(const std::vector<PendingJob>& jobs) const {
  // Each job's queue path; jobs come in runs of one queue, whose path is found once.
  std::vector<std::vector<int>> paths(nodes_.size());  // by queue, filled as needed
  std::vector<const std::vector<int>*> path_of(jobs.size());
  const QueueId* run_queue = nullptr;
  const std::vector<int>* run_path = nullptr;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (run_queue == nullptr || jobs[i].queue != *run_queue) {
      GPUFLEET_ASSIGN_OR_RETURN(const int index, IndexOf(jobs[i].queue));
      if (paths[index].empty()) {
        paths[index] = PathOf(index);
      }
      run_queue = &jobs[i].queue;
      run_path = &paths[index];
    }
    path_of[i] = run_path;
  }
  std::vector<double> key(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    key[i] = FairShareKey(static_cast<int>(i));
  }
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PendingJob& job_a = jobs[a];
    const PendingJob& job_b = jobs[b];
    if (job_a.priority != job_b.priority) {
      return job_a.priority > job_b.priority;
    }
    // The first level where the paths part holds two siblings; a path that is a prefix of the
    // other (a job of a parent queue) ties at the fair-share stage.
    const std::vector<int>& path_a = *path_of[a];
    const std::vector<int>& path_b = *path_of[b];
    const size_t common = std::min(path_a.size(), path_b.size());
    for (size_t level = 0; level < common; ++level) {
      if (path_a[level] != path_b[level]) {
        if (key[path_a[level]] != key[path_b[level]]) {
          return key[path_a[level]] < key[path_b[level]];
        }
        break;
      }
    }
    if (job_a.expedited != job_b.expedited) {
      return job_a.expedited;
    }
    if (job_a.submit_seconds != job_b.submit_seconds) {
      return job_a.submit_seconds < job_b.submit_seconds;
    }
    return job_a.id < job_b.id;
  });
  return order;
}

Result<int64_t> QueueTree::Borrowed(const QueueId& queue) const {
  GPUFLEET_ASSIGN_OR_RETURN(const int index, IndexOf(queue));
  return OverGuarantee(nodes_[index].allocated, nodes_[index].spec.guarantee);
}

Result<std::vector<QueueExcess>> QueueTree::ReclaimCandidates(const QueueId& starving) const {
  GPUFLEET_ASSIGN_OR_RETURN(const int index, IndexOf(starving));
  const Node& node = nodes_[index];
  const int64_t covered =
      TotalMilli(node.allocated) - OverGuarantee(node.allocated, node.spec.guarantee);
  if (covered >= TotalMilli(node.spec.guarantee)) {
    return FailedPreconditionError(
        fmt::format("queue \"{}\" holds its whole guarantee ({} of {} milli-GPU): it cannot "
                    "reclaim",
                    node.spec.path, covered, TotalMilli(node.spec.guarantee)));
  }
  std::vector<QueueExcess> candidates;
  int distance = 0;
  for (int at = index; at >= 0; at = nodes_[at].parent, ++distance) {
    const int parent = nodes_[at].parent;
    std::vector<int> siblings;
    if (parent >= 0) {
      siblings = nodes_[parent].children;
    } else {
      for (size_t i = 0; i < nodes_.size(); ++i) {
        if (nodes_[i].parent < 0) {
          siblings.push_back(static_cast<int>(i));
        }
      }
    }
    for (const int sibling : siblings) {
      const Node& other = nodes_[sibling];
      const int64_t over = OverGuarantee(other.allocated, other.spec.guarantee);
      if (sibling != at && over > 0) {
        candidates.push_back({QueueId(other.spec.path), over, distance});
      }
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const QueueExcess& a, const QueueExcess& b) {
                     if (a.distance != b.distance) {
                       return a.distance < b.distance;
                     }
                     if (a.over_milli != b.over_milli) {
                       return a.over_milli > b.over_milli;
                     }
                     return a.queue < b.queue;
                   });
  return candidates;
}

Result<QueueStatus> QueueTree::StatusOf(const QueueId& queue) const {
  GPUFLEET_ASSIGN_OR_RETURN(const int index, IndexOf(queue));
  const Node& node = nodes_[index];
  QueueStatus status;
  status.queue = queue;
  status.guarantee = node.spec.guarantee;
  status.limit = node.spec.limit;
  status.allocated = node.allocated;
  status.borrowed_milli = OverGuarantee(node.allocated, node.spec.guarantee);
  status.usage_gpu_seconds = node.usage;
  std::vector<int> siblings;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].parent == node.parent) {
      siblings.push_back(static_cast<int>(i));
    }
  }
  double weights = 0;
  double keys = 0;  // sum of dominant usages
  for (const int sibling : siblings) {
    weights += nodes_[sibling].spec.weight;
    keys += FairShareKey(sibling) * nodes_[sibling].spec.weight;
  }
  status.weight_share = node.spec.weight / weights;
  const double usage_share = keys > 0 ? FairShareKey(index) * node.spec.weight / keys : 0;
  status.fair_share_ratio = usage_share / status.weight_share;
  return status;
}

std::vector<QueueId> QueueTree::Queues() const {
  std::vector<QueueId> queues;
  queues.reserve(nodes_.size());
  for (const Node& node : nodes_) {
    queues.emplace_back(node.spec.path);
  }
  return queues;
}

Result<QueueId> QueueTree::QueueOfJob(const JobId& job) const {
  const auto found = charged_.find(job);
  if (found == charged_.end()) {
    return NotFoundError(fmt::format("job \"{}\": holds nothing in any queue", job.value()));
  }
  return QueueId(nodes_[found->second.queue].spec.path);
}

}  // namespace gpufleet::policy
