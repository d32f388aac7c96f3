// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/interactive_mix.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/testing/trace_jobs.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::sim::testing::MakeTraceJob;

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kHour = 3600;

TraceJob Notebook(const std::string& id, int64_t submit, int64_t duration, int gpus) {
  TraceJob job = MakeTraceJob(id, submit, duration, gpus);
  job.job.kind = JobKind::kInteractive;
  return job;
}

Cluster Gpus(int nodes, const GpuCatalog& catalog) {
  return MakeSyntheticCluster({1, 1, nodes, 8, "V100-32GB"}, catalog).value();
}

const ReplayJobOutcome& OutcomeOf(const ReplayResult& result, const std::string& id) {
  for (const ReplayJobOutcome& job : result.jobs) {
    if (job.id == id) {
      return job;
    }
  }
  ADD_FAILURE() << "no job " << id;
  return result.jobs.front();
}

ReplayOptions WithActivity(double busy_fraction) {
  ReplayOptions options;
  options.sample_seconds = 300;
  options.interactive_activity = InteractiveActivity{busy_fraction, 10 * 60};
  return options;
}

policy::IdleReclaimOptions QuickReclaim() {
  policy::IdleReclaimOptions reclaim;
  reclaim.idle_seconds = 10 * 60;
  reclaim.warning_seconds = 5 * 60;
  return reclaim;
}

void ExpectBusyWithinAllocated(const ReplayResult& result) {
  EXPECT_LE(result.busy_gpu_seconds, result.allocated_gpu_seconds + 1e-6);
  for (const ReplaySample& sample : result.series) {
    EXPECT_LE(sample.gpus_busy, sample.gpus_allocated) << "at " << sample.time_seconds;
  }
}

TEST(InteractiveActivity, NotebooksAreBusyTheConfiguredShareOfTheirSessions) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Trace trace;
  for (int i = 0; i < 100; ++i) {
    trace.jobs.push_back(Notebook("nb" + std::to_string(i), 0, 8 * kHour, 1));
  }
  for (double busy_fraction : {0.15, 0.4}) {
    SCOPED_TRACE(busy_fraction);
    auto result = RunReplay(Gpus(16, catalog), trace, catalog, WithActivity(busy_fraction));
    ASSERT_OK(result);
    EXPECT_EQ(result->jobs_finished, 100);
    EXPECT_DOUBLE_EQ(result->allocated_gpu_seconds, 100.0 * 8 * kHour);
    EXPECT_NEAR(result->busy_gpu_seconds / result->allocated_gpu_seconds, busy_fraction, 0.02);
    ExpectBusyWithinAllocated(*result);
    // The time series sees the same share.
    double allocated = 0;
    double busy = 0;
    for (const ReplaySample& sample : result->series) {
      allocated += sample.gpus_allocated;
      busy += sample.gpus_busy;
    }
    EXPECT_NEAR(busy / allocated, busy_fraction, 0.03);
  }
}

TEST(InteractiveActivity, WithoutReclaimTheScheduleIsUnchanged) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Trace trace;
  trace.jobs = {MakeTraceJob("a", 0, 2 * kHour, 8), Notebook("nb", 10, 3 * kHour, 4),
                MakeTraceJob("b", 20, kHour, 8), MakeTraceJob("c", 30, kHour, 4)};
  ReplayOptions plain;
  plain.sample_seconds = 300;
  auto before = RunReplay(Gpus(2, catalog), trace, catalog, plain);
  auto after = RunReplay(Gpus(2, catalog), trace, catalog, WithActivity(0.15));
  ASSERT_OK(before);
  ASSERT_OK(after);
  for (const ReplayJobOutcome& job : before->jobs) {
    EXPECT_EQ(OutcomeOf(*after, job.id).first_start_seconds, job.first_start_seconds) << job.id;
    EXPECT_EQ(OutcomeOf(*after, job.id).end_seconds, job.end_seconds) << job.id;
  }
  // Without the model a notebook counts as busy throughout.
  EXPECT_DOUBLE_EQ(before->busy_gpu_seconds, before->allocated_gpu_seconds);
  EXPECT_LT(after->busy_gpu_seconds, after->allocated_gpu_seconds);
  EXPECT_EQ(after->interactive.reclaims, 0);
}

// Node 1 held by a long batch job, 7 GPUs of node 2 by another, the last one by a notebook that
// is rarely busy; a 1-GPU job waits behind them.
Trace OneNotebookInAFullCluster() {
  Trace trace;
  trace.jobs = {MakeTraceJob("hold-a", 0, 20 * kHour, 8), MakeTraceJob("hold-b", 0, 20 * kHour, 7),
                Notebook("nb", 0, 6 * kHour, 1), MakeTraceJob("waiter", 60, kHour, 1)};
  return trace;
}

TEST(IdleReclaim, AReclaimedNotebookComesBackAndFinishesItsSession) {
  const GpuCatalog catalog = GpuCatalog::Default();
  for (policy::ReclaimAction action :
       {policy::ReclaimAction::kSuspend, policy::ReclaimAction::kPreempt}) {
    SCOPED_TRACE(policy::ReclaimActionName(action));
    ReplayOptions options = WithActivity(0.05);
    options.idle_reclaim = QuickReclaim();
    options.idle_reclaim->action = action;
    auto result = RunReplay(Gpus(2, catalog), OneNotebookInAFullCluster(), catalog, options);
    ASSERT_OK(result);
    const ReplayJobOutcome& notebook = OutcomeOf(*result, "nb");
    const ReplayJobOutcome& waiter = OutcomeOf(*result, "waiter");
    EXPECT_EQ(result->jobs_finished, 4);
    EXPECT_GE(notebook.reclaims, 1);
    EXPECT_EQ(result->interactive.reclaims, notebook.reclaims);
    EXPECT_EQ(notebook.preemptions,
              action == policy::ReclaimAction::kPreempt ? notebook.reclaims : 0);
    // The waiting job got the notebook's GPU long before the holders ended.
    EXPECT_LT(waiter.first_start_seconds, notebook.end_seconds);
    EXPECT_LT(waiter.first_start_seconds, 20 * kHour);
    // The session lasts its length plus the waits on coming back, nothing lost.
    EXPECT_EQ(notebook.end_seconds - notebook.first_start_seconds,
              notebook.duration_seconds + notebook.resume_wait_seconds);
    EXPECT_EQ(result->interactive.resume_wait_seconds, notebook.resume_wait_seconds);
    EXPECT_EQ(result->interactive.finished, 1);
    EXPECT_GE(result->interactive.session_stretch.mean, 1.0);
    ExpectBusyWithinAllocated(*result);
  }
}

TEST(IdleReclaim, ANotebookBusyThroughoutIsNeverReclaimed) {
  const GpuCatalog catalog = GpuCatalog::Default();
  ReplayOptions options = WithActivity(1.0);
  options.idle_reclaim = QuickReclaim();
  auto result = RunReplay(Gpus(2, catalog), OneNotebookInAFullCluster(), catalog, options);
  ASSERT_OK(result);
  EXPECT_EQ(result->interactive.reclaims, 0);
  EXPECT_EQ(OutcomeOf(*result, "nb").end_seconds, 6 * kHour);
  EXPECT_EQ(OutcomeOf(*result, "waiter").first_start_seconds, 6 * kHour);
  EXPECT_DOUBLE_EQ(result->busy_gpu_seconds, result->allocated_gpu_seconds);
}

TEST(IdleReclaim, NothingIsReclaimedWhileNoWorkWaits) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Trace trace;
  trace.jobs = {MakeTraceJob("a", 0, 20 * kHour, 8), Notebook("nb1", 0, 6 * kHour, 1),
                Notebook("nb2", 100, 6 * kHour, 2), MakeTraceJob("b", 200, kHour, 4)};
  ReplayOptions options = WithActivity(0.05);
  options.idle_reclaim = QuickReclaim();
  auto result = RunReplay(Gpus(2, catalog), trace, catalog, options);
  ASSERT_OK(result);
  EXPECT_EQ(result->interactive.reclaims, 0);
  EXPECT_EQ(OutcomeOf(*result, "nb1").end_seconds, 6 * kHour);
  EXPECT_EQ(OutcomeOf(*result, "nb2").end_seconds, 100 + 6 * kHour);
}

TEST(IdleReclaim, BadReplayOptionsAreErrors) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const Trace trace = OneNotebookInAFullCluster();
  ReplayOptions no_model;
  no_model.idle_reclaim = QuickReclaim();
  EXPECT_THAT(RunReplay(Gpus(2, catalog), trace, catalog, no_model).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("needs interactive_activity")));
  ReplayOptions slow_checks = WithActivity(0.15);
  slow_checks.idle_reclaim = QuickReclaim();
  slow_checks.reclaim_check_seconds = 301;
  EXPECT_THAT(RunReplay(Gpus(2, catalog), trace, catalog, slow_checks).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("reclaim_check_seconds: 301")));
  ReplayOptions bad_reclaim = WithActivity(0.15);
  bad_reclaim.idle_reclaim = QuickReclaim();
  bad_reclaim.idle_reclaim->idle_seconds = 0;
  EXPECT_THAT(RunReplay(Gpus(2, catalog), trace, catalog, bad_reclaim).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("idle_seconds")));
  for (double busy_fraction : {0.0, -0.5, 1.5}) {
    EXPECT_THAT(RunReplay(Gpus(2, catalog), trace, catalog, WithActivity(busy_fraction)).status(),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("busy_fraction")));
  }
  ReplayOptions no_bursts = WithActivity(0.15);
  no_bursts.interactive_activity->mean_busy_seconds = 0;
  EXPECT_THAT(RunReplay(Gpus(2, catalog), trace, catalog, no_bursts).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("mean_busy_seconds: 0")));
}

TEST(InteractiveMix, BadOptionsNameTheField) {
  struct Case {
    const char* field;
    void (*change)(InteractiveMixOptions&);
  };
  const Case cases[] = {
      {"notebook_share: 0", [](InteractiveMixOptions& o) { o.notebook_share = 0; }},
      {"notebook_share: 1", [](InteractiveMixOptions& o) { o.notebook_share = 1; }},
      {"notebook_share: -0.2", [](InteractiveMixOptions& o) { o.notebook_share = -0.2; }},
      {"busy_fraction: 0", [](InteractiveMixOptions& o) { o.busy_fraction = 0; }},
      {"busy_fraction: 1.1", [](InteractiveMixOptions& o) { o.busy_fraction = 1.1; }},
      {"mean_busy_seconds: -1", [](InteractiveMixOptions& o) { o.mean_busy_seconds = -1; }},
      {"session length", [](InteractiveMixOptions& o) { o.min_session_seconds = 0; }},
      {"session length", [](InteractiveMixOptions& o) { o.max_session_seconds = 60; }},
      {"window_seconds: -5", [](InteractiveMixOptions& o) { o.window_seconds = -5; }},
      {"measure_from_seconds: 100",
       [](InteractiveMixOptions& o) {
         o.window_seconds = 100;
         o.measure_from_seconds = 100;
       }},
      {"measure_from_seconds: -1", [](InteractiveMixOptions& o) { o.measure_from_seconds = -1; }},
      {"runs: none", [](InteractiveMixOptions& o) { o.runs.clear(); }},
      {"run \"reclaim\": warning_seconds",
       [](InteractiveMixOptions& o) { o.runs[1].reclaim->warning_seconds = 0; }},
  };
  Trace batch;
  batch.jobs = {MakeTraceJob("a", 0, kHour, 8)};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    InteractiveMixOptions options;
    c.change(options);
    EXPECT_THAT(options.Validate(), StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.field)));
    EXPECT_THAT(AddNotebookSessions(batch, options).status(),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.field)));
  }
  EXPECT_OK(InteractiveMixOptions{}.Validate());
  EXPECT_THAT(AddNotebookSessions(Trace{}, InteractiveMixOptions{}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("no GPU-time")));
}

// Forty jobs of 1 to 8 GPUs, one every 10 min, 1 to 4 hours long: more than 16 GPUs can run.
Trace BusyBatch() {
  Trace trace;
  for (int i = 0; i < 40; ++i) {
    trace.jobs.push_back(MakeTraceJob("j" + std::to_string(i), i * 600,
                                      kHour + (i * 3733) % (3 * kHour), 1 << (i % 4)));
  }
  return trace;
}

TEST(InteractiveMix, NotebooksCarryTheirShareOfTheDemand) {
  InteractiveMixOptions options;
  options.notebook_share = 0.3;
  auto mix = AddNotebookSessions(BusyBatch(), options);
  ASSERT_OK(mix);
  double batch = 0;
  double notebooks = 0;
  int64_t last_submit = 0;
  for (const TraceJob& job : mix->jobs) {
    EXPECT_GE(job.submit_seconds, last_submit) << "not in submit order";
    last_submit = job.submit_seconds;
    const double gpu_seconds =
        static_cast<double>(job.job.RequestedGpuMilliTotal()) / 1000 * job.duration_seconds;
    if (job.job.kind == JobKind::kInteractive) {
      notebooks += gpu_seconds;
      EXPECT_GE(job.duration_seconds, options.min_session_seconds);
      EXPECT_LE(job.duration_seconds, options.max_session_seconds);
      EXPECT_LT(job.submit_seconds, BusyBatch().jobs.back().submit_seconds + 1);
    } else {
      batch += gpu_seconds;
    }
  }
  // At or just above the share: the last session overshoots by at most its own GPU-time.
  EXPECT_GE(notebooks / (batch + notebooks), 0.3);
  EXPECT_LT(notebooks / (batch + notebooks), 0.3 + 4.0 * 8 * kHour / (batch + notebooks));
}

TEST(InteractiveMix, ReclaimTurnsIdleNotebookGpusIntoBatchWork) {
  const GpuCatalog catalog = GpuCatalog::Default();
  InteractiveMixOptions options;
  options.notebook_share = 0.3;
  options.replay.sample_seconds = 300;
  options.runs = {{"off", std::nullopt}, {"reclaim", QuickReclaim()}};
  auto result = RunInteractiveMix(Gpus(2, catalog), BusyBatch(), catalog, options, 2);
  ASSERT_OK(result);
  ASSERT_EQ(result->runs.size(), 2U);
  const InteractiveMixRun& off = result->runs[0];
  const InteractiveMixRun& on = result->runs[1];
  EXPECT_EQ(result->batch_jobs, 40);
  EXPECT_GT(result->notebook_sessions, 0);
  EXPECT_EQ(off.notebooks.reclaims, 0);
  EXPECT_GT(on.notebooks.reclaims, 0);
  // Without a warm-up left out, the figures cover every session.
  EXPECT_EQ(on.notebooks.reclaims, on.replay.interactive.reclaims);
  EXPECT_EQ(on.notebooks.sessions, result->notebook_sessions);
  EXPECT_GT(on.BusyOfAllocated(), off.BusyOfAllocated());
  EXPECT_GT(on.mean_gpus_busy, off.mean_gpus_busy);
  EXPECT_LT(on.batch_queueing_delay.mean, off.batch_queueing_delay.mean);
  EXPECT_GT(on.notebooks.resume_wait_seconds, 0);
  for (const InteractiveMixRun& run : result->runs) {
    EXPECT_EQ(run.replay.jobs_finished, run.replay.jobs_total) << run.spec.name;
    EXPECT_LE(run.BusyOfAllocated(), 1.0);
    ExpectBusyWithinAllocated(run.replay);
  }

  // Same input, same bytes.
  std::ostringstream summary;
  std::ostringstream report;
  PrintInteractiveMixSummary(*result, summary);
  ASSERT_OK(WriteInteractiveMixReport(*result, "mix", report));
  auto again = RunInteractiveMix(Gpus(2, catalog), BusyBatch(), catalog, options, 1);
  ASSERT_OK(again);
  std::ostringstream summary_again;
  std::ostringstream report_again;
  PrintInteractiveMixSummary(*again, summary_again);
  ASSERT_OK(WriteInteractiveMixReport(*again, "mix", report_again));
  EXPECT_EQ(summary.str(), summary_again.str());
  EXPECT_EQ(report.str(), report_again.str());
  EXPECT_THAT(summary.str(), HasSubstr("busy/alloc"));
  EXPECT_THAT(report.str(), HasSubstr("<rect data-series=\"GPUs busy\""));
  EXPECT_THAT(report.str(), HasSubstr("CDF of a notebook session"));
}

TEST(InteractiveMix, TheWarmUpIsLeftOutOfTheFigures) {
  const GpuCatalog catalog = GpuCatalog::Default();
  InteractiveMixOptions options;
  options.notebook_share = 0.3;
  options.replay.sample_seconds = 300;
  options.measure_from_seconds = 3 * kHour;
  options.runs = {{"reclaim", QuickReclaim()}};
  auto result = RunInteractiveMix(Gpus(2, catalog), BusyBatch(), catalog, options, 1);
  ASSERT_OK(result);
  const InteractiveMixRun& run = result->runs.front();
  double allocated = 0;
  int samples = 0;
  for (const ReplaySample& sample : run.replay.series) {
    if (sample.time_seconds >= 3 * kHour && sample.time_seconds < result->options.window_seconds) {
      allocated += sample.gpus_allocated;
      ++samples;
    }
  }
  ASSERT_GT(samples, 0);
  EXPECT_DOUBLE_EQ(run.mean_gpus_allocated, allocated / samples);
  int later_sessions = 0;
  for (const ReplayJobOutcome& job : run.replay.jobs) {
    later_sessions += job.interactive && job.submit_seconds >= 3 * kHour ? 1 : 0;
  }
  EXPECT_EQ(run.notebooks.sessions, later_sessions);
  EXPECT_LT(run.notebooks.sessions, result->notebook_sessions);
}

TEST(InteractiveMix, ReportNeedsARun) {
  std::ostringstream out;
  EXPECT_THAT(WriteInteractiveMixReport(InteractiveMixResult{}, "t", out),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet::sim
