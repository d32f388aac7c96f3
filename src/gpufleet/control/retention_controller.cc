// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/retention_controller.h"

#include <charconv>
#include <limits>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/json_scan.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::control {
namespace {

constexpr std::string_view kFinishedAtField = "finished_at";
// The first scan waits this long after the first step, so that a server (re)starting on a large
// store serves and schedules before it lists every job.
constexpr Duration kFirstScanDelay = std::chrono::minutes(1);

bool IsFinishedText(const std::optional<std::string>& state) {
  if (!state) {
    return false;
  }
  const std::optional<JobState> parsed = ParseJobState(*state);
  return parsed && IsFinished(*parsed);
}

}  // namespace

Result<Duration> ParseRetention(std::string_view field, std::string_view text) {
  if (text == "0" || text == "forever") {
    return Duration::zero();
  }
  const auto invalid = [&] {
    return InvalidArgumentError(fmt::format(
        "{}: \"{}\" is not a retention (a whole number with s, m, h or d, e.g. 30d; or 0 or "
        "forever to keep every finished job)",
        field, text));
  };
  if (text.size() < 2) {
    return invalid();
  }
  int64_t count = 0;
  const std::string_view digits = text.substr(0, text.size() - 1);
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), count);
  if (error != std::errc() || end != digits.data() + digits.size() || count < 0) {
    return invalid();
  }
  int64_t unit_seconds = 0;
  switch (text.back()) {
    case 's':
      unit_seconds = 1;
      break;
    case 'm':
      unit_seconds = 60;
      break;
    case 'h':
      unit_seconds = 3600;
      break;
    case 'd':
      unit_seconds = 86400;
      break;
    default:
      return invalid();
  }
  // At most about 290 years in nanoseconds; ten thousand days is plenty.
  if (count > 10000 * 86400 / unit_seconds) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is longer than 10000d", field, text));
  }
  return Duration(std::chrono::seconds(count * unit_seconds));
}

Result<RetentionController::StepResult> RetentionController::Step() {
  StepResult result;
  if (options_.retain_finished <= Duration::zero() || options_.wall_clock == nullptr) {
    return result;
  }
  const int64_t now = options_.wall_clock->UnixNanos();
  const MonoTime mono = options_.clock.Now();
  if (!last_scan_) {
    last_scan_ = mono + (kFirstScanDelay - options_.scan_interval);
  }
  if (expired_.empty() && unstamped_.empty() && mono - *last_scan_ >= options_.scan_interval) {
    last_scan_ = mono;
    GPUFLEET_RETURN_IF_ERROR(Scan(now));
    result.scanned = true;
  }
  for (int batch = 0; batch < options_.batches_per_step; ++batch) {
    if (!expired_.empty()) {
      GPUFLEET_RETURN_IF_ERROR(RunBatch(expired_, /*remove=*/true, now, result));
    } else if (!unstamped_.empty()) {
      GPUFLEET_RETURN_IF_ERROR(RunBatch(unstamped_, /*remove=*/false, now, result));
    } else {
      break;
    }
  }
  return result;
}

Status RetentionController::Scan(int64_t now_unix_nanos) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> jobs,
                            options_.store.List(kJobsKind));
  const int64_t retain = options_.retain_finished.count();
  for (const store::StoredObject& job : jobs) {
    // Only the top-level fields are read (core/json_scan.h): a scan of a large history parses
    // no document.
    if (!IsFinishedText(TopLevelString(job.data, "state"))) {
      continue;
    }
    const std::optional<std::string> finished_at = TopLevelString(job.data, kFinishedAtField);
    const Result<int64_t> since = ParseRfc3339(finished_at.value_or(""));
    if (!since.ok()) {
      unstamped_.push_back(job.name);
    } else if (now_unix_nanos - *since >= retain) {
      expired_.push_back(job.name);
    }
  }
  return Status::Ok();
}

Status RetentionController::RunBatch(std::deque<std::string>& names, bool remove,
                                     int64_t now_unix_nanos, StepResult& result) {
  // Each job's writes on their own too, in case the whole batch is refused for one job.
  std::vector<store::WriteBatch> writes;
  store::WriteBatch all;
  while (!names.empty() && static_cast<int>(writes.size()) < options_.batch_jobs) {
    const std::string name = std::move(names.front());
    names.pop_front();
    Result<store::StoredObject> job = options_.store.Get(kJobsKind, name);
    if (!job.ok()) {
      if (job.status().code() != StatusCode::kNotFound) {
        return job.status();
      }
      ++result.skipped;
      continue;
    }
    // Read again now: a job that is not finished any more (its name was submitted again) or
    // whose stamp moved is not touched.
    if (!IsFinishedText(TopLevelString(job->data, "state"))) {
      ++result.skipped;
      continue;
    }
    const std::optional<std::string> finished_at = TopLevelString(job->data, kFinishedAtField);
    store::WriteBatch write;
    if (remove) {
      const Result<int64_t> since = ParseRfc3339(finished_at.value_or(""));
      if (!since.ok() || now_unix_nanos - *since < options_.retain_finished.count()) {
        ++result.skipped;
        continue;
      }
      write.Delete(std::string(kJobsKind), name, job->version);
      write.DeleteEvents(std::string(kJobsKind), name);
    } else {
      if (finished_at) {
        continue;  // stamped since the scan
      }
      Json doc = wire::ParseDocument(job->data);
      if (!doc.is_object()) {
        ++result.skipped;
        continue;
      }
      doc[std::string(kFinishedAtField)] = FormatRfc3339(now_unix_nanos);
      write.Update(std::string(kJobsKind), name, doc.dump(), job->version);
    }
    all.Append(write);
    writes.push_back(std::move(write));
  }
  int& done = remove ? result.deleted : result.stamped;
  const Status status = options_.store.Commit(all);
  if (status.ok()) {
    done += static_cast<int>(writes.size());
    return Status::Ok();
  }
  if (status.code() != StatusCode::kAborted && status.code() != StatusCode::kNotFound) {
    return status;
  }
  // A job changed between the read and the commit (it is being written right now): the others
  // go one by one, and that one waits for the next scan.
  for (const store::WriteBatch& write : writes) {
    const Status one = options_.store.Commit(write);
    if (one.ok()) {
      ++done;
    } else if (one.code() == StatusCode::kAborted || one.code() == StatusCode::kNotFound) {
      ++result.skipped;
    } else {
      return one;
    }
  }
  return Status::Ok();
}

}  // namespace gpufleet::control
