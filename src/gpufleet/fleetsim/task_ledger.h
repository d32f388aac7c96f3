// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/runner/task_runner.h"

// The physical record of a simulated fleet: which task held which GPU when, in the server's time.
namespace gpufleet::fleetsim {

// A monotonic clock that runs at `rate` times a base clock from the moment it is made: an agent's
// clock drifting from the server's. ToBase maps one of its readings back to the base clock.
class DriftingClock final : public Clock {
 public:
  // `base` must outlive this clock. REQUIRES: rate > 0.
  DriftingClock(const Clock& base, double rate);
  MonoTime Now() const override;
  MonoTime ToBase(MonoTime local) const;

 private:
  const Clock& base_;
  MonoTime origin_;
  double rate_;
};

// One line per thing that happened, dated in simulated seconds: what a failing seed prints.
class EventLog {
 public:
  explicit EventLog(const Clock& clock) : clock_(clock) {}
  void Add(std::string_view text);
  const std::deque<std::string>& lines() const { return lines_; }
  // The last `count` lines, newline-separated.
  std::string Tail(size_t count) const;

 private:
  const Clock& clock_;
  MonoTime start_ = clock_.Now();
  std::deque<std::string> lines_;
};

// One run of a task on its node: from the start its runner accepted to the end it saw (none while
// it still runs), in the server's clock.
struct TaskSpan {
  std::string task_id;
  std::string node;
  std::vector<std::string> gpu_uuids;
  MonoTime start;
  std::optional<MonoTime> end;
};

// A grace a node's agent gave its runner: to stop one task (Stop: cancel, preemption, reclaim,
// drain, scale-down, any task the server no longer wants there), or to every task should the
// lease run out (RenewLease: the partition's fence; `task_id` empty).
struct GraceGiven {
  std::string node;
  std::string task_id;
  Duration grace{0};
  MonoTime at;
};

// Every task any runner of the fleet started. Thread-compatible (one simulation thread).
class TaskLedger {
 public:
  // Starts and ends go to `events` as well (null: nowhere); it must outlive the ledger.
  explicit TaskLedger(EventLog* events = nullptr) : events_(events) {}
  void Started(std::string task_id, std::string node, std::vector<std::string> gpu_uuids,
               MonoTime start);
  // The end of the live span of `task_id` on `node`; a second call keeps the first end.
  void Ended(std::string_view task_id, std::string_view node, MonoTime end);
  // Ends every live span on `node` (its machine went down: every process is gone).
  void EndAllOn(std::string_view node, MonoTime end);
  // A stop's grace (every one), or the lease's fence grace (when it changes on the node).
  void Grace(GraceGiven given);

  const std::vector<TaskSpan>& spans() const { return spans_; }
  const std::vector<GraceGiven>& graces() const { return graces_; }
  // Tasks started and not seen to end.
  size_t live() const { return live_.size(); }

 private:
  EventLog* events_;
  std::vector<TaskSpan> spans_;
  std::vector<GraceGiven> graces_;
  // The fence grace last given on each node.
  std::map<std::string, Duration, std::less<>> fence_grace_;
  // (node, task id) -> index of its live span in spans_.
  std::map<std::pair<std::string, std::string>, size_t, std::less<>> live_;
};

// A TaskRunner in front of a node's runner that writes each task's start and end into the ledger,
// in the server's time (the node's clock mapped back). Every call is passed on unchanged.
class LedgerRunner final : public runner::TaskRunner {
 public:
  // Everything must outlive the runner.
  LedgerRunner(runner::TaskRunner& inner, TaskLedger& ledger, std::string node,
               const DriftingClock& clock);

  Status Start(const runner::TaskLaunch& launch) override;
  Status Stop(std::string_view task_id, Duration grace) override;
  Status SendNotice(std::string_view task_id, std::string_view signal_name) override {
    return inner_.SendNotice(task_id, signal_name);
  }
  std::vector<runner::TaskStatus> Poll() override;
  Status Forget(std::string_view task_id) override;
  Status RenewLease(Duration fence_in, Duration grace) override;
  std::string ContainerRuntime() const override { return inner_.ContainerRuntime(); }

 private:
  runner::TaskRunner& inner_;
  TaskLedger& ledger_;
  std::string node_;
  const DriftingClock& clock_;
};

// The violations of the physical record: a GPU UUID held by two tasks at once, a task id live in
// two places at once, and two attempts of one job live at once (task ids are
// JOB-KEY/TASK/ATTEMPT). Spans still live count as lasting until `now`.
std::vector<std::string> CheckExclusiveUse(const std::vector<TaskSpan>& spans, MonoTime now);

// Every stop path keeps the documented grace (docs/agent.md): each grace given is at least
// `documented` (the agent's stop grace, cut to the server's).
std::vector<std::string> CheckGraces(const std::vector<GraceGiven>& graces, Duration documented);

// Gangs run whole: the tasks of one attempt of a job of `gang_size[job key]` >= 2 tasks all start
// within `window` of the first, or whatever started ends within `window`.
std::vector<std::string> CheckGangsWhole(const std::vector<TaskSpan>& spans,
                                         const std::map<std::string, int>& gang_size,
                                         Duration window, MonoTime now);

// "TEAM/NAME/TASK/ATTEMPT" (or "NAME/TASK/ATTEMPT") as job key, task, attempt.
struct TaskIdParts {
  std::string job;
  std::string task;
  std::string attempt;
};
TaskIdParts SplitTaskId(std::string_view task_id);

}  // namespace gpufleet::fleetsim
