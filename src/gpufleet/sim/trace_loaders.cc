// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/trace_loaders.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/core/resources.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/sim/csv.h"
#include "gpufleet/sim/openb.h"
#include "gpufleet/sim/slurm_history.h"

namespace gpufleet::sim {
namespace {

constexpr int64_t kMaxGpus = 1'000'000;
constexpr int64_t kMaxTasks = 1'000'000;
constexpr double kMaxSeconds = 1e12;  // ~31,700 years: guards the conversion to int64_t

// Run time of each configuration of the Pollux and Sia workloads, alone on Pollux's testbed
// (nodes of 4 T4 GPUs): data/pollux/derive_durations.py over the adaptdl osdi21-artifact
// profiles and every workload CSV of philly-pollux and sia-workloads.
struct PolluxConfig {
  std::string_view application;
  int num_replicas;
  int batch_size;
  int64_t seconds;
};
constexpr std::array<PolluxConfig, 48> kPolluxDurations = {{
    {"bert", 1, 12, 13614},        {"bert", 4, 48, 3572},          {"bert", 6, 384, 3056},
    {"bert", 8, 384, 2480},        {"bert", 10, 384, 1835},        {"bert", 12, 384, 1589},
    {"bert", 14, 384, 1537},       {"bert", 16, 384, 1335},        {"cifar10", 1, 128, 4028},
    {"cifar10", 4, 512, 1165},     {"cifar10", 4, 2048, 1254},     {"cifar10", 6, 2048, 854},
    {"cifar10", 8, 1024, 1318},    {"cifar10", 8, 2048, 826},      {"cifar10", 8, 4096, 904},
    {"cifar10", 10, 4096, 701},    {"cifar10", 12, 4096, 573},     {"cifar10", 16, 4096, 449},
    {"deepspeech2", 1, 20, 19439}, {"deepspeech2", 2, 80, 9823},   {"deepspeech2", 4, 80, 6376},
    {"deepspeech2", 4, 160, 4982}, {"deepspeech2", 6, 320, 4153},  {"deepspeech2", 8, 160, 6140},
    {"deepspeech2", 8, 320, 3501}, {"deepspeech2", 12, 640, 2573}, {"imagenet", 8, 1600, 79621},
    {"imagenet", 10, 1600, 62077}, {"imagenet", 12, 3200, 57479},  {"imagenet", 14, 3200, 50228},
    {"imagenet", 16, 3200, 44072}, {"imagenet", 24, 3200, 31396},  {"imagenet", 32, 6400, 26207},
    {"imagenet", 48, 6400, 18880}, {"ncf", 1, 256, 1444},          {"ncf", 1, 32768, 33},
    {"ncf", 2, 512, 938},          {"ncf", 4, 1024, 587},          {"ncf", 8, 2048, 927},
    {"yolov3", 1, 8, 33738},       {"yolov3", 2, 16, 18869},       {"yolov3", 4, 32, 13740},
    {"yolov3", 4, 64, 12870},      {"yolov3", 8, 64, 23860},       {"yolov3", 10, 512, 9762},
    {"yolov3", 12, 256, 9315},     {"yolov3", 14, 512, 7671},      {"yolov3", 16, 128, 9592},
}};

// Steps per second of each Gavel job type: total_steps / Philly duration over the 1,803 jobs of
// Gavel's msr/seed=0 traces that match one philly.csv job of the same virtual cluster by arrival
// offset and GPU count (data/gavel/derive_rates.py). Independent of scale_factor.
struct GavelRate {
  std::string_view job_type;
  double steps_per_second;
};
constexpr std::array<GavelRate, 26> kGavelRates = {{
    {"A3C", 8.233016},
    {"CycleGAN", 4.918489},
    {"LM (batch size 5)", 167.122849},
    {"LM (batch size 10)", 143.360502},
    {"LM (batch size 20)", 107.950858},
    {"LM (batch size 40)", 71.723030},
    {"LM (batch size 80)", 43.903603},
    {"Recommendation (batch size 512)", 0.331468},
    {"Recommendation (batch size 1024)", 0.479963},
    {"Recommendation (batch size 2048)", 0.567520},
    {"Recommendation (batch size 4096)", 0.624391},
    {"Recommendation (batch size 8192)", 0.602348},
    {"ResNet-18 (batch size 16)", 77.317359},
    {"ResNet-18 (batch size 32)", 65.805397},
    {"ResNet-18 (batch size 64)", 48.884208},
    {"ResNet-18 (batch size 128)", 30.287494},
    {"ResNet-18 (batch size 256)", 16.987360},
    {"ResNet-50 (batch size 16)", 17.374383},
    {"ResNet-50 (batch size 32)", 9.920575},
    {"ResNet-50 (batch size 64)", 5.457584},
    {"ResNet-50 (batch size 128)", 2.845972},
    {"Transformer (batch size 16)", 12.845645},
    {"Transformer (batch size 32)", 12.475266},
    {"Transformer (batch size 64)", 9.568013},
    {"Transformer (batch size 128)", 5.771204},
    {"Transformer (batch size 256)", 1.707021},
}};

// The 7 fields of a line of a Gavel trace, by position.
std::vector<std::string> GavelColumns() {
  return {"job_type",    "command",      "num_steps_arg", "needs_data_dir",
          "total_steps", "arrival_time", "scale_factor"};
}

// Opens `path` and reads it with `read`, naming the file in every error.
Result<Trace> LoadWith(const std::string& path, const GpuCatalog& catalog,
                       Result<Trace> (*read)(std::istream&, const std::string&,
                                             const GpuCatalog&)) {
  GPUFLEET_ASSIGN_OR_RETURN(std::ifstream in, OpenInputFile(path));
  return read(in, path, catalog);
}

// CsvReader reports an empty file without a line number; this one names line 1.
Status CheckNotEmpty(std::istream& in, const std::string& source, std::string_view expected) {
  if (in.peek() == std::char_traits<char>::eof()) {
    return InvalidArgumentError(fmt::format("{}:1: empty file, expected {}", source, expected));
  }
  return Status::Ok();
}

// An integer in [min, max]; the error names the place, the column and the value.
template <typename Row>
Result<int64_t> IntField(const Row& row, int column, int64_t min, int64_t max) {
  const std::string& text = row.Field(column);
  const std::optional<int64_t> value = ToInt64(text);
  if (!value) {
    return InvalidArgumentError(
        fmt::format("{}: \"{}\" is not an integer", row.Where(column), text));
  }
  if (*value < min || *value > max) {
    return InvalidArgumentError(
        fmt::format("{}: {} (must be {}..{})", row.Where(column), *value, min, max));
  }
  return *value;
}

// Seconds as a decimal number, rounded to the nearest second. A duration must be at least 1 s
// after rounding, a time at least 0.
template <typename Row>
Result<int64_t> SecondsField(const Row& row, int column, bool is_duration) {
  const std::string& text = row.Field(column);
  const std::optional<double> value = ToFiniteDouble(text);
  if (!value) {
    return InvalidArgumentError(
        fmt::format("{}: \"{}\" is not a number of seconds", row.Where(column), text));
  }
  if (std::fabs(*value) > kMaxSeconds) {
    return InvalidArgumentError(fmt::format("{}: {} s is out of range (at most {:.0f})",
                                            row.Where(column), text, kMaxSeconds));
  }
  const int64_t seconds = std::llround(*value);
  if (is_duration && seconds <= 0) {
    return InvalidArgumentError(
        fmt::format("{}: duration {} s (must be positive, at least 1 s)", row.Where(column), text));
  }
  if (!is_duration && *value < 0) {
    return InvalidArgumentError(
        fmt::format("{}: time {} s (must not be negative)", row.Where(column), text));
  }
  return seconds;
}

template <typename Row>
Result<int64_t> TimeField(const Row& row, int column, char separator) {
  const std::string& text = row.Field(column);
  const std::optional<int64_t> value = ParseIsoDateTime(text, separator);
  if (!value) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is not a time YYYY-MM-DD{}HH:MM:SS",
                                            row.Where(column), text, separator));
  }
  return *value;
}

// A job of one task group: `tasks` tasks asking for `gpus` each.
TraceJob MakeJob(std::string id, int64_t submit, int64_t duration, int tasks, GpuRequest gpus,
                 std::string queue, std::string user) {
  TraceJob trace_job;
  Job& job = trace_job.job;
  job.id = JobId(std::move(id));
  TaskGroup group;
  group.name = "tasks";
  group.replicas = tasks;
  group.request.gpus = std::move(gpus);
  job.groups.push_back(std::move(group));
  job.queue = QueueId(queue.empty() ? "default" : std::move(queue));
  job.runtime_estimate = std::chrono::seconds(duration);
  trace_job.submit_seconds = submit;
  trace_job.duration_seconds = duration;
  trace_job.user = std::move(user);
  return trace_job;
}

TraceJob MakeWholeGpuJob(std::string id, int64_t submit, int64_t duration, int gpus,
                         std::string queue, std::string user) {
  const TaskSplit split = SplitGpus(gpus);
  return MakeJob(std::move(id), submit, duration, split.tasks, WholeGpus{split.gpus_per_task},
                 std::move(queue), std::move(user));
}

// Checks what the row produced; the error names the file and line.
Status CheckJob(const TraceJob& job, const GpuCatalog& catalog, const std::string& source,
                int line) {
  const Status status = job.job.Validate(catalog);
  if (!status.ok()) {
    return InvalidArgumentError(fmt::format("{}:{}: {}", source, line, status.message()));
  }
  return Status::Ok();
}

template <typename Row>
Status CheckUniqueId(std::set<std::string, std::less<>>& seen, const Row& row, int column) {
  const std::string& id = row.Field(column);
  if (id.empty()) {
    return InvalidArgumentError(row.Where(column) + ": empty job id");
  }
  if (!seen.insert(id).second) {
    return InvalidArgumentError(fmt::format("{}: duplicate job id \"{}\"", row.Where(column), id));
  }
  return Status::Ok();
}

// Sorts stably by submit time and rebases the first arrival to 0.
Result<Trace> FinishTrace(const std::string& source, std::vector<TraceJob> jobs, int last_line,
                          std::string_view why_empty) {
  if (jobs.empty()) {
    return InvalidArgumentError(
        fmt::format("{}:{}: no jobs in the file{}", source, std::max(last_line, 1), why_empty));
  }
  // Sorting (submit, file position) keys and moving each job once is stable, and much cheaper
  // than sorting the jobs themselves.
  std::vector<std::pair<int64_t, size_t>> order;
  order.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    order.emplace_back(jobs[i].submit_seconds, i);
  }
  std::sort(order.begin(), order.end());
  const int64_t base = order.front().first;
  Trace trace;
  trace.source = source;
  trace.jobs.reserve(jobs.size());
  for (const auto& [submit, index] : order) {
    trace.jobs.push_back(std::move(jobs[index]));
    trace.jobs.back().submit_seconds = submit - base;
  }
  return trace;
}

std::string FileStem(const std::string& source) {
  const std::string stem = std::filesystem::path(source).stem().string();
  return stem.empty() ? std::string("gavel") : stem;
}

// The known configurations of one Pollux application, "1x128, 4x512" (replicas x batch size).
std::string PolluxConfigs(std::string_view application) {
  std::string known;
  for (const PolluxConfig& config : kPolluxDurations) {
    if (config.application == application) {
      known +=
          fmt::format("{}{}x{}", known.empty() ? "" : ", ", config.num_replicas, config.batch_size);
    }
  }
  return known;
}

}  // namespace

TaskSplit SplitGpus(int gpus) {
  for (int per_task = std::min(gpus, kTraceGpusPerNode); per_task > 1; --per_task) {
    if (gpus % per_task == 0) {
      return TaskSplit{gpus / per_task, per_task};
    }
  }
  return TaskSplit{std::max(gpus, 1), 1};
}

std::optional<int64_t> PolluxDurationSeconds(std::string_view application, int num_replicas,
                                             int batch_size) {
  for (const PolluxConfig& config : kPolluxDurations) {
    if (config.application == application && config.num_replicas == num_replicas &&
        config.batch_size == batch_size) {
      return config.seconds;
    }
  }
  return std::nullopt;
}

std::optional<double> GavelStepsPerSecond(std::string_view job_type) {
  for (const GavelRate& rate : kGavelRates) {
    if (rate.job_type == job_type) {
      return rate.steps_per_second;
    }
  }
  return std::nullopt;
}

Result<Trace> ReadPhilly(std::istream& in, const std::string& source, const GpuCatalog& catalog) {
  GPUFLEET_RETURN_IF_ERROR(CheckNotEmpty(in, source, "a header row"));
  CsvReader csv(in, source);
  GPUFLEET_RETURN_IF_ERROR(csv.Open());
  GPUFLEET_ASSIGN_OR_RETURN(const int timestamp, csv.Column("timestamp"));
  GPUFLEET_ASSIGN_OR_RETURN(const int duration, csv.Column("duration"));
  GPUFLEET_ASSIGN_OR_RETURN(const int num_gpus, csv.Column("num_gpus"));
  GPUFLEET_ASSIGN_OR_RETURN(const int cluster, csv.Column("cluster"));
  std::vector<TraceJob> jobs;
  while (true) {
    GPUFLEET_ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) {
      break;
    }
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t submit, TimeField(csv, timestamp, ' '));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t seconds, SecondsField(csv, duration, true));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t gpus, IntField(csv, num_gpus, 1, kMaxGpus));
    jobs.push_back(MakeWholeGpuJob(fmt::format("philly-{}", jobs.size() + 1), submit, seconds,
                                   static_cast<int>(gpus), csv.Field(cluster), ""));
    GPUFLEET_RETURN_IF_ERROR(CheckJob(jobs.back(), catalog, source, csv.line()));
  }
  return FinishTrace(source, std::move(jobs), csv.line(), "");
}

Result<Trace> LoadPhilly(const std::string& path, const GpuCatalog& catalog) {
  return LoadWith(path, catalog, ReadPhilly);
}

Result<Trace> ReadGavel(std::istream& in, const std::string& source, const GpuCatalog& catalog) {
  GPUFLEET_RETURN_IF_ERROR(CheckNotEmpty(in, source, "one job per line"));
  DelimitedReader tsv(in, source, '\t', GavelColumns());
  GPUFLEET_RETURN_IF_ERROR(tsv.Open());
  const int job_type = 0;
  const int total_steps = 4;
  const int arrival_time = 5;
  const int scale_factor = 6;
  const std::string stem = FileStem(source);
  std::vector<TraceJob> jobs;
  while (true) {
    GPUFLEET_ASSIGN_OR_RETURN(const bool more, tsv.Next());
    if (!more) {
      break;
    }
    const std::optional<double> rate = GavelStepsPerSecond(tsv.Field(job_type));
    if (!rate) {
      std::string known;
      for (const GavelRate& entry : kGavelRates) {
        known += fmt::format("{}{}", known.empty() ? "" : ", ", entry.job_type);
      }
      return InvalidArgumentError(fmt::format("{}: unknown job type \"{}\" (known: {})",
                                              tsv.Where(job_type), tsv.Field(job_type), known));
    }
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t steps,
                              IntField(tsv, total_steps, 0, std::numeric_limits<int64_t>::max()));
    const double seconds = static_cast<double>(steps) / *rate;
    if (seconds > kMaxSeconds || std::llround(seconds) <= 0) {
      return InvalidArgumentError(
          fmt::format("{}: {} steps of \"{}\" at {} steps/s give a duration of {:.3f} s (must be "
                      "positive, at least 1 s)",
                      tsv.Where(total_steps), steps, tsv.Field(job_type), *rate, seconds));
    }
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t submit, SecondsField(tsv, arrival_time, false));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t gpus, IntField(tsv, scale_factor, 1, kMaxGpus));
    jobs.push_back(MakeWholeGpuJob(fmt::format("{}-{}", stem, jobs.size() + 1), submit,
                                   std::llround(seconds), static_cast<int>(gpus), stem, ""));
    GPUFLEET_RETURN_IF_ERROR(CheckJob(jobs.back(), catalog, source, tsv.line()));
  }
  return FinishTrace(source, std::move(jobs), tsv.line(), "");
}

Result<Trace> LoadGavel(const std::string& path, const GpuCatalog& catalog) {
  return LoadWith(path, catalog, ReadGavel);
}

Result<Trace> ReadPollux(std::istream& in, const std::string& source, const GpuCatalog& catalog) {
  GPUFLEET_RETURN_IF_ERROR(CheckNotEmpty(in, source, "a header row"));
  CsvReader csv(in, source);
  GPUFLEET_RETURN_IF_ERROR(csv.Open());
  GPUFLEET_ASSIGN_OR_RETURN(const int name, csv.Column("name"));
  GPUFLEET_ASSIGN_OR_RETURN(const int time, csv.Column("time"));
  GPUFLEET_ASSIGN_OR_RETURN(const int application, csv.Column("application"));
  GPUFLEET_ASSIGN_OR_RETURN(const int num_replicas, csv.Column("num_replicas"));
  GPUFLEET_ASSIGN_OR_RETURN(const int batch_size, csv.Column("batch_size"));
  std::vector<TraceJob> jobs;
  std::set<std::string, std::less<>> ids;
  while (true) {
    GPUFLEET_ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) {
      break;
    }
    GPUFLEET_RETURN_IF_ERROR(CheckUniqueId(ids, csv, name));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t submit, SecondsField(csv, time, false));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t replicas, IntField(csv, num_replicas, 1, kMaxGpus));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t batch, IntField(csv, batch_size, 1, 1'000'000'000));
    const std::string& app = csv.Field(application);
    const std::string configs = PolluxConfigs(app);
    if (configs.empty()) {
      return InvalidArgumentError(fmt::format(
          "{}: unknown application \"{}\" (known: bert, cifar10, deepspeech2, imagenet, ncf, "
          "yolov3)",
          csv.Where(application), app));
    }
    const std::optional<int64_t> seconds =
        PolluxDurationSeconds(app, static_cast<int>(replicas), static_cast<int>(batch));
    if (!seconds) {
      return InvalidArgumentError(fmt::format(
          "{}: no duration for {} with num_replicas {} and batch_size {} (known replicas x batch "
          "size: {})",
          csv.Where(application), app, replicas, batch, configs));
    }
    jobs.push_back(
        MakeWholeGpuJob(csv.Field(name), submit, *seconds, static_cast<int>(replicas), "", ""));
    GPUFLEET_RETURN_IF_ERROR(CheckJob(jobs.back(), catalog, source, csv.line()));
  }
  return FinishTrace(source, std::move(jobs), csv.line(), "");
}

Result<Trace> LoadPollux(const std::string& path, const GpuCatalog& catalog) {
  return LoadWith(path, catalog, ReadPollux);
}

Result<Trace> ReadNative(std::istream& in, const std::string& source, const GpuCatalog& catalog) {
  GPUFLEET_RETURN_IF_ERROR(CheckNotEmpty(in, source, "a header row"));
  CsvReader csv(in, source);
  GPUFLEET_RETURN_IF_ERROR(csv.Open());
  const int id = csv.HasColumn("id") ? csv.Column("id").value() : -1;
  GPUFLEET_ASSIGN_OR_RETURN(const int submit_time, csv.Column("submit_time"));
  GPUFLEET_ASSIGN_OR_RETURN(const int duration, csv.Column("duration"));
  GPUFLEET_ASSIGN_OR_RETURN(const int tasks, csv.Column("tasks"));
  GPUFLEET_ASSIGN_OR_RETURN(const int gpus_per_task, csv.Column("gpus_per_task"));
  GPUFLEET_ASSIGN_OR_RETURN(const int gpu_milli, csv.Column("gpu_milli"));
  GPUFLEET_ASSIGN_OR_RETURN(const int allowed_models, csv.Column("allowed_models"));
  GPUFLEET_ASSIGN_OR_RETURN(const int queue, csv.Column("queue"));
  GPUFLEET_ASSIGN_OR_RETURN(const int priority, csv.Column("priority"));
  GPUFLEET_ASSIGN_OR_RETURN(const int kind, csv.Column("kind"));
  GPUFLEET_ASSIGN_OR_RETURN(const int user, csv.Column("user"));
  const int communication =
      csv.HasColumn("communication_fraction") ? csv.Column("communication_fraction").value() : -1;
  std::vector<TraceJob> jobs;
  std::set<std::string, std::less<>> ids;
  while (true) {
    GPUFLEET_ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) {
      break;
    }
    if (id >= 0) {
      GPUFLEET_RETURN_IF_ERROR(CheckUniqueId(ids, csv, id));
    }
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t submit, SecondsField(csv, submit_time, false));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t seconds, SecondsField(csv, duration, true));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t task_count, IntField(csv, tasks, 1, kMaxTasks));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t gpus, IntField(csv, gpus_per_task, 0, kMaxGpus));
    GpuRequest request = NoGpu{};
    if (gpus == 0) {
      const std::string& milli_text = csv.Field(gpu_milli);
      if (!milli_text.empty() && milli_text != "0") {
        return InvalidArgumentError(
            fmt::format("{}: \"{}\" for a task without GPUs (gpus_per_task is 0; leave it empty)",
                        csv.Where(gpu_milli), milli_text));
      }
    } else {
      GPUFLEET_ASSIGN_OR_RETURN(const int64_t milli, IntField(csv, gpu_milli, 1, kMilliPerUnit));
      if (milli < kMilliPerUnit && gpus > 1) {
        return InvalidArgumentError(
            fmt::format("{}: {} milli-GPU on each of {} GPUs (a share is for one GPU only: set "
                        "gpus_per_task to 1)",
                        csv.Where(gpu_milli), milli, gpus));
      }
      if (milli < kMilliPerUnit) {
        request = FractionalGpu{milli, 0};
      } else {
        request = WholeGpus{static_cast<int>(gpus)};
      }
    }
    int job_priority = 0;
    if (!csv.Field(priority).empty()) {
      GPUFLEET_ASSIGN_OR_RETURN(const int64_t value,
                                IntField(csv, priority, std::numeric_limits<int>::min(),
                                         std::numeric_limits<int>::max()));
      job_priority = static_cast<int>(value);
    }
    JobKind job_kind = JobKind::kBatch;
    const std::string& kind_text = csv.Field(kind);
    if (kind_text == "interactive") {
      job_kind = JobKind::kInteractive;
    } else if (kind_text == "inference") {
      job_kind = JobKind::kInference;
    } else if (!kind_text.empty() && kind_text != "batch") {
      return InvalidArgumentError(
          fmt::format("{}: unknown kind \"{}\" (known: batch, interactive, inference)",
                      csv.Where(kind), kind_text));
    }
    std::vector<std::string> models;
    const std::string& models_text = csv.Field(allowed_models);
    size_t begin = 0;
    while (begin < models_text.size()) {
      const size_t end = std::min(models_text.find('|', begin), models_text.size());
      const std::string model = models_text.substr(begin, end - begin);
      begin = end + 1;
      if (model.empty()) {
        continue;
      }
      auto info = catalog.Find(model);
      if (!info.ok()) {
        return InvalidArgumentError(
            fmt::format("{}: {}", csv.Where(allowed_models), info.status().message()));
      }
      if (std::find(models.begin(), models.end(), (*info)->name) == models.end()) {
        models.push_back((*info)->name);
      }
    }
    TraceJob job =
        MakeJob(id >= 0 ? csv.Field(id) : fmt::format("job-{}", jobs.size() + 1), submit, seconds,
                static_cast<int>(task_count), request, csv.Field(queue), csv.Field(user));
    job.job.priority = job_priority;
    job.job.kind = job_kind;
    job.job.allowed_gpu_models = std::move(models);
    if (communication >= 0 && !csv.Field(communication).empty()) {
      const std::optional<double> fraction = ToFiniteDouble(csv.Field(communication));
      if (!fraction || *fraction < 0 || *fraction > 1) {
        return InvalidArgumentError(fmt::format("{}: \"{}\" is not a fraction in [0, 1]",
                                                csv.Where(communication),
                                                csv.Field(communication)));
      }
      job.communication_fraction = *fraction;
    }
    jobs.push_back(std::move(job));
    GPUFLEET_RETURN_IF_ERROR(CheckJob(jobs.back(), catalog, source, csv.line()));
  }
  return FinishTrace(source, std::move(jobs), csv.line(), "");
}

Result<Trace> LoadNative(const std::string& path, const GpuCatalog& catalog) {
  return LoadWith(path, catalog, ReadNative);
}

Result<Trace> ReadSacct(std::istream& in, const std::string& source, GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(SacctHistory history,
                            ReadSacctHistory(in, source, SacctOptions{}, catalog));
  return std::move(history.trace);
}

Result<Trace> LoadSacct(const std::string& path, GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(std::ifstream in, OpenInputFile(path));
  return ReadSacct(in, path, catalog);
}

Result<Trace> ReadOpenbTrace(std::istream& in, const std::string& source, GpuCatalog& catalog) {
  // Two passes over the text: the pod loader makes the jobs, this one reads their times.
  std::ostringstream text;
  text << in.rdbuf();
  std::istringstream pods_in(text.str());
  GPUFLEET_ASSIGN_OR_RETURN(std::vector<Job> pods, ReadOpenbPods(pods_in, source, catalog));
  std::istringstream times_in(text.str());
  CsvReader csv(times_in, source);
  GPUFLEET_RETURN_IF_ERROR(csv.Open());
  GPUFLEET_ASSIGN_OR_RETURN(const int creation, csv.Column("creation_time"));
  GPUFLEET_ASSIGN_OR_RETURN(const int deletion, csv.Column("deletion_time"));
  GPUFLEET_ASSIGN_OR_RETURN(const int scheduled, csv.Column("scheduled_time"));
  std::vector<TraceJob> jobs;
  for (Job& pod : pods) {
    GPUFLEET_ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) {
      return InternalError(fmt::format("{}: fewer rows on the second pass", source));
    }
    if (csv.Field(scheduled).empty()) {
      continue;  // never started in the trace: there is no run time to replay
    }
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t created, csv.Int(creation));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t started, csv.Int(scheduled));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t deleted, csv.Int(deletion));
    if (deleted <= started) {
      return InvalidArgumentError(fmt::format("{}: {} is not after scheduled_time {}",
                                              csv.Where(deletion), deleted, started));
    }
    TraceJob job;
    job.job = std::move(pod);
    job.job.runtime_estimate = std::chrono::seconds(deleted - started);
    job.submit_seconds = created;
    job.duration_seconds = deleted - started;
    jobs.push_back(std::move(job));
  }
  return FinishTrace(source, std::move(jobs), csv.line(), " that ever started (scheduled_time)");
}

Result<Trace> LoadOpenbTrace(const std::string& path, GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(std::ifstream in, OpenInputFile(path));
  return ReadOpenbTrace(in, path, catalog);
}

const std::vector<std::string>& TraceFormatNames() {
  static const std::vector<std::string> kNames = {"philly", "openb", "native",
                                                  "sacct",  "gavel", "pollux"};
  return kNames;
}

Result<Trace> LoadTrace(const std::string& path, std::string_view format, GpuCatalog& catalog) {
  if (format == "philly") {
    return LoadPhilly(path, catalog);
  }
  if (format == "native") {
    return LoadNative(path, catalog);
  }
  if (format == "sacct") {
    return LoadSacct(path, catalog);
  }
  if (format == "gavel") {
    return LoadGavel(path, catalog);
  }
  if (format == "pollux") {
    return LoadPollux(path, catalog);
  }
  if (format == "openb") {
    return LoadOpenbTrace(path, catalog);
  }
  return InvalidArgumentError(fmt::format("{}: unknown trace format \"{}\" (formats: {})", path,
                                          format, fmt::join(TraceFormatNames(), ", ")));
}

}  // namespace gpufleet::sim
