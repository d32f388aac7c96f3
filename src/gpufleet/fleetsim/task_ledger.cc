// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/task_ledger.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/core.h>
#include <fmt/format.h>

namespace gpufleet::fleetsim {
namespace {

double Seconds(MonoTime time) {
  return static_cast<double>(time.nanos) / 1e9;
}

MonoTime EndOr(const TaskSpan& span, MonoTime now) {
  return span.end.value_or(now);
}

}  // namespace

void EventLog::Add(std::string_view text) {
  // A failing seed shows how it got there: the recent past is enough, and memory stays bounded.
  constexpr size_t kKeptLines = 20000;
  if (lines_.size() == kKeptLines) {
    lines_.pop_front();
  }
  lines_.push_back(fmt::format("[{:9.3f} s] {}",
                               std::chrono::duration<double>(clock_.Now() - start_).count(), text));
}

std::string EventLog::Tail(size_t count) const {
  std::string text;
  for (size_t i = lines_.size() > count ? lines_.size() - count : 0; i < lines_.size(); ++i) {
    text += lines_[i];
    text += '\n';
  }
  return text;
}

DriftingClock::DriftingClock(const Clock& base, double rate)
    : base_(base), origin_(base.Now()), rate_(rate) {}

MonoTime DriftingClock::Now() const {
  const double elapsed = static_cast<double>((base_.Now() - origin_).count()) * rate_;
  return origin_ + Duration(static_cast<int64_t>(std::llround(elapsed)));
}

MonoTime DriftingClock::ToBase(MonoTime local) const {
  const double elapsed = static_cast<double>((local - origin_).count()) / rate_;
  return origin_ + Duration(static_cast<int64_t>(std::llround(elapsed)));
}

void TaskLedger::Started(std::string task_id, std::string node, std::vector<std::string> gpu_uuids,
                         MonoTime start) {
  if (events_ != nullptr) {
    events_->Add(
        fmt::format("{}: task {} started on [{}]", node, task_id, fmt::join(gpu_uuids, ",")));
  }
  live_[{node, task_id}] = spans_.size();
  spans_.push_back({.task_id = std::move(task_id),
                    .node = std::move(node),
                    .gpu_uuids = std::move(gpu_uuids),
                    .start = start,
                    .end = std::nullopt});
}

void TaskLedger::Ended(std::string_view task_id, std::string_view node, MonoTime end) {
  const auto live = live_.find(std::make_pair(std::string(node), std::string(task_id)));
  if (live == live_.end()) {
    return;
  }
  spans_[live->second].end = std::max(end, spans_[live->second].start);
  live_.erase(live);
  if (events_ != nullptr) {
    events_->Add(fmt::format("{}: task {} ended at {:.3f} s", node, task_id, Seconds(end)));
  }
}

void TaskLedger::EndAllOn(std::string_view node, MonoTime end) {
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->first.first == node) {
      spans_[it->second].end = std::max(end, spans_[it->second].start);
      if (events_ != nullptr) {
        events_->Add(fmt::format("{}: task {} gone with its machine", node, it->first.second));
      }
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
}

void TaskLedger::Grace(GraceGiven given) {
  if (given.task_id.empty()) {
    const auto last = fence_grace_.find(given.node);
    if (last != fence_grace_.end() && last->second == given.grace) {
      return;
    }
    fence_grace_[given.node] = given.grace;
  }
  graces_.push_back(std::move(given));
}

LedgerRunner::LedgerRunner(runner::TaskRunner& inner, TaskLedger& ledger, std::string node,
                           const DriftingClock& clock)
    : inner_(inner), ledger_(ledger), node_(std::move(node)), clock_(clock) {}

Status LedgerRunner::Start(const runner::TaskLaunch& launch) {
  const MonoTime now = clock_.ToBase(clock_.Now());
  GPUFLEET_RETURN_IF_ERROR(inner_.Start(launch));
  ledger_.Started(launch.task_id, node_, launch.gpu_uuids, now);
  return Status::Ok();
}

Status LedgerRunner::Stop(std::string_view task_id, Duration grace) {
  ledger_.Grace({.node = node_,
                 .task_id = std::string(task_id),
                 .grace = grace,
                 .at = clock_.ToBase(clock_.Now())});
  return inner_.Stop(task_id, grace);
}

std::vector<runner::TaskStatus> LedgerRunner::Poll() {
  std::vector<runner::TaskStatus> statuses = inner_.Poll();
  for (const runner::TaskStatus& status : statuses) {
    if (runner::IsFinal(status.state)) {
      ledger_.Ended(status.task_id, node_,
                    clock_.ToBase(status.end_time.value_or(status.start_time)));
    }
  }
  return statuses;
}

Status LedgerRunner::Forget(std::string_view task_id) {
  return inner_.Forget(task_id);
}

Status LedgerRunner::RenewLease(Duration fence_in, Duration grace) {
  ledger_.Grace({.node = node_, .grace = grace, .at = clock_.ToBase(clock_.Now())});
  return inner_.RenewLease(fence_in, grace);
}

TaskIdParts SplitTaskId(std::string_view task_id) {
  TaskIdParts parts;
  const size_t last = task_id.rfind('/');
  if (last == std::string_view::npos) {
    parts.job = std::string(task_id);
    return parts;
  }
  parts.attempt = std::string(task_id.substr(last + 1));
  const size_t middle = task_id.rfind('/', last - 1);
  if (last == 0 || middle == std::string_view::npos) {
    parts.job = std::string(task_id.substr(0, last));
    return parts;
  }
  parts.task = std::string(task_id.substr(middle + 1, last - middle - 1));
  parts.job = std::string(task_id.substr(0, middle));
  return parts;
}

std::vector<std::string> CheckExclusiveUse(const std::vector<TaskSpan>& spans, MonoTime now) {
  std::vector<std::string> violations;
  // Sorted by start, a span overlaps an earlier one of its group when it starts before the
  // latest end seen so far in that group.
  const auto check = [&](std::map<std::string, std::vector<const TaskSpan*>>& groups,
                         const auto& same_run, std::string_view what) {
    for (auto& [key, members] : groups) {
      std::sort(members.begin(), members.end(), [](const TaskSpan* a, const TaskSpan* b) {
        return std::tie(a->start.nanos, a->task_id) < std::tie(b->start.nanos, b->task_id);
      });
      const TaskSpan* holder = nullptr;
      for (const TaskSpan* span : members) {
        if (holder != nullptr && span->start < EndOr(*holder, now) && !same_run(*holder, *span)) {
          violations.push_back(fmt::format(
              "{} {}: {} started on {} at {:.3f} s while {} on {} held it until {:.3f} s", what,
              key, span->task_id, span->node, Seconds(span->start), holder->task_id, holder->node,
              Seconds(EndOr(*holder, now))));
        }
        if (holder == nullptr || EndOr(*span, now) > EndOr(*holder, now)) {
          holder = span;
        }
      }
    }
  };
  std::map<std::string, std::vector<const TaskSpan*>> by_gpu;
  std::map<std::string, std::vector<const TaskSpan*>> by_task;
  std::map<std::string, std::vector<const TaskSpan*>> by_job;
  for (const TaskSpan& span : spans) {
    for (const std::string& gpu : span.gpu_uuids) {
      by_gpu[span.node + "/" + gpu].push_back(&span);
    }
    by_task[span.task_id].push_back(&span);
    by_job[SplitTaskId(span.task_id).job].push_back(&span);
  }
  const auto never_same = [](const TaskSpan&, const TaskSpan&) { return false; };
  check(by_gpu, never_same, "GPU");
  check(by_task, never_same, "task");
  check(
      by_job,
      [](const TaskSpan& a, const TaskSpan& b) {
        return SplitTaskId(a.task_id).attempt == SplitTaskId(b.task_id).attempt;
      },
      "job");
  return violations;
}

std::vector<std::string> CheckGraces(const std::vector<GraceGiven>& graces, Duration documented) {
  std::vector<std::string> violations;
  for (const GraceGiven& given : graces) {
    if (given.grace < documented) {
      violations.push_back(fmt::format(
          "{} at {:.3f} s: {} with a grace of {:.3f} s, less than the documented {:.3f} s",
          given.node, Seconds(given.at),
          given.task_id.empty() ? std::string("the lease's fence") : "stop " + given.task_id,
          std::chrono::duration<double>(given.grace).count(),
          std::chrono::duration<double>(documented).count()));
    }
  }
  return violations;
}

std::vector<std::string> CheckGangsWhole(const std::vector<TaskSpan>& spans,
                                         const std::map<std::string, int>& gang_size,
                                         Duration window, MonoTime now) {
  std::map<std::pair<std::string, std::string>, std::vector<const TaskSpan*>> attempts;
  for (const TaskSpan& span : spans) {
    TaskIdParts parts = SplitTaskId(span.task_id);
    attempts[{std::move(parts.job), std::move(parts.attempt)}].push_back(&span);
  }
  std::vector<std::string> violations;
  for (const auto& [key, members] : attempts) {
    const auto size = gang_size.find(key.first);
    if (size == gang_size.end() || size->second < 2) {
      continue;
    }
    std::set<std::string> distinct_tasks;
    MonoTime first = members.front()->start;
    MonoTime last_start = first;
    MonoTime last_end = first;
    for (const TaskSpan* span : members) {
      distinct_tasks.insert(span->task_id);
      first = std::min(first, span->start);
      last_start = std::max(last_start, span->start);
      last_end = std::max(last_end, EndOr(*span, now));
    }
    const bool all_started = static_cast<int>(distinct_tasks.size()) >= size->second;
    const Duration partial = (all_started ? last_start : last_end) - first;
    if (partial > window) {
      violations.push_back(fmt::format(
          "gang {} attempt {}: {} of {} tasks ran partly started for {:.1f} s (window {:.0f} s)",
          key.first, key.second, distinct_tasks.size(), size->second,
          std::chrono::duration<double>(partial).count(),
          std::chrono::duration<double>(window).count()));
    }
  }
  return violations;
}

}  // namespace gpufleet::fleetsim
