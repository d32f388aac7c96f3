// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/slurm_history.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/core/resources.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/fabric/hostlist.h"

namespace gpufleet::sim {
namespace {

constexpr int64_t kMaxGpusPerJob = 1'000'000;
constexpr int64_t kMaxNodes = 1'000'000;

std::string Lower(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower;
}

std::string Upper(std::string_view text) {
  std::string upper(text);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return upper;
}

// Memory of an AllocTRES "mem=" value ("16G", "4000M", "1.5T", "512K"; no suffix = M) in MiB.
std::optional<int64_t> ParseMemoryMib(std::string_view text) {
  double scale = 1;
  if (!text.empty() && std::string_view("KMGTP").find(text.back()) != std::string_view::npos) {
    switch (text.back()) {
      case 'K':
        scale = 1.0 / 1024;
        break;
      case 'G':
        scale = 1024;
        break;
      case 'T':
        scale = 1024.0 * 1024;
        break;
      case 'P':
        scale = 1024.0 * 1024 * 1024;
        break;
      default:
        break;
    }
    text.remove_suffix(1);
  }
  const std::optional<double> value = ToFiniteDouble(text);
  if (!value || *value < 0 || *value * scale > 1e15) {
    return std::nullopt;
  }
  return std::llround(*value * scale);
}

// Slurm job states (sacct(1), JOB STATE CODES) of jobs that ended, and of jobs that have not.
bool IsEndedState(std::string_view state) {
  static constexpr std::array<std::string_view, 9> kEnded = {
      "COMPLETED", "FAILED",        "TIMEOUT",  "CANCELLED", "NODE_FAIL",
      "PREEMPTED", "OUT_OF_MEMORY", "DEADLINE", "BOOT_FAIL"};
  return std::find(kEnded.begin(), kEnded.end(), state) != kEnded.end();
}
bool IsUnendedState(std::string_view state) {
  static constexpr std::array<std::string_view, 11> kUnended = {
      "PENDING",     "RUNNING",      "SUSPENDED",    "REQUEUED", "RESIZING", "REVOKED",
      "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED",  "SIGNALING"};
  return std::find(kUnended.begin(), kUnended.end(), state) != kUnended.end();
}

bool IsNoTime(std::string_view text) {
  return text.empty() || text == "Unknown" || text == "None";
}

// "[D-]HH:MM:SS", "MM:SS" or "MM" as seconds; 0 for UNLIMITED, Partition_Limit and empty;
// nullopt when malformed.
std::optional<int64_t> ParseSlurmDuration(std::string_view text) {
  if (text.empty() || text == "UNLIMITED" || text == "Partition_Limit" || text == "INVALID") {
    return 0;
  }
  int64_t days = 0;
  if (const size_t dash = text.find('-'); dash != std::string_view::npos) {
    const std::optional<int64_t> d = ToInt64(text.substr(0, dash));
    if (!d || *d < 0) {
      return std::nullopt;
    }
    days = *d;
    text.remove_prefix(dash + 1);
  }
  std::vector<int64_t> parts;
  size_t begin = 0;
  while (true) {
    const size_t colon = text.find(':', begin);
    const std::optional<int64_t> part =
        ToInt64(text.substr(begin, colon == std::string_view::npos ? colon : colon - begin));
    if (!part || *part < 0) {
      return std::nullopt;
    }
    parts.push_back(*part);
    if (colon == std::string_view::npos) {
      break;
    }
    begin = colon + 1;
  }
  int64_t seconds = 0;
  if (parts.size() == 3) {
    seconds = parts[0] * 3600 + parts[1] * 60 + parts[2];
  } else if (parts.size() == 2) {
    seconds = days > 0 ? parts[0] * 3600 + parts[1] * 60 : parts[0] * 60 + parts[1];
  } else if (parts.size() == 1) {
    seconds = days > 0 ? parts[0] * 3600 : parts[0] * 60;
  } else {
    return std::nullopt;
  }
  return days * 86400 + seconds;
}

// The model of a GPU type from the maps and the catalog; empty when none knows it.
std::string MapGpuType(std::string_view type,
                       const std::map<std::string, std::string, std::less<>>& gres_map,
                       const GpuCatalog& catalog) {
  if (const auto mapped = gres_map.find(type); mapped != gres_map.end()) {
    return mapped->second;
  }
  const std::map<std::string, std::string, std::less<>>& defaults = DefaultGresTypeModels();
  if (const auto known = defaults.find(Lower(type)); known != defaults.end()) {
    return known->second;
  }
  std::string canonical = catalog.Canonical(type);
  if (canonical.empty()) {
    canonical = catalog.Canonical(Upper(type));
  }
  return canonical;
}

// The peak of a running sum of (time, delta) events; ends before starts at the same time.
int64_t Peak(std::vector<std::pair<int64_t, int64_t>> events) {
  std::sort(events.begin(), events.end());
  int64_t level = 0;
  int64_t peak = 0;
  for (const auto& [time, delta] : events) {
    level += delta;
    peak = std::max(peak, level);
  }
  return peak;
}

// `group` (its NICs and links) narrowed to the one node `shape`, with its GPUs (all of the first
// model: a fabric node has one), CPUs and memory.
fabric::NodeGroupSpec ShapedGroup(const fabric::NodeGroupSpec& group, const SlurmNodeShape& shape) {
  fabric::NodeGroupSpec one = group;
  one.names = shape.name;
  one.gpus = static_cast<int>(shape.gpu_models.size());
  if (!shape.gpu_models.empty()) {
    one.gpu_model = shape.gpu_models.front();
  }
  one.cpu_milli = shape.cpu_milli;
  one.memory_mib = shape.memory_mib;
  return one;
}

}  // namespace

const std::map<std::string, std::string, std::less<>>& DefaultGresTypeModels() {
  static const auto* const kTable = new std::map<std::string, std::string, std::less<>>{
      {"a100", "A100-40GB"},
      {"a100_40g", "A100-40GB"},
      {"a100-40gb", "A100-40GB"},
      {"a100_40gb", "A100-40GB"},
      {"a100-sxm4-40gb", "A100-40GB"},
      {"a100_80g", "A100-80GB"},
      {"a100-80gb", "A100-80GB"},
      {"a100_80gb", "A100-80GB"},
      {"a100-sxm4-80gb", "A100-80GB"},
      {"a100l", "A100-80GB"},
      {"h100", "H100-80GB"},
      {"h100_80g", "H100-80GB"},
      {"h100-80gb", "H100-80GB"},
      {"h100_80gb", "H100-80GB"},
      {"h100-sxm5-80gb", "H100-80GB"},
      {"h200", "H200-141GB"},
      {"h200_141g", "H200-141GB"},
      {"gb200", "GB200"},
      {"l40s", "L40S"},
      {"a10", "A10"},
      {"t4", "T4"},
      {"v100", "V100-16GB"},
      {"v100_16g", "V100-16GB"},
      {"v100-16gb", "V100-16GB"},
      {"v100_32g", "V100-32GB"},
      {"v100-32gb", "V100-32GB"},
      {"v100s", "V100-32GB"},
      {"p100", "P100"},
  };
  return *kTable;
}

Result<std::map<std::string, std::string, std::less<>>> ParseGresMap(std::string_view text,
                                                                     const GpuCatalog& catalog) {
  std::map<std::string, std::string, std::less<>> map;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string_view entry = text.substr(begin, end - begin);
    begin = end + 1;
    if (entry.empty()) {
      continue;
    }
    const size_t equals = entry.find('=');
    if (equals == std::string_view::npos || equals == 0 || equals + 1 == entry.size()) {
      return InvalidArgumentError(
          fmt::format("--gres-map: \"{}\" is not TYPE=MODEL (e.g. a100=A100-80GB)", entry));
    }
    const std::string_view model = entry.substr(equals + 1);
    const std::string canonical = catalog.Canonical(model);
    if (canonical.empty()) {
      return InvalidArgumentError(
          fmt::format("--gres-map: \"{}\": {}", entry, catalog.Find(model).status().message()));
    }
    map[std::string(entry.substr(0, equals))] = canonical;
  }
  return map;
}

int64_t SacctJob::Gpus() const {
  int64_t gpus = 0;
  for (const Component& component : components) {
    gpus += component.gpus;
  }
  return gpus;
}

int SacctSkipCounts::Skipped() const {
  return steps + batch_extern + cpu_only + cancelled_before_start + not_started + not_ended +
         zero_length;
}

std::string SacctSkipCounts::ToString() const {
  std::vector<std::string> parts;
  auto add = [&parts](int count, std::string_view what) {
    if (count > 0) {
      parts.push_back(fmt::format("{} {}", count, what));
    }
  };
  add(steps, "job steps");
  add(batch_extern, ".batch/.extern steps");
  add(cpu_only, "CPU-only jobs");
  add(cancelled_before_start, "cancelled before start");
  add(not_started, "never started");
  add(not_ended, "not ended (pending, running, ...)");
  add(zero_length, "ran under a second");
  add(het_components_folded, "het-job components folded into their gang");
  add(array_tasks, "array tasks");
  return parts.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(parts, ", "));
}

SacctReader::SacctReader(std::istream& in, std::string source, SacctOptions options,
                         GpuCatalog& catalog)
    : reader_(in, std::move(source), '|'), options_(std::move(options)), catalog_(catalog) {}

Status SacctReader::Open() {
  GPUFLEET_RETURN_IF_ERROR(reader_.Open());
  for (auto [column, name] :
       {std::pair{&job_id_, "JobID"}, std::pair{&submit_, "Submit"}, std::pair{&start_, "Start"},
        std::pair{&end_, "End"}, std::pair{&state_, "State"}, std::pair{&nnodes_, "NNodes"},
        std::pair{&alloc_tres_, "AllocTRES"}}) {
    GPUFLEET_ASSIGN_OR_RETURN(*column, reader_.Column(name));
  }
  for (auto [column, name] :
       {std::pair{&partition_, "Partition"}, std::pair{&user_, "User"},
        std::pair{&eligible_, "Eligible"}, std::pair{&exit_code_, "ExitCode"},
        std::pair{&node_list_, "NodeList"}, std::pair{&time_limit_, "Timelimit"}}) {
    *column = reader_.HasColumn(name) ? reader_.Column(name).value() : -1;
  }
  return Status::Ok();
}

Result<std::string> SacctReader::GpuTypeModel(std::string_view type) {
  std::string model = MapGpuType(type, options_.gres_map, catalog_);
  if (!model.empty()) {
    return model;
  }
  // Unknown: a model of its own, so that its jobs and nodes still match each other.
  GPUFLEET_RETURN_IF_ERROR(catalog_.RegisterTraceModel(type, 0));
  registered_types_.emplace(type);
  return catalog_.Canonical(type).empty() ? std::string(type) : catalog_.Canonical(type);
}

Status SacctReader::ParseAllocTres(SacctJob::Component& component,
                                   std::vector<std::string>& types) {
  const std::string& text = reader_.Field(alloc_tres_);
  std::optional<int64_t> untyped_gpus;
  int64_t typed_gpus = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string_view entry = std::string_view(text).substr(begin, end - begin);
    begin = end + 1;
    const size_t equals = entry.find('=');
    if (equals == std::string_view::npos) {
      return InvalidArgumentError(fmt::format("{}: entry \"{}\" of \"{}\" is not key=value",
                                              reader_.Where(alloc_tres_), entry, text));
    }
    const std::string_view key = entry.substr(0, equals);
    const std::string_view value = entry.substr(equals + 1);
    const bool gpu = key == "gres/gpu" || key.starts_with("gres/gpu:");
    if (gpu || key == "cpu") {
      const std::optional<int64_t> count = ToInt64(value);
      if (!count || *count < 0 || *count > kMaxGpusPerJob * 1000) {
        return InvalidArgumentError(fmt::format("{}: \"{}\" in \"{}\" is not a count",
                                                reader_.Where(alloc_tres_), entry, text));
      }
      if (key == "cpu") {
        component.cpus = *count;
      } else if (key == "gres/gpu") {
        untyped_gpus = *count;
      } else {
        const std::string_view type = key.substr(std::string_view("gres/gpu:").size());
        GPUFLEET_ASSIGN_OR_RETURN(const std::string model, GpuTypeModel(type));
        typed_gpus += *count;
        if (*count > 0 && std::find(component.gpu_models.begin(), component.gpu_models.end(),
                                    model) == component.gpu_models.end()) {
          component.gpu_models.push_back(model);
          types.emplace_back(type);
        }
      }
    } else if (key == "mem") {
      const std::optional<int64_t> mib = ParseMemoryMib(value);
      if (!mib) {
        return InvalidArgumentError(fmt::format("{}: \"{}\" in \"{}\" is not a memory size",
                                                reader_.Where(alloc_tres_), entry, text));
      }
      component.memory_mib = *mib;
    }
  }
  component.gpus = untyped_gpus.value_or(typed_gpus);
  if (component.gpus > kMaxGpusPerJob) {
    return InvalidArgumentError(fmt::format("{}: {} GPUs in \"{}\" (at most {})",
                                            reader_.Where(alloc_tres_), component.gpus, text,
                                            kMaxGpusPerJob));
  }
  return Status::Ok();
}

Result<std::optional<SacctJob>> SacctReader::ReadRow() {
  const std::string& id = reader_.Field(job_id_);
  if (id.empty()) {
    return InvalidArgumentError(reader_.Where(job_id_) + ": empty job id");
  }
  if (const size_t dot = id.find('.'); dot != std::string::npos) {
    const std::string_view step = std::string_view(id).substr(dot + 1);
    if (step == "batch" || step == "extern" || step == "interactive") {
      ++skipped_.batch_extern;
    } else {
      ++skipped_.steps;
    }
    return std::optional<SacctJob>();
  }
  const std::string& state_text = reader_.Field(state_);
  const std::string state = state_text.substr(0, state_text.find(' '));  // "CANCELLED by 42"
  if (IsUnendedState(state)) {
    ++skipped_.not_ended;
    return std::optional<SacctJob>();
  }
  if (!IsEndedState(state)) {
    return InvalidArgumentError(fmt::format(
        "{}: unknown job state \"{}\" (known: COMPLETED, FAILED, TIMEOUT, CANCELLED, NODE_FAIL, "
        "PREEMPTED, OUT_OF_MEMORY, DEADLINE, BOOT_FAIL, PENDING, RUNNING, SUSPENDED, REQUEUED, "
        "RESIZING, REVOKED)",
        reader_.Where(state_), state_text));
  }
  const std::string& start_text = reader_.Field(start_);
  if (IsNoTime(start_text)) {
    if (state == "CANCELLED") {
      ++skipped_.cancelled_before_start;
    } else {
      ++skipped_.not_started;
    }
    return std::optional<SacctJob>();
  }
  auto time_of = [this](int column) -> Result<int64_t> {
    const std::optional<int64_t> value = ParseIsoDateTime(reader_.Field(column), 'T');
    if (!value) {
      return InvalidArgumentError(fmt::format("{}: \"{}\" is not a time YYYY-MM-DDTHH:MM:SS",
                                              reader_.Where(column), reader_.Field(column)));
    }
    return *value;
  };
  SacctJob job;
  job.line = reader_.line();
  job.state = state;
  GPUFLEET_ASSIGN_OR_RETURN(job.submit, time_of(submit_));
  GPUFLEET_ASSIGN_OR_RETURN(job.start, time_of(start_));
  if (IsNoTime(reader_.Field(end_))) {
    ++skipped_.not_ended;
    return std::optional<SacctJob>();
  }
  GPUFLEET_ASSIGN_OR_RETURN(job.end, time_of(end_));
  if (job.end < job.start) {
    return InvalidArgumentError(
        fmt::format("{}: \"{}\" is before Start \"{}\" (negative duration {} s)",
                    reader_.Where(end_), reader_.Field(end_), start_text, job.end - job.start));
  }
  if (job.start < job.submit) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is before Submit \"{}\"",
                                            reader_.Where(start_), start_text,
                                            reader_.Field(submit_)));
  }
  job.arrival = job.submit;
  if (eligible_ >= 0 && !IsNoTime(reader_.Field(eligible_))) {
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t eligible, time_of(eligible_));
    // Eligible after Start happens for jobs an admin started early: arrival is then Start.
    job.arrival = std::clamp(eligible, job.submit, job.start);
  }
  if (exit_code_ >= 0 && !reader_.Field(exit_code_).empty()) {
    const std::string& text = reader_.Field(exit_code_);
    const size_t colon = text.find(':');
    const std::optional<int64_t> code = ToInt64(std::string_view(text).substr(0, colon));
    const std::optional<int64_t> signal = colon == std::string::npos
                                              ? std::optional<int64_t>(0)
                                              : ToInt64(std::string_view(text).substr(colon + 1));
    if (!code || !signal || *code < 0 || *code > 255 || *signal < 0 || *signal > 255) {
      return InvalidArgumentError(
          fmt::format("{}: \"{}\" is not an exit code N:SIGNAL", reader_.Where(exit_code_), text));
    }
    job.has_exit_code = true;
    job.exit_code = static_cast<int>(*code);
    job.exit_signal = static_cast<int>(*signal);
  }
  if (time_limit_ >= 0) {
    const std::optional<int64_t> limit = ParseSlurmDuration(reader_.Field(time_limit_));
    if (!limit) {
      return InvalidArgumentError(
          fmt::format("{}: \"{}\" is not a time limit [D-]HH:MM:SS or UNLIMITED",
                      reader_.Where(time_limit_), reader_.Field(time_limit_)));
    }
    job.time_limit_seconds = *limit;
  }
  job.partition = partition_ >= 0 ? reader_.Field(partition_) : "";
  job.user = user_ >= 0 ? reader_.Field(user_) : "";
  SacctJob::Component component;
  const std::string& nnodes_text = reader_.Field(nnodes_);
  const std::optional<int64_t> nodes = ToInt64(nnodes_text);
  if (!nodes) {
    return InvalidArgumentError(
        fmt::format("{}: \"{}\" is not an integer", reader_.Where(nnodes_), nnodes_text));
  }
  if (*nodes < 1 || *nodes > kMaxNodes) {
    return InvalidArgumentError(
        fmt::format("{}: {} (must be 1..{})", reader_.Where(nnodes_), *nodes, kMaxNodes));
  }
  component.nodes = static_cast<int>(*nodes);
  std::vector<std::string> types;
  GPUFLEET_RETURN_IF_ERROR(ParseAllocTres(component, types));
  if (component.gpus % component.nodes != 0) {
    return InvalidArgumentError(fmt::format(
        "{}: {} GPUs in \"{}\" do not split evenly over NNodes {}", reader_.Where(alloc_tres_),
        component.gpus, reader_.Field(alloc_tres_), component.nodes));
  }
  if (node_list_ >= 0 && !reader_.Field(node_list_).empty() &&
      reader_.Field(node_list_) != "None assigned") {
    Result<std::vector<std::string>> names = fabric::ExpandHostlist(reader_.Field(node_list_));
    if (!names.ok()) {
      return InvalidArgumentError(
          fmt::format("{}: {}", reader_.Where(node_list_), names.status().message()));
    }
    if (static_cast<int64_t>(names->size()) != component.nodes) {
      return InvalidArgumentError(fmt::format("{}: \"{}\" names {} nodes, NNodes is {}",
                                              reader_.Where(node_list_), reader_.Field(node_list_),
                                              names->size(), component.nodes));
    }
    component.node_names = *std::move(names);
  }
  for (const std::string& type : types) {
    if (registered_types_.contains(type)) {
      ++unmapped_[type];
    }
  }
  // "1234+1": component 1 of het job 1234; "1234_7": task 7 of array 1234.
  row_het_leader_.clear();
  if (const size_t plus = id.find('+'); plus != std::string::npos) {
    row_het_leader_ = id.substr(0, plus);
    job.id = row_het_leader_;
  } else {
    job.id = id;
    if (id.find('_') != std::string::npos) {
      ++skipped_.array_tasks;
    }
  }
  job.components.push_back(std::move(component));
  return std::optional<SacctJob>(std::move(job));
}

Result<std::optional<SacctJob>> SacctReader::Next() {
  while (!done_) {
    GPUFLEET_ASSIGN_OR_RETURN(const bool more, reader_.Next());
    if (!more) {
      done_ = true;
      break;
    }
    ++rows_;
    GPUFLEET_ASSIGN_OR_RETURN(std::optional<SacctJob> row, ReadRow());
    if (!row) {
      continue;
    }
    if (pending_ && !pending_het_.empty() && row_het_leader_ == pending_het_) {
      for (SacctJob::Component& component : row->components) {
        pending_->components.push_back(std::move(component));
      }
      ++skipped_.het_components_folded;
      continue;
    }
    std::optional<SacctJob> ready = std::move(pending_);
    pending_ = std::move(row);
    pending_het_ = row_het_leader_;
    if (ready) {
      if (ready->Gpus() == 0) {
        ++skipped_.cpu_only;
        continue;
      }
      return ready;
    }
  }
  while (pending_) {
    std::optional<SacctJob> ready = std::move(pending_);
    pending_.reset();
    if (ready->Gpus() == 0) {
      ++skipped_.cpu_only;
      break;
    }
    return ready;
  }
  return std::optional<SacctJob>();
}

SlurmNodeInference::SlurmNodeInference(std::string untyped_gpu_model)
    : untyped_gpu_model_(std::move(untyped_gpu_model)) {}

void SlurmNodeInference::Add(const SacctJob& job) {
  for (const SacctJob::Component& component : job.components) {
    const int64_t gpus = component.gpus / component.nodes;
    const int64_t cpus = component.cpus * 1000 / component.nodes;
    const int64_t memory = component.memory_mib / component.nodes;
    const std::string& model =
        component.gpu_models.empty() ? untyped_gpu_model_ : component.gpu_models.front();
    auto record = [&](Usage& usage, int64_t times) {
      usage.gpus.emplace_back(job.start, gpus * times);
      usage.gpus.emplace_back(job.end, -gpus * times);
      usage.cpus.emplace_back(job.start, cpus * times);
      usage.cpus.emplace_back(job.end, -cpus * times);
      usage.memory.emplace_back(job.start, memory * times);
      usage.memory.emplace_back(job.end, -memory * times);
      if (!component.gpu_models.empty()) {
        ++usage.models[model];
      }
    };
    if (component.node_names.empty()) {
      named_ = false;
      record(by_model_[model], component.nodes);
      widest_[model] = std::max(widest_[model], gpus);
      most_nodes_[model] = std::max(most_nodes_[model], component.nodes);
      HostNeed& need = host_need_[model];
      need.cpu_milli = std::max(need.cpu_milli, cpus);
      need.memory_mib = std::max(need.memory_mib, memory);
      if (gpus > 0) {
        need.cpu_milli_per_gpu = std::max(need.cpu_milli_per_gpu, (cpus + gpus - 1) / gpus);
        need.memory_mib_per_gpu = std::max(need.memory_mib_per_gpu, (memory + gpus - 1) / gpus);
      }
      continue;
    }
    for (const std::string& name : component.node_names) {
      record(by_node_[name], 1);
    }
  }
}

std::vector<SlurmNodeShape> SlurmNodeInference::Nodes() const {
  std::vector<SlurmNodeShape> nodes;
  for (const auto& [name, usage] : by_node_) {
    SlurmNodeShape node;
    node.name = name;
    std::string model = untyped_gpu_model_;
    int most = 0;
    for (const auto& [candidate, jobs] : usage.models) {
      if (jobs > most) {
        model = candidate;
        most = jobs;
      }
    }
    node.gpu_models.assign(static_cast<size_t>(Peak(usage.gpus)), model);
    node.cpu_milli = Peak(usage.cpus);
    node.memory_mib = Peak(usage.memory);
    nodes.push_back(std::move(node));
  }
  for (const auto& [model, usage] : by_model_) {
    const int64_t width = std::max<int64_t>(1, widest_.at(model));
    const int64_t peak = Peak(usage.gpus);
    const int64_t count = std::max<int64_t>((peak + width - 1) / width, most_nodes_.at(model));
    // Enough CPUs and memory for the hungriest job per GPU on a full node, and for the largest
    // per-node share of any job.
    const HostNeed& need = host_need_.at(model);
    const int64_t cpu_per_node = std::max(need.cpu_milli, need.cpu_milli_per_gpu * width);
    const int64_t memory_per_node = std::max(need.memory_mib, need.memory_mib_per_gpu * width);
    for (int64_t i = 0; i < count; ++i) {
      SlurmNodeShape node;
      node.name = fmt::format("{}-{:03}", Lower(model), i + 1);
      node.gpu_models.assign(static_cast<size_t>(width), model);
      node.cpu_milli = cpu_per_node;
      node.memory_mib = memory_per_node;
      nodes.push_back(std::move(node));
    }
  }
  return nodes;
}

Result<SacctHistory> ReadSacctHistory(std::istream& in, const std::string& source,
                                      const SacctOptions& options, GpuCatalog& catalog) {
  if (in.peek() == std::char_traits<char>::eof()) {
    return InvalidArgumentError(fmt::format("{}:1: empty file, expected a header row", source));
  }
  SacctReader reader(in, source, options, catalog);
  GPUFLEET_RETURN_IF_ERROR(reader.Open());
  SacctHistory history;
  SlurmNodeInference inference(options.untyped_gpu_model);
  std::vector<std::pair<int64_t, size_t>> order;
  std::vector<TraceJob> jobs;
  std::set<std::string, std::less<>> ids;
  int zero_length = 0;
  while (true) {
    GPUFLEET_ASSIGN_OR_RETURN(std::optional<SacctJob> job, reader.Next());
    if (!job) {
      break;
    }
    if (!ids.insert(job->id).second) {
      return InvalidArgumentError(fmt::format("{}:{}: column \"JobID\": duplicate job id \"{}\"",
                                              source, job->line, job->id));
    }
    inference.Add(*job);
    if (job->end == job->start) {
      ++zero_length;  // Slurm's whole-second times give it 0 s, which no replay can run
      continue;
    }
    TraceJob trace_job;
    Job& spec = trace_job.job;
    spec.id = JobId(job->id);
    spec.queue = QueueId(job->partition.empty() ? std::string("default") : job->partition);
    std::vector<std::string> models;
    for (size_t i = 0; i < job->components.size(); ++i) {
      const SacctJob::Component& component = job->components[i];
      TaskGroup group;
      group.name = job->components.size() == 1 ? "tasks" : fmt::format("component-{}", i);
      group.replicas = component.nodes;
      if (component.gpus > 0) {
        group.request.gpus = WholeGpus{static_cast<int>(component.gpus / component.nodes)};
      }
      group.request.host.cpu_milli = component.cpus * 1000 / component.nodes;
      group.request.host.memory_mib = component.memory_mib / component.nodes;
      spec.groups.push_back(std::move(group));
      for (const std::string& model : component.gpu_models) {
        if (std::find(models.begin(), models.end(), model) == models.end()) {
          models.push_back(model);
        }
      }
    }
    spec.allowed_gpu_models = std::move(models);
    const int64_t duration = job->end - job->start;
    spec.runtime_estimate =
        std::chrono::seconds(job->time_limit_seconds > 0 ? job->time_limit_seconds : duration);
    trace_job.submit_seconds = job->arrival;
    trace_job.duration_seconds = duration;
    trace_job.user = job->user;
    const Status valid = spec.Validate(catalog);
    if (!valid.ok()) {
      return InvalidArgumentError(fmt::format("{}:{}: {}", source, job->line, valid.message()));
    }
    order.emplace_back(job->arrival, jobs.size());
    jobs.push_back(std::move(trace_job));
  }
  history.skipped = reader.skipped();
  history.skipped.zero_length = zero_length;
  history.unmapped_gpu_types = reader.unmapped_gpu_types();
  history.rows = reader.rows();
  history.nodes = inference.Nodes();
  history.nodes_named = inference.named() && !history.nodes.empty();
  if (jobs.empty()) {
    return InvalidArgumentError(
        fmt::format("{}:{}: no jobs in the file to replay ({} rows; skipped: {})", source,
                    std::max(reader.line(), 1), reader.rows(), history.skipped.ToString()));
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const int64_t base = order.front().first;
  history.trace.source = source;
  history.trace.jobs.reserve(jobs.size());
  for (const auto& [arrival, index] : order) {
    history.trace.jobs.push_back(std::move(jobs[index]));
    history.trace.jobs.back().submit_seconds = arrival - base;
  }
  return history;
}

Result<SacctHistory> LoadSacctHistory(const std::string& path, const SacctOptions& options,
                                      GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(std::ifstream in, OpenInputFile(path));
  return ReadSacctHistory(in, path, options, catalog);
}

Result<std::vector<SlurmNodeShape>> ParseScontrolNodes(std::string_view text,
                                                       const std::string& source,
                                                       const SacctOptions& options,
                                                       GpuCatalog& catalog) {
  std::vector<SlurmNodeShape> nodes;
  int line = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    const std::string_view row = text.substr(begin, end - begin);
    begin = end + 1;
    ++line;
    size_t at = 0;
    while (at < row.size()) {
      while (at < row.size() && std::isspace(static_cast<unsigned char>(row[at])) != 0) {
        ++at;
      }
      size_t stop = at;
      while (stop < row.size() && std::isspace(static_cast<unsigned char>(row[stop])) == 0) {
        ++stop;
      }
      const std::string_view token = row.substr(at, stop - at);
      at = stop;
      const size_t equals = token.find('=');
      if (equals == std::string_view::npos) {
        continue;  // the rest of a value with spaces (OS=Linux 6.1 ..., Reason=...)
      }
      const std::string_view key = token.substr(0, equals);
      const std::string_view value = token.substr(equals + 1);
      if (key == "NodeName") {
        nodes.push_back(SlurmNodeShape{std::string(value), {}, 0, 0});
        continue;
      }
      if (nodes.empty()) {
        continue;
      }
      SlurmNodeShape& node = nodes.back();
      if (key == "CPUTot" || key == "RealMemory") {
        const std::optional<int64_t> number = ToInt64(value);
        if (!number || *number < 0) {
          return InvalidArgumentError(
              fmt::format("{}:{}: {}: \"{}\" is not a number", source, line, key, value));
        }
        if (key == "CPUTot") {
          node.cpu_milli = *number * 1000;
        } else {
          node.memory_mib = *number;
        }
      } else if (key == "Gres" && value != "(null)") {
        // gpu:a100:4(S:0-1),gpu:v100:2 or gpu:4; other GRES (e.g. nic:2) are ignored.
        size_t part_begin = 0;
        while (part_begin < value.size()) {
          size_t part_end = part_begin;
          int depth = 0;
          while (part_end < value.size() && (value[part_end] != ',' || depth > 0)) {
            depth += value[part_end] == '(' ? 1 : value[part_end] == ')' ? -1 : 0;
            ++part_end;
          }
          std::string_view part = value.substr(part_begin, part_end - part_begin);
          part_begin = part_end + 1;
          part = part.substr(0, part.find('('));
          if (!part.starts_with("gpu:") && part != "gpu") {
            continue;
          }
          const size_t last = part.rfind(':');
          const std::optional<int64_t> count = ToInt64(part.substr(last + 1));
          if (!count || *count < 0 || *count > 1024) {
            return InvalidArgumentError(fmt::format(
                "{}:{}: Gres: \"{}\" is not gpu:TYPE:COUNT or gpu:COUNT", source, line, part));
          }
          std::string model = options.untyped_gpu_model;
          if (last > 3) {
            const std::string_view type = part.substr(4, last - 4);
            model = MapGpuType(type, options.gres_map, catalog);
            if (model.empty()) {
              GPUFLEET_RETURN_IF_ERROR(catalog.RegisterTraceModel(type, 0));
              model = std::string(type);
            }
          }
          node.gpu_models.insert(node.gpu_models.end(), static_cast<size_t>(*count), model);
        }
      }
    }
  }
  if (nodes.empty()) {
    return InvalidArgumentError(fmt::format(
        "{}:{}: no NodeName= records (expected `scontrol show nodes` output)", source, line));
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const SlurmNodeShape& a, const SlurmNodeShape& b) { return a.name < b.name; });
  return nodes;
}

Result<Cluster> BuildSlurmCluster(const std::vector<SlurmNodeShape>& nodes,
                                  const GpuCatalog& catalog) {
  Cluster cluster;
  int gpus = 0;
  for (const SlurmNodeShape& shape : nodes) {
    Node node;
    node.id = NodeId(shape.name);
    node.capacity.cpu_milli = shape.cpu_milli;
    node.capacity.memory_mib = shape.memory_mib;
    for (size_t i = 0; i < shape.gpu_models.size(); ++i) {
      GPUFLEET_ASSIGN_OR_RETURN(const GpuModelInfo* model, catalog.Find(shape.gpu_models[i]));
      Gpu gpu;
      gpu.uuid = GpuUuid(fmt::format("{}-gpu{}", shape.name, i));
      gpu.index = static_cast<int>(i);
      gpu.model = model->name;
      gpu.memory_mib = model->memory_mib;
      node.gpus.push_back(std::move(gpu));
    }
    gpus += static_cast<int>(shape.gpu_models.size());
    cluster.nodes.push_back(std::move(node));
  }
  if (gpus == 0) {
    return InvalidArgumentError(fmt::format(
        "the {} Slurm nodes have no GPUs (no Gres=gpu, or no GPU job ran on them)", nodes.size()));
  }
  GPUFLEET_RETURN_IF_ERROR(cluster.Validate(catalog));
  return cluster;
}

Result<FabricShapeMismatch> ApplySlurmNodeShapes(fabric::FabricSpec& spec,
                                                 const std::vector<SlurmNodeShape>& nodes) {
  std::map<std::string, const SlurmNodeShape*, std::less<>> by_name;
  for (const SlurmNodeShape& node : nodes) {
    by_name.emplace(node.name, &node);
  }
  FabricShapeMismatch mismatch;
  std::set<std::string, std::less<>> in_file;
  std::vector<fabric::NodeGroupSpec> groups;
  for (const fabric::NodeGroupSpec& group : spec.nodes) {
    GPUFLEET_ASSIGN_OR_RETURN(const std::vector<std::string> names,
                              fabric::ExpandHostlist(group.names));
    for (const std::string& name : names) {
      in_file.insert(name);
      const auto found = by_name.find(name);
      if (found == by_name.end()) {
        mismatch.not_in_nodes.push_back(name);
        groups.push_back(ShapedGroup(group, SlurmNodeShape{name, {}, 0, 0}));
      } else {
        groups.push_back(ShapedGroup(group, *found->second));
      }
    }
  }
  for (const SlurmNodeShape& node : nodes) {
    if (in_file.contains(node.name)) {
      continue;
    }
    mismatch.not_in_file.push_back(node.name);
    groups.push_back(
        ShapedGroup(spec.nodes.empty() ? fabric::NodeGroupSpec{} : spec.nodes.front(), node));
  }
  spec.nodes = std::move(groups);
  return mismatch;
}

}  // namespace gpufleet::sim
