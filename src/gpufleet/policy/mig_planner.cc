// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/mig_planner.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gpufleet::policy {
namespace {

// A validated request.
struct Demand {
  int index = 0;    // into the input requests
  int profile = 0;  // profile id (Planner::profile_ids_)
  int count = 1;
  int64_t slices = 0;               // count x compute slices
  std::vector<std::string> models;  // canonical names; empty: any model with the profile

  bool Allows(const std::string& model) const {
    return models.empty() || std::find(models.begin(), models.end(), model) != models.end();
  }
};

// One way to lay out one GPU: what it then offers per requested profile, and the change.
struct Layout {
  std::vector<int> supply;  // per profile id, capped at what the requests could use
  std::vector<MigInstance> destroy;
  std::vector<MigInstance> create;

  bool changed() const { return !destroy.empty() || !create.empty(); }
};

// A GPU that some layout lets serve a request.
struct GpuCandidate {
  int input = 0;  // index into the input GPUs
  const GpuModelInfo* model = nullptr;
  std::string signature;        // equal for GPUs that are interchangeable in the search
  std::vector<Layout> layouts;  // [0] leaves the GPU as it is
  // The demands it may serve, per profile id, in serving order: fewest instances first, then
  // fewest allowed models (the most constrained), then input order.
  std::vector<std::vector<int>> demands_by_profile;
  int max_count = 0;  // most demands one of its layouts serves, for the bound
  int64_t max_slices = 0;
};

// (requests served, compute slices served, -GPUs reconfigured): larger is better.
using Score = std::tuple<int, int64_t, int>;

std::string InstancesKey(const std::vector<MigInstance>& instances) {
  std::string key;
  for (const MigInstance& instance : instances) {
    key += fmt::format("{}@{}{};", instance.profile, instance.start, instance.in_use ? "u" : "f");
  }
  return key;
}

bool Covers(const std::vector<int>& a, const std::vector<int>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] < b[i]) {
      return false;
    }
  }
  return true;
}

// Every layout of one GPU that keeps its instances in use, keeps some of its free ones and adds
// instances of the requested profiles, reduced to the change with the fewest destroyed, then
// created, instances per supply vector. A layout is a set of choices, each a free instance (kept
// when chosen, destroyed when not) or a new instance at an allowed start; sets are enumerated in
// choice order, so each is seen once.
class LayoutEnumerator {
 public:
  LayoutEnumerator(const GpuModelInfo& model, std::vector<std::pair<int, const MigProfile*>> wanted,
                   std::vector<int> cap)
      : model_(model), wanted_(std::move(wanted)), cap_(std::move(cap)) {}

  std::vector<Layout> Enumerate(const std::vector<MigInstance>& instances) {
    std::vector<MigInstance> in_use;
    for (const MigInstance& instance : instances) {
      if (instance.in_use) {
        in_use.push_back(instance);
        continue;
      }
      const MigProfile* profile = model_.FindMigProfile(instance.profile);
      choices_.push_back({instance, profile, WantedId(profile), true});
      ++free_count_;
    }
    for (const auto& [id, profile] : wanted_) {
      for (int start : profile->starts) {
        const MigInstance instance{profile->name, start, false};
        if (std::find(instances.begin(), instances.end(), instance) == instances.end()) {
          choices_.push_back({instance, profile, id, false});
        }
      }
    }
    std::stable_sort(choices_.begin(), choices_.end(), [](const Choice& a, const Choice& b) {
      return a.instance.start < b.instance.start;
    });
    chosen_.assign(choices_.size(), 0);
    // A subset of a valid layout is valid.
    MigLayout layout = MigLayout::FromInstances(model_, in_use).value();
    std::vector<int> supply(cap_.size(), 0);
    Extend(layout, 0, supply);
    return Reduce();
  }

 private:
  struct Choice {
    MigInstance instance;
    const MigProfile* profile = nullptr;
    int id = -1;  // profile id when requested, else -1
    bool existing = false;
  };

  int WantedId(const MigProfile* profile) const {
    for (const auto& [id, wanted] : wanted_) {
      if (wanted == profile) {
        return id;
      }
    }
    return -1;
  }

  void Extend(MigLayout& layout, size_t from, std::vector<int>& supply) {
    Record(supply);
    for (size_t i = from; i < choices_.size(); ++i) {
      const Choice& choice = choices_[i];
      // New instances beyond what the requests could use are pointless; kept ones cost nothing.
      if (!choice.existing && supply[choice.id] >= cap_[choice.id]) {
        continue;
      }
      if (!layout.CanAddAt(*choice.profile, choice.instance.start)) {
        continue;
      }
      layout.Add(*choice.profile, choice.instance.start);
      chosen_[i] = 1;
      (choice.existing ? kept_ : created_) += 1;
      if (choice.id >= 0) {
        ++supply[choice.id];
      }
      Extend(layout, i + 1, supply);
      if (choice.id >= 0) {
        --supply[choice.id];
      }
      (choice.existing ? kept_ : created_) -= 1;
      chosen_[i] = 0;
      layout.Remove(*choice.profile, choice.instance.start);
    }
  }

  void Record(const std::vector<int>& supply) {
    std::vector<int> capped = supply;
    for (size_t id = 0; id < capped.size(); ++id) {
      capped[id] = std::min(capped[id], cap_[id]);
    }
    const size_t destroyed = static_cast<size_t>(free_count_ - kept_);
    const size_t created = static_cast<size_t>(created_);
    auto [it, inserted] = best_.try_emplace(capped);
    Layout& layout = it->second;
    if (!inserted &&
        std::pair(destroyed, created) >= std::pair(layout.destroy.size(), layout.create.size())) {
      return;
    }
    layout.supply = std::move(capped);
    layout.destroy.clear();
    layout.create.clear();
    for (size_t i = 0; i < choices_.size(); ++i) {
      if (choices_[i].existing && chosen_[i] == 0) {
        layout.destroy.push_back(choices_[i].instance);
      } else if (!choices_[i].existing && chosen_[i] != 0) {
        layout.create.push_back(choices_[i].instance);
      }
    }
  }

  // The unchanged layout first, then the changed ones no other layout covers, most compute
  // first.
  std::vector<Layout> Reduce() {
    std::vector<Layout> all;
    std::vector<Layout> result;
    for (auto& [supply, layout] : best_) {
      if (layout.changed()) {
        all.push_back(std::move(layout));
      } else {
        result.push_back(std::move(layout));
      }
    }
    auto compute = [&](const Layout& layout) {
      int64_t total = 0;
      for (const auto& [id, profile] : wanted_) {
        total += int64_t{layout.supply[id]} * profile->compute_slices;
      }
      return total;
    };
    std::vector<char> keep(all.size(), 0);
    for (size_t i = 0; i < all.size(); ++i) {
      bool covered = Covers(result[0].supply, all[i].supply);
      for (size_t j = 0; j < all.size() && !covered; ++j) {
        covered = j != i && Covers(all[j].supply, all[i].supply);
      }
      keep[i] = covered ? 0 : 1;
    }
    for (size_t i = 0; i < all.size(); ++i) {
      if (keep[i] != 0) {
        result.push_back(std::move(all[i]));
      }
    }
    std::stable_sort(result.begin() + 1, result.end(), [&](const Layout& a, const Layout& b) {
      return std::tuple(-compute(a), a.destroy.size(), a.create.size()) <
             std::tuple(-compute(b), b.destroy.size(), b.create.size());
    });
    return result;
  }

  const GpuModelInfo& model_;
  const std::vector<std::pair<int, const MigProfile*>> wanted_;  // (profile id, profile)
  const std::vector<int> cap_;                                   // per profile id
  std::vector<Choice> choices_;
  std::vector<char> chosen_;
  int free_count_ = 0;
  int kept_ = 0;
  int created_ = 0;
  std::map<std::vector<int>, Layout> best_;
};

// Branch and bound over the candidates of one group (GPUs linked by the requests they could
// serve), from a greedy plan.
class Search {
 public:
  Search(const std::vector<Demand>& demands, std::vector<const GpuCandidate*> gpus, int64_t budget)
      : demands_(demands),
        gpus_(std::move(gpus)),
        budget_(budget),
        served_(demands.size(), 0),
        assignment_(demands.size(), -1),
        choice_(gpus_.size(), 0),
        suffix_count_(gpus_.size() + 1, 0),
        suffix_slices_(gpus_.size() + 1, 0) {
    for (size_t i = gpus_.size(); i-- > 0;) {
      suffix_count_[i] = suffix_count_[i + 1] + gpus_[i]->max_count;
      suffix_slices_[i] = suffix_slices_[i + 1] + gpus_[i]->max_slices;
    }
    std::set<int> linked;
    for (const GpuCandidate* gpu : gpus_) {
      for (const std::vector<int>& list : gpu->demands_by_profile) {
        linked.insert(list.begin(), list.end());
      }
    }
    for (int d : linked) {
      ++remaining_count_;
      remaining_slices_ += demands_[d].slices;
    }
  }

  void Run() {
    Greedy();
    std::fill(served_.begin(), served_.end(), 0);
    std::fill(assignment_.begin(), assignment_.end(), -1);
    std::fill(choice_.begin(), choice_.end(), 0);
    count_ = 0;
    slices_ = 0;
    reconfigured_ = 0;
    Explore(0);
  }

  bool complete() const { return !exhausted_; }
  int64_t steps() const { return steps_; }
  const std::vector<int>& best_choice() const { return best_choice_; }
  // Per demand, the position of the GPU that serves it, or -1.
  const std::vector<int>& best_assignment() const { return best_assignment_; }

 private:
  // The demands `layout` of GPU `position` serves among those not served yet.
  void Serve(int position, int layout_index, std::vector<int>& out) const {
    const GpuCandidate& gpu = *gpus_[position];
    const Layout& layout = gpu.layouts[layout_index];
    for (size_t p = 0; p < layout.supply.size(); ++p) {
      int left = layout.supply[p];
      for (int d : gpu.demands_by_profile[p]) {
        if (left <= 0 || demands_[d].count > left) {
          break;
        }
        if (!served_[d]) {
          left -= demands_[d].count;
          out.push_back(d);
        }
      }
    }
  }

  void Mark(const std::vector<int>& list, int position, bool serve) {
    for (int d : list) {
      served_[d] = serve ? 1 : 0;
      assignment_[d] = serve ? position : -1;
      count_ += serve ? 1 : -1;
      slices_ += serve ? demands_[d].slices : -demands_[d].slices;
    }
  }

  Score Current() const { return {count_, slices_, -reconfigured_}; }

  void Keep() {
    best_ = Current();
    best_choice_ = choice_;
    best_assignment_ = assignment_;
  }

  // Leaves every GPU as it is, then keeps changing the GPU whose best layout adds the most.
  void Greedy() {
    std::vector<std::vector<int>> by_gpu(gpus_.size());
    for (size_t i = 0; i < gpus_.size(); ++i) {
      Serve(static_cast<int>(i), 0, by_gpu[i]);
      Mark(by_gpu[i], static_cast<int>(i), true);
    }
    while (true) {
      std::pair<int, int64_t> best_gain(0, 0);
      int best_gpu = -1;
      int best_layout = 0;
      std::vector<int> best_list;
      for (size_t i = 0; i < gpus_.size(); ++i) {
        if (choice_[i] != 0) {
          continue;
        }
        const int position = static_cast<int>(i);
        Mark(by_gpu[i], position, false);
        for (size_t l = 1; l < gpus_[i]->layouts.size(); ++l) {
          std::vector<int> list;
          Serve(position, static_cast<int>(l), list);
          int64_t gained_slices = 0;
          for (int d : list) {
            gained_slices += demands_[d].slices;
          }
          for (int d : by_gpu[i]) {
            gained_slices -= demands_[d].slices;
          }
          const std::pair<int, int64_t> gain(
              static_cast<int>(list.size()) - static_cast<int>(by_gpu[i].size()), gained_slices);
          if (gain > best_gain) {
            best_gain = gain;
            best_gpu = position;
            best_layout = static_cast<int>(l);
            best_list = std::move(list);
          }
        }
        Mark(by_gpu[i], position, true);
      }
      if (best_gpu < 0) {
        break;
      }
      Mark(by_gpu[best_gpu], best_gpu, false);
      by_gpu[best_gpu] = std::move(best_list);
      Mark(by_gpu[best_gpu], best_gpu, true);
      choice_[best_gpu] = best_layout;
      ++reconfigured_;
    }
    Keep();
  }

  void Explore(size_t position) {
    if (exhausted_) {
      return;
    }
    if (++steps_ > budget_) {
      exhausted_ = true;
      return;
    }
    if (position == gpus_.size()) {
      if (Current() > best_) {
        Keep();
      }
      return;
    }
    const Score bound{count_ + std::min(remaining_count_ - count_, suffix_count_[position]),
                      slices_ + std::min(remaining_slices_ - slices_, suffix_slices_[position]),
                      -reconfigured_};
    if (bound <= best_) {
      return;
    }
    const GpuCandidate& gpu = *gpus_[position];
    // Interchangeable GPUs take their layouts in non-decreasing order: one of each permutation.
    const int first =
        position > 0 && gpus_[position - 1]->signature == gpu.signature ? choice_[position - 1] : 0;
    const int at = static_cast<int>(position);
    std::vector<int> unchanged;
    Serve(at, 0, unchanged);
    std::sort(unchanged.begin(), unchanged.end());
    for (int l = first; l < static_cast<int>(gpu.layouts.size()); ++l) {
      std::vector<int> list;
      Serve(at, l, list);
      const bool changed = l != 0;
      if (changed) {
        std::sort(list.begin(), list.end());
        if (list.empty() || list == unchanged) {
          continue;
        }
      }
      Mark(list, at, true);
      choice_[position] = l;
      reconfigured_ += changed ? 1 : 0;
      Explore(position + 1);
      reconfigured_ -= changed ? 1 : 0;
      choice_[position] = 0;
      Mark(list, at, false);
      if (exhausted_) {
        return;
      }
    }
  }

  const std::vector<Demand>& demands_;
  const std::vector<const GpuCandidate*> gpus_;
  const int64_t budget_;
  std::vector<char> served_;
  std::vector<int> assignment_;
  std::vector<int> choice_;
  std::vector<int> suffix_count_;
  std::vector<int64_t> suffix_slices_;
  int remaining_count_ = 0;
  int64_t remaining_slices_ = 0;
  int count_ = 0;
  int64_t slices_ = 0;
  int reconfigured_ = 0;
  int64_t steps_ = 0;
  bool exhausted_ = false;
  Score best_{-1, 0, 0};
  std::vector<int> best_choice_;
  std::vector<int> best_assignment_;
};

class Planner {
 public:
  Planner(const GpuCatalog& catalog, const std::vector<MigGpu>& gpus,
          const std::vector<MigRequest>& requests, const MigPlannerOptions& options)
      : catalog_(catalog), gpus_(gpus), requests_(requests), options_(options) {}

  Result<MigPlan> Plan() {
    if (options_.search_budget < 0) {
      return InvalidArgumentError(
          fmt::format("search_budget: {} (must be at least 0)", options_.search_budget));
    }
    GPUFLEET_RETURN_IF_ERROR(ValidateGpus());
    GPUFLEET_RETURN_IF_ERROR(ValidateRequests());
    BuildCandidates();
    MigPlan plan;
    std::vector<int> assignment(demands_.size(), -1);  // candidate index per demand
    std::vector<int> chosen(candidates_.size(), 0);    // layout per candidate
    for (const std::vector<int>& group : Groups()) {
      std::vector<const GpuCandidate*> members;
      for (int c : group) {
        members.push_back(&candidates_[c]);
      }
      Search search(demands_, members, options_.search_budget);
      search.Run();
      plan.optimal = plan.optimal && search.complete();
      plan.search_steps += search.steps();
      for (size_t m = 0; m < group.size(); ++m) {
        chosen[group[m]] = search.best_choice()[m];
      }
      for (size_t d = 0; d < demands_.size(); ++d) {
        if (search.best_assignment()[d] >= 0) {
          assignment[d] = group[search.best_assignment()[d]];
        }
      }
    }
    for (size_t c = 0; c < candidates_.size(); ++c) {
      if (chosen[c] == 0) {
        continue;
      }
      std::vector<int> serves;
      for (size_t d = 0; d < demands_.size(); ++d) {
        if (assignment[d] == static_cast<int>(c)) {
          serves.push_back(static_cast<int>(d));
        }
      }
      std::optional<MigGpuPlan> gpu_plan =
          Trimmed(candidates_[c], candidates_[c].layouts[chosen[c]], serves);
      if (gpu_plan.has_value()) {
        plan.gpus.push_back(std::move(*gpu_plan));
      }
    }
    for (size_t d = 0; d < demands_.size(); ++d) {
      const MigRequest& request = requests_[demands_[d].index];
      if (assignment[d] >= 0) {
        plan.served.push_back(request.id);
        plan.compute_slices_served += demands_[d].slices;
      } else {
        plan.unserved.push_back({request.id, Reason(static_cast<int>(d))});
      }
    }
    return plan;
  }

 private:
  Status ValidateGpus() {
    std::set<std::pair<NodeId, int>> seen;
    for (size_t i = 0; i < gpus_.size(); ++i) {
      const MigGpu& gpu = gpus_[i];
      Result<const GpuModelInfo*> model = catalog_.Find(gpu.model);
      if (!model.ok()) {
        return InvalidArgumentError(fmt::format("gpus[{}].model: {}", i, model.status().message()));
      }
      if (!(*model)->SupportsMig()) {
        return InvalidArgumentError(
            fmt::format("gpus[{}].model: {} has no MIG", i, (*model)->name));
      }
      if (!seen.emplace(gpu.node, gpu.gpu).second) {
        return InvalidArgumentError(fmt::format("gpus[{}]: node \"{}\" gpu {} is listed twice", i,
                                                gpu.node.value(), gpu.gpu));
      }
      Result<MigLayout> layout = MigLayout::FromInstances(**model, gpu.instances);
      if (!layout.ok()) {
        return InvalidArgumentError(fmt::format("gpus[{}] (node \"{}\" gpu {}).{}", i,
                                                gpu.node.value(), gpu.gpu,
                                                layout.status().message()));
      }
      models_.push_back(*model);
    }
    return Status::Ok();
  }

  Status ValidateRequests() {
    std::set<std::string> ids;
    for (size_t i = 0; i < requests_.size(); ++i) {
      const MigRequest& request = requests_[i];
      if (request.id.empty()) {
        return InvalidArgumentError(fmt::format("requests[{}].id: empty", i));
      }
      if (!ids.insert(request.id).second) {
        return InvalidArgumentError(
            fmt::format("requests[{}].id: duplicate \"{}\"", i, request.id));
      }
      if (request.count < 1) {
        return InvalidArgumentError(
            fmt::format("requests[{}].count: {} (must be at least 1)", i, request.count));
      }
      Demand demand;
      demand.index = static_cast<int>(i);
      demand.count = request.count;
      for (size_t m = 0; m < request.models.size(); ++m) {
        Result<const GpuModelInfo*> model = catalog_.Find(request.models[m]);
        if (!model.ok()) {
          return InvalidArgumentError(
              fmt::format("requests[{}].models[{}]: {}", i, m, model.status().message()));
        }
        demand.models.push_back((*model)->name);
      }
      const MigProfile* profile = nullptr;
      std::string valid;
      for (const auto& [name, model] : catalog_.models()) {
        if (!demand.Allows(name) || !model.SupportsMig()) {
          continue;
        }
        valid += fmt::format("{}{}: {}", valid.empty() ? "" : "; ", name, model.MigProfileNames());
        if (profile == nullptr) {
          profile = model.FindMigProfile(request.profile);
        }
      }
      if (profile == nullptr) {
        return InvalidArgumentError(fmt::format(
            "requests[{}].profile: unknown profile \"{}\" for the request's models ({})", i,
            request.profile, valid.empty() ? "none has MIG" : valid));
      }
      demand.slices = int64_t{request.count} * profile->compute_slices;
      auto [it, inserted] =
          profile_ids_.emplace(request.profile, static_cast<int>(profile_ids_.size()));
      demand.profile = it->second;
      demands_.push_back(std::move(demand));
    }
    return Status::Ok();
  }

  bool Eligible(const Demand& demand, const GpuModelInfo& model) const {
    return demand.Allows(model.name) &&
           model.FindMigProfile(requests_[demand.index].profile) != nullptr;
  }

  void BuildCandidates() {
    const int profiles = static_cast<int>(profile_ids_.size());
    std::map<std::string, std::vector<Layout>> cache;  // by model and instances
    for (size_t i = 0; i < gpus_.size(); ++i) {
      const GpuModelInfo& model = *models_[i];
      std::vector<int> cap(profiles, 0);
      GpuCandidate candidate;
      candidate.input = static_cast<int>(i);
      candidate.model = &model;
      candidate.demands_by_profile.resize(profiles);
      for (size_t d = 0; d < demands_.size(); ++d) {
        if (Eligible(demands_[d], model)) {
          cap[demands_[d].profile] += demands_[d].count;
          candidate.demands_by_profile[demands_[d].profile].push_back(static_cast<int>(d));
        }
      }
      if (std::all_of(cap.begin(), cap.end(), [](int c) { return c == 0; })) {
        continue;
      }
      for (std::vector<int>& list : candidate.demands_by_profile) {
        std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
          auto breadth = [&](const Demand& demand) {
            return demand.models.empty() ? catalog_.models().size() : demand.models.size();
          };
          return std::pair(demands_[a].count, breadth(demands_[a])) <
                 std::pair(demands_[b].count, breadth(demands_[b]));
        });
      }
      std::vector<std::pair<int, const MigProfile*>> wanted;
      for (const auto& [name, id] : profile_ids_) {
        if (cap[id] > 0) {
          wanted.emplace_back(id, model.FindMigProfile(name));
        }
      }
      std::sort(wanted.begin(), wanted.end());
      std::string key = model.name + "|" + InstancesKey(gpus_[i].instances) + "|";
      for (int c : cap) {
        key += fmt::format("{},", c);
      }
      auto [it, inserted] = cache.try_emplace(key);
      if (inserted) {
        it->second = LayoutEnumerator(model, wanted, cap).Enumerate(gpus_[i].instances);
      }
      candidate.layouts = it->second;
      candidate.signature = key;
      FillBounds(candidate);
      if (candidate.max_count > 0) {
        candidates_.push_back(std::move(candidate));
      }
    }
  }

  void FillBounds(GpuCandidate& candidate) const {
    for (const Layout& layout : candidate.layouts) {
      int count = 0;
      int64_t slices = 0;
      for (size_t p = 0; p < layout.supply.size(); ++p) {
        int left = layout.supply[p];
        for (int d : candidate.demands_by_profile[p]) {
          if (demands_[d].count > left) {
            break;
          }
          left -= demands_[d].count;
          ++count;
          slices += demands_[d].slices;
        }
      }
      candidate.max_count = std::max(candidate.max_count, count);
      candidate.max_slices = std::max(candidate.max_slices, slices);
    }
  }

  // Candidates linked by a request they could both serve, each group sorted so that
  // interchangeable GPUs are adjacent.
  std::vector<std::vector<int>> Groups() const {
    std::vector<int> parent(candidates_.size());
    for (size_t c = 0; c < parent.size(); ++c) {
      parent[c] = static_cast<int>(c);
    }
    auto root = [&](int c) {
      while (parent[c] != c) {
        c = parent[c] = parent[parent[c]];
      }
      return c;
    };
    std::vector<int> first_by_demand(demands_.size(), -1);
    for (size_t c = 0; c < candidates_.size(); ++c) {
      for (const std::vector<int>& list : candidates_[c].demands_by_profile) {
        for (int d : list) {
          if (first_by_demand[d] < 0) {
            first_by_demand[d] = static_cast<int>(c);
          } else {
            parent[root(static_cast<int>(c))] = root(first_by_demand[d]);
          }
        }
      }
    }
    std::map<int, std::vector<int>> groups;
    for (size_t c = 0; c < candidates_.size(); ++c) {
      groups[root(static_cast<int>(c))].push_back(static_cast<int>(c));
    }
    std::vector<std::vector<int>> result;
    for (auto& [root_id, members] : groups) {
      std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
        return candidates_[a].signature < candidates_[b].signature;
      });
      result.push_back(std::move(members));
    }
    return result;
  }

  // The plan of one GPU, without the new instances its requests do not need and keeping the free
  // instances that still fit; nullopt when nothing is left to change.
  std::optional<MigGpuPlan> Trimmed(const GpuCandidate& candidate, const Layout& layout,
                                    const std::vector<int>& serves) const {
    const GpuModelInfo& model = *candidate.model;
    const MigGpu& gpu = gpus_[candidate.input];
    std::map<std::string, int> needed;
    for (int d : serves) {
      needed[requests_[demands_[d].index].profile] += demands_[d].count;
    }
    std::vector<MigInstance> kept;
    for (const MigInstance& instance : gpu.instances) {
      if (std::find(layout.destroy.begin(), layout.destroy.end(), instance) ==
          layout.destroy.end()) {
        kept.push_back(instance);
        if (!instance.in_use && needed.count(instance.profile) > 0) {
          --needed[instance.profile];
        }
      }
    }
    MigGpuPlan plan;
    plan.node = gpu.node;
    plan.gpu = gpu.gpu;
    plan.model = model.name;
    for (const MigInstance& instance : layout.create) {
      if (needed[instance.profile] > 0) {
        --needed[instance.profile];
        plan.create.push_back(instance);
      }
    }
    std::vector<MigInstance> after = kept;
    after.insert(after.end(), plan.create.begin(), plan.create.end());
    MigLayout occupied = MigLayout::FromInstances(model, after).value();
    for (const MigInstance& instance : layout.destroy) {
      const MigProfile& profile = *model.FindMigProfile(instance.profile);
      if (occupied.CanAddAt(profile, instance.start)) {
        occupied.Add(profile, instance.start);
      } else {
        plan.destroy.push_back(instance);
      }
    }
    if (plan.destroy.empty() && plan.create.empty()) {
      return std::nullopt;
    }
    for (const MigInstance& instance : gpu.instances) {
      if (std::find(plan.destroy.begin(), plan.destroy.end(), instance) == plan.destroy.end()) {
        plan.layout.push_back(instance);
      }
    }
    plan.layout.insert(plan.layout.end(), plan.create.begin(), plan.create.end());
    for (int d : serves) {
      plan.serves.push_back(requests_[demands_[d].index].id);
    }
    return plan;
  }

  std::string Reason(int d) const {
    const Demand& demand = demands_[d];
    const MigRequest& request = requests_[demand.index];
    std::string models;
    int most_per_gpu = 0;
    bool any_gpu = false;
    for (size_t i = 0; i < gpus_.size(); ++i) {
      if (Eligible(demand, *models_[i])) {
        any_gpu = true;
        most_per_gpu =
            std::max(most_per_gpu, models_[i]->FindMigProfile(request.profile)->max_instances);
      }
    }
    const std::string allowed =
        demand.models.empty() ? "any model" : fmt::format("{}", fmt::join(demand.models, ", "));
    if (!any_gpu) {
      return fmt::format("no MIG-enabled GPU of {} with profile {}", allowed, request.profile);
    }
    if (request.count > most_per_gpu) {
      return fmt::format("needs {} x {} on one GPU; one GPU holds at most {}", request.count,
                         request.profile, most_per_gpu);
    }
    for (const GpuCandidate& candidate : candidates_) {
      for (const Layout& layout : candidate.layouts) {
        if (layout.supply[demand.profile] >= demand.count && Eligible(demand, *candidate.model)) {
          return "the GPUs whose layout could change for it serve other requests in this plan";
        }
      }
    }
    return fmt::format("instances in use leave no room for {} x {} on any GPU of {}", request.count,
                       request.profile, allowed);
  }

  const GpuCatalog& catalog_;
  const std::vector<MigGpu>& gpus_;
  const std::vector<MigRequest>& requests_;
  const MigPlannerOptions& options_;
  std::vector<const GpuModelInfo*> models_;  // per input GPU
  std::vector<Demand> demands_;              // per input request
  std::map<std::string, int> profile_ids_;   // requested profile name -> id
  std::vector<GpuCandidate> candidates_;
};

}  // namespace

Result<MigPlan> PlanMigLayouts(const GpuCatalog& catalog, const std::vector<MigGpu>& gpus,
                               const std::vector<MigRequest>& requests,
                               const MigPlannerOptions& options) {
  return Planner(catalog, gpus, requests, options).Plan();
}

std::vector<MigGpu> MigGpusOf(const scheduler::ClusterSnapshot& snapshot) {
  std::vector<MigGpu> result;
  for (const scheduler::NodeInfo& node : snapshot.nodes()) {
    for (const scheduler::GpuSlot& slot : node.gpus) {
      if (slot.mig_enabled) {
        result.push_back(
            {node.node->id, slot.index, snapshot.Model(slot.model_id).name, slot.mig_instances});
      }
    }
  }
  return result;
}

std::vector<MigRequest> MigRequestsOf(const Job& job) {
  std::vector<MigRequest> result;
  for (const TaskGroup& group : job.groups) {
    const auto* mig = std::get_if<MigGpus>(&group.request.gpus);
    if (mig == nullptr) {
      continue;
    }
    for (int replica = 0; replica < group.replicas; ++replica) {
      result.push_back({fmt::format("{}/{}/{}", job.id.value(), group.name, replica), mig->profile,
                        mig->count, job.allowed_gpu_models});
    }
  }
  return result;
}

Result<std::vector<MigInstance>> ApplyMigGpuPlan(const GpuModelInfo& model,
                                                 const std::vector<MigInstance>& instances,
                                                 const MigGpuPlan& plan) {
  std::vector<MigInstance> result = instances;
  for (const MigInstance& target : plan.destroy) {
    auto found = std::find_if(result.begin(), result.end(), [&](const MigInstance& instance) {
      return instance.profile == target.profile && instance.start == target.start;
    });
    if (found == result.end()) {
      return FailedPreconditionError(
          fmt::format("node \"{}\" gpu {}: no {} instance at slot {} to destroy", plan.node.value(),
                      plan.gpu, target.profile, target.start));
    }
    if (found->in_use) {
      return FailedPreconditionError(
          fmt::format("node \"{}\" gpu {}: the {} instance at slot {} is in use", plan.node.value(),
                      plan.gpu, target.profile, target.start));
    }
    result.erase(found);
  }
  for (const MigInstance& instance : plan.create) {
    result.push_back({instance.profile, instance.start, false});
  }
  Result<MigLayout> layout = MigLayout::FromInstances(model, result);
  if (!layout.ok()) {
    return InvalidArgumentError(fmt::format("node \"{}\" gpu {}: {}", plan.node.value(), plan.gpu,
                                            layout.status().message()));
  }
  return result;
}

}  // namespace gpufleet::policy
