// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/format.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <set>

#include <fmt/core.h>

#include "gpufleet/core/rfc3339.h"

namespace gpufleet::cli {

using nlohmann::json;

const json& Member(const json& object, std::string_view key) {
  static const json kNull;
  if (!object.is_object()) {
    return kNull;
  }
  const auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

std::string Text(const json& value) {
  if (value.is_null()) {
    return "";
  }
  if (value.is_string()) {
    return value.get<std::string>();
  }
  return value.dump();
}

namespace {

// The one-argument Text above, next to the two-argument one below.
using cli::Text;

std::string Text(const json& object, std::string_view key) {
  return Text(Member(object, key));
}

std::string TextOr(const json& object, std::string_view key, std::string_view fallback) {
  std::string text = Text(object, key);
  return text.empty() ? std::string(fallback) : text;
}

int64_t Int(const json& object, std::string_view key, int64_t fallback) {
  const json& value = Member(object, key);
  return value.is_number_integer() ? value.get<int64_t>() : fallback;
}

const json& Items(const json& answer) {
  static const json kEmpty = json::array();
  const json& items = Member(answer, "items");
  return items.is_array() ? items : kEmpty;
}

std::string Join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string joined;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) {
      joined += separator;
    }
    joined += parts[i];
  }
  return joined;
}

// Cuts `text` to `width` bytes with "..." and never inside a UTF-8 sequence.
std::string Truncate(const std::string& text, size_t width) {
  if (text.size() <= width) {
    return text;
  }
  size_t end = width - 3;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) {
    --end;
  }
  return text.substr(0, end) + "...";
}

// "0,1,2".
std::string JoinInts(const json& array) {
  std::vector<std::string> parts;
  if (array.is_array()) {
    for (const json& value : array) {
      parts.push_back(Text(value));
    }
  }
  return parts.empty() ? kNone : Join(parts, ",");
}

// "block=block-0,leaf=leaf-0".
std::string JoinPairs(const json& object, std::string_view separator) {
  std::vector<std::string> parts;
  if (object.is_object()) {
    for (const auto& [key, value] : object.items()) {
      parts.push_back(fmt::format("{}={}", key, Text(value)));
    }
  }
  return parts.empty() ? kNone : Join(parts, separator);
}

// The GPUs a job asks for, from its spec's task groups: whole and fractional GPUs as one
// decimal, MIG instances as "COUNTxPROFILE"; without a spec, the GPUs of its placements.
std::string JobGpus(const json& job) {
  const json& tasks = Member(Member(Member(job, "spec"), "spec"), "tasks");
  if (!tasks.is_array()) {
    int64_t placed = 0;
    const json& placements = Member(job, "placements");
    if (placements.is_array()) {
      for (const json& placement : placements) {
        const json& gpus = Member(placement, "gpus");
        placed += gpus.is_array() ? static_cast<int64_t>(gpus.size()) : 0;
      }
    }
    return std::to_string(placed);
  }
  int64_t milli = 0;
  std::vector<std::string> mig;
  for (const json& task : tasks) {
    const int64_t replicas = Int(task, "replicas", 1);
    const json& gpus = Member(Member(task, "resources"), "gpus");
    if (!gpus.is_object()) {
      continue;
    }
    const std::string profile = Text(gpus, "migProfile");
    if (!profile.empty()) {
      mig.push_back(fmt::format("{}x{}", replicas * Int(gpus, "count", 1), profile));
    } else if (gpus.contains("milli")) {
      milli += replicas * Int(gpus, "milli", 0);
    } else {
      milli += replicas * Int(gpus, "count", 0) * 1000;
    }
  }
  if (mig.empty()) {
    return FormatMilli(milli);
  }
  std::string text = milli > 0 ? FormatMilli(milli) + "+" : "";
  return text + Join(mig, "+");
}

// The distinct nodes of a job's placements, in order.
std::string JobNodes(const json& job) {
  std::vector<std::string> nodes;
  const json& placements = Member(job, "placements");
  if (placements.is_array()) {
    for (const json& placement : placements) {
      const std::string node = Text(placement, "node");
      if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) {
        nodes.push_back(node);
      }
    }
  }
  return nodes.empty() ? kNone : Join(nodes, ",");
}

struct GpuCounts {
  int64_t total = 0;
  int64_t free = 0;
  int64_t unhealthy = 0;
  int64_t allocated_milli = 0;
  std::string models;
};

GpuCounts CountGpus(const json& node) {
  GpuCounts counts;
  std::vector<std::string> models;
  const json& gpus = Member(node, "gpus");
  if (!gpus.is_array()) {
    counts.models = kNone;
    return counts;
  }
  for (const json& gpu : gpus) {
    ++counts.total;
    const int64_t allocated = Int(gpu, "allocated_milli", 0);
    const std::string health = Text(gpu, "health");
    counts.allocated_milli += allocated;
    if (health != "Healthy") {
      ++counts.unhealthy;
    } else if (allocated == 0) {
      ++counts.free;
    }
    const std::string model = Text(gpu, "model");
    if (!model.empty() && std::find(models.begin(), models.end(), model) == models.end()) {
      models.push_back(model);
    }
  }
  counts.models = models.empty() ? kNone : Join(models, ",");
  return counts;
}

std::string FormatMemoryMib(int64_t mib) {
  if (mib > 0 && mib % 1024 == 0) {
    return fmt::format("{}Gi", mib / 1024);
  }
  return fmt::format("{}Mi", mib);
}

// The time since `created_at`, or "<unknown>" for a job without one (stored before jobs had it).
std::string JobAge(const json& job, int64_t now_unix_seconds) {
  const Result<int64_t> created = ParseRfc3339(Text(job, "created_at"));
  return created.ok() ? FormatAge(now_unix_seconds - *created / 1'000'000'000) : "<unknown>";
}

std::vector<std::string> JobHeader(OutputFormat format) {
  if (format == OutputFormat::kWide) {
    return {"NAME", "TEAM", "QUEUE", "STATE", "GPUS", "AGE", "NODES", "VERSION", "REASON"};
  }
  return {"NAME", "TEAM", "QUEUE", "STATE", "GPUS", "AGE", "REASON"};
}

std::vector<std::string> JobRow(const json& job, OutputFormat format, int64_t now_unix_seconds) {
  const std::string reason = TextOr(job, "reason", kNone);
  std::vector<std::string> row = {TextOr(job, "name", kNone),
                                  TextOr(job, "team", kNone),
                                  TextOr(job, "queue", kNone),
                                  TextOr(job, "state", kNone),
                                  JobGpus(job),
                                  JobAge(job, now_unix_seconds)};
  if (format == OutputFormat::kWide) {
    row.push_back(JobNodes(job));
    row.push_back(TextOr(job, "version", kNone));
    row.push_back(reason);
  } else {
    row.push_back(Truncate(reason, kReasonWidth));
  }
  return row;
}

std::vector<std::string> NodeHeader(OutputFormat format) {
  if (format == OutputFormat::kWide) {
    return {"NAME",  "STATE", "GPUS",   "FREE", "ALLOCATED", "UNHEALTHY",
            "MODEL", "CPU",   "MEMORY", "LEAF", "TOPOLOGY",  "VERSION"};
  }
  return {"NAME", "STATE", "GPUS", "FREE", "MODEL", "LEAF"};
}

std::vector<std::string> NodeRow(const json& node, OutputFormat format) {
  const GpuCounts gpus = CountGpus(node);
  const std::string leaf = TextOr(Member(node, "topology"), "leaf", kNone);
  if (format == OutputFormat::kWide) {
    return {TextOr(node, "name", kNone),
            TextOr(node, "state", kNone),
            std::to_string(gpus.total),
            std::to_string(gpus.free),
            FormatMilli(gpus.allocated_milli),
            std::to_string(gpus.unhealthy),
            gpus.models,
            FormatMilli(Int(node, "cpu_milli", 0)),
            FormatMemoryMib(Int(node, "memory_mib", 0)),
            leaf,
            JoinPairs(Member(node, "topology"), ","),
            TextOr(node, "version", kNone)};
  }
  return {TextOr(node, "name", kNone),
          TextOr(node, "state", kNone),
          std::to_string(gpus.total),
          std::to_string(gpus.free),
          gpus.models,
          leaf};
}

std::vector<std::string> QueueHeader() {
  return {"NAME",    "TEAM",    "GUARANTEE", "LIMIT",    "WEIGHT",
          "PENDING", "RUNNING", "GPUS",      "BORROWED", "FAIR-SHARE"};
}

// A ratio with two decimals; kNone when the server did not report it.
std::string Ratio(const json& object, std::string_view key) {
  const json& value = Member(object, key);
  return value.is_number() ? fmt::format("{:.2f}", value.get<double>()) : std::string(kNone);
}

std::vector<std::string> QueueRow(const json& queue) {
  return {TextOr(queue, "name", kNone),
          TextOr(queue, "team", kNone),
          JoinPairs(Member(queue, "guarantee"), ","),
          JoinPairs(Member(queue, "limit"), ","),
          TextOr(queue, "weight", "1"),
          TextOr(queue, "pending", "0"),
          TextOr(queue, "running", "0"),
          TextOr(queue, "gpus_allocated", "0"),
          TextOr(queue, "borrowed", "0"),
          Ratio(queue, "fair_share")};
}

std::vector<std::string> Header(ResourceKind kind, OutputFormat format) {
  switch (kind) {
    case ResourceKind::kJob:
      return JobHeader(format);
    case ResourceKind::kNode:
      return NodeHeader(format);
    case ResourceKind::kQueue:
      return QueueHeader();
    case ResourceKind::kTeam:
      return {"NAME"};
    case ResourceKind::kToken:
      return {"ID", "ROLE", "TEAM", "NAME"};
  }
  return {};
}

std::vector<std::string> Row(ResourceKind kind, const json& object, OutputFormat format,
                             int64_t now_unix_seconds) {
  switch (kind) {
    case ResourceKind::kJob:
      return JobRow(object, format, now_unix_seconds);
    case ResourceKind::kNode:
      return NodeRow(object, format);
    case ResourceKind::kQueue:
      return QueueRow(object);
    case ResourceKind::kTeam:
      return {TextOr(object, "name", kNone)};
    case ResourceKind::kToken:
      return {TextOr(object, "id", kNone), TextOr(object, "role", kNone),
              TextOr(object, "team", kNone), TextOr(object, "name", kNone)};
  }
  return {};
}

// ---- YAML ----

bool IsReservedWord(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::set<std::string, std::less<>> kWords = {"true", "false", "yes", "no",   "on",
                                                            "off",  "y",     "n",   "null", "~"};
  return kWords.contains(lower);
}

// Plain only when it cannot read as anything but this string: letters, digits and a few safe
// punctuation marks, starting with a letter, "/", "_" or "<", not a YAML 1.1 boolean or null.
bool NeedsQuotes(std::string_view text) {
  if (text.empty() || IsReservedWord(text) || text.front() == ' ' || text.back() == ' ') {
    return true;
  }
  const auto first = static_cast<unsigned char>(text.front());
  if (!std::isalpha(first) && first != '/' && first != '_' && first != '<') {
    return true;
  }
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (!std::isalnum(byte) && std::string_view(" -_./=+@()<>").find(c) == std::string::npos) {
      return true;
    }
  }
  return false;
}

std::string YamlScalar(const json& value) {
  if (value.is_null()) {
    return "null";
  }
  if (value.is_object()) {
    return "{}";
  }
  if (value.is_array()) {
    return "[]";
  }
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    // A JSON string is a valid YAML double-quoted scalar.
    return NeedsQuotes(text) ? value.dump(-1, ' ', false, json::error_handler_t::replace) : text;
  }
  return value.dump();
}

bool IsBlock(const json& value) {
  return value.is_structured() && !value.empty();
}

// The lines of a non-empty mapping or sequence at indentation 0.
std::vector<std::string> YamlBlock(const json& value) {
  std::vector<std::string> lines;
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      const std::string key_text = YamlScalar(json(key));
      if (!IsBlock(item)) {
        lines.push_back(fmt::format("{}: {}", key_text, YamlScalar(item)));
        continue;
      }
      lines.push_back(key_text + ":");
      for (const std::string& line : YamlBlock(item)) {
        lines.push_back("  " + line);
      }
    }
    return lines;
  }
  for (const json& item : value) {
    if (!IsBlock(item)) {
      lines.push_back("- " + YamlScalar(item));
      continue;
    }
    const std::vector<std::string> block = YamlBlock(item);
    for (size_t i = 0; i < block.size(); ++i) {
      lines.push_back((i == 0 ? "- " : "  ") + block[i]);
    }
  }
  return lines;
}

}  // namespace

// "Label:" padded so that values line up, as `kubectl describe` does.
std::string Field(std::string_view label, std::string_view value) {
  return fmt::format("{:<13}{}\n", fmt::format("{}:", label), value);
}

std::string Indent(const std::string& text, std::string_view prefix) {
  std::string indented;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    const size_t stop = end == std::string::npos ? text.size() : end + 1;
    indented += prefix;
    indented.append(text, begin, stop - begin);
    begin = stop;
  }
  return indented;
}

namespace {

// Multi-line values continue under the value column.
std::string FieldLines(std::string_view label, const std::vector<std::string>& values) {
  if (values.empty()) {
    return Field(label, kNone);
  }
  std::string text = Field(label, values.front());
  for (size_t i = 1; i < values.size(); ++i) {
    text += fmt::format("{:<13}{}\n", "", values[i]);
  }
  return text;
}

std::vector<std::string> Pairs(const json& object) {
  std::vector<std::string> pairs;
  if (object.is_object()) {
    for (const auto& [key, value] : object.items()) {
      pairs.push_back(fmt::format("{}={}", key, Text(value)));
    }
  }
  return pairs;
}

}  // namespace

Result<OutputFormat> ParseOutputFormat(std::string_view text) {
  if (text.empty() || text == "table") {
    return OutputFormat::kTable;
  }
  if (text == "wide") {
    return OutputFormat::kWide;
  }
  if (text == "json") {
    return OutputFormat::kJson;
  }
  if (text == "yaml") {
    return OutputFormat::kYaml;
  }
  return InvalidArgumentError(
      fmt::format("unknown output format \"{}\" (expected table, wide, json or yaml)", text));
}

Result<ResourceKind> ParseResourceKind(std::string_view text) {
  if (text == "job" || text == "jobs") {
    return ResourceKind::kJob;
  }
  if (text == "node" || text == "nodes") {
    return ResourceKind::kNode;
  }
  if (text == "queue" || text == "queues") {
    return ResourceKind::kQueue;
  }
  if (text == "team" || text == "teams") {
    return ResourceKind::kTeam;
  }
  if (text == "token" || text == "tokens") {
    return ResourceKind::kToken;
  }
  return InvalidArgumentError(fmt::format(
      "unknown resource type \"{}\" (expected jobs, nodes, queues, teams or tokens)", text));
}

std::string RenderList(ResourceKind kind, const json& answer, OutputFormat format,
                       int64_t now_unix_seconds) {
  switch (format) {
    case OutputFormat::kJson:
      return answer.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    case OutputFormat::kYaml:
      return ToYaml(answer);
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  const json& items = Items(answer);
  if (items.empty()) {
    return "";
  }
  std::vector<std::vector<std::string>> rows = {Header(kind, format)};
  for (const json& item : items) {
    rows.push_back(Row(kind, item, format, now_unix_seconds));
  }
  return RenderTable(rows);
}

std::string RenderObject(ResourceKind kind, const json& object, OutputFormat format,
                         int64_t now_unix_seconds) {
  switch (format) {
    case OutputFormat::kJson:
      return object.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    case OutputFormat::kYaml:
      return ToYaml(object);
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      break;
  }
  return RenderTable({Header(kind, format), Row(kind, object, format, now_unix_seconds)});
}

namespace {

// " (x97, 07:12-07:18)" after an event that happened more than once (UTC hours and minutes of
// its first and last time), "" otherwise.
std::string Repeats(const json& event) {
  const int64_t count = Int(event, "count", 1);
  if (count <= 1) {
    return "";
  }
  const auto hhmm = [](const std::string& time) {
    return time.size() >= 16 ? time.substr(11, 5) : std::string(kNone);
  };
  return fmt::format(" (x{}, {}-{})", count, hhmm(Text(event, "firstTime")),
                     hhmm(Text(event, "lastTime")));
}

}  // namespace

std::string EventsSection(const json& events) {
  const json& items = Items(events);
  if (items.empty()) {
    return Field("Events", kNone);
  }
  const bool timed = std::any_of(items.begin(), items.end(),
                                 [](const json& event) { return event.contains("at"); });
  std::vector<std::vector<std::string>> rows = {{"REVISION", "MESSAGE"}};
  if (timed) {
    rows[0].insert(rows[0].begin() + 1, "TIME");
  }
  for (const json& event : items) {
    rows.push_back({TextOr(event, "revision", kNone), Text(event, "message") + Repeats(event)});
    if (timed) {
      rows.back().insert(rows.back().begin() + 1, TextOr(event, "at", kNone));
    }
  }
  return "Events:\n" + Indent(RenderTable(rows), "  ");
}

std::string DescribeJob(const json& job, const json& events, int64_t now_unix_seconds) {
  std::string text;
  text += Field("Name", TextOr(job, "name", kNone));
  text += Field("Team", TextOr(job, "team", kNone));
  text += Field("Queue", TextOr(job, "queue", kNone));
  text += FieldLines("Labels", Pairs(Member(job, "labels")));
  text += Field("Created", TextOr(job, "created_at", kNone));
  text += Field("State", TextOr(job, "state", kNone));
  text += Field("GPUs", JobGpus(job));
  text += Field("Version", TextOr(job, "version", kNone));
  text += Field("Reason", TextOr(job, "reason", kNone));
  // What a preemption would lose (docs/job-spec.md, "Checkpoints").
  if (const json& checkpoint = Member(job, "last_checkpoint_ns"); checkpoint.is_number_integer()) {
    text +=
        Field("Checkpoint",
              fmt::format("last checkpoint {} ago",
                          FormatAge(now_unix_seconds - checkpoint.get<int64_t>() / 1'000'000'000)));
  }
  // A preemption notice the run saves its work under (docs/job-spec.md, "Preemption notices").
  if (const json& notice = Member(job, "notice");
      notice.is_object() && Member(notice, "deadline_ns").is_number_integer()) {
    const int64_t left =
        Member(notice, "deadline_ns").get<int64_t>() / 1'000'000'000 - now_unix_seconds;
    text += Field("Notice", fmt::format("{} sent; stopping once it reports a checkpoint, at the "
                                        "latest in {}",
                                        TextOr(notice, "signal", kNone),
                                        FormatAge(std::max<int64_t>(left, 0))));
  }
  // What a stopping run waits for before it becomes `then`, as kubectl shows Terminating.
  if (const json& stopping = Member(job, "stopping"); stopping.is_object()) {
    text += Field("Stopping", fmt::format("{}; then {}", TextOr(stopping, "waiting_for", kNone),
                                          TextOr(stopping, "then", kNone)));
  }
  // Idle reclaim's warning to the owner; only a running job can be warned.
  if (const std::string warning = Text(job, "warning");
      !warning.empty() && Text(job, "state") == "Running") {
    text += Field("Warning", warning);
  }
  const json& placements = Member(job, "placements");
  if (!placements.is_array() || placements.empty()) {
    text += Field("Placements", kNone);
  } else {
    text += "Placements:\n";
    // The image columns only for a job whose agents reported an image.
    const bool images = std::any_of(placements.begin(), placements.end(), [](const json& p) {
      return p.is_object() && (p.contains("image_pull_ms") || p.contains("image_digest"));
    });
    std::vector<std::vector<std::string>> rows = {{"TASK", "NODE", "GPUS", "PHASE"}};
    if (images) {
      rows[0].insert(rows[0].end(), {"IMAGE PULL", "IMAGE DIGEST"});
    }
    std::string pulls;  // what each task whose image is being pulled is at
    for (const json& placement : placements) {
      rows.push_back({TextOr(placement, "task", kNone), TextOr(placement, "node", kNone),
                      JoinInts(Member(placement, "gpus")), TextOr(placement, "phase", kNone)});
      if (const std::string progress = Text(placement, "image_pull_progress"); !progress.empty()) {
        pulls += fmt::format("  {} pulling: {}\n", TextOr(placement, "task", kNone), progress);
      }
      if (images) {
        const json& pull_ms = Member(placement, "image_pull_ms");
        rows.back().push_back(
            pull_ms.is_number_integer()
                ? fmt::format("{:.1f}s", static_cast<double>(pull_ms.get<int64_t>()) / 1000.0)
                : std::string(kNone));
        rows.back().push_back(TextOr(placement, "image_digest", kNone));
      }
    }
    text += Indent(RenderTable(rows), "  ") + pulls;
  }
  return text + EventsSection(events);
}

namespace {

// "Images:" and a table of the images the node's agent reported, or nothing when it reported
// none; a line saying what the server did not keep of its last list.
std::string NodeImagesSection(const json& node) {
  const json& images = Member(node, "images");
  std::string text;
  if (images.is_array() && !images.empty()) {
    std::vector<std::vector<std::string>> rows = {{"REFERENCES", "DIGEST", "SIZE"}};
    for (const json& image : images) {
      std::vector<std::string> references;
      const json& list = Member(image, "references");
      for (const json& reference : list.is_array() ? list : json::array()) {
        references.push_back(Text(reference));
      }
      rows.push_back({references.empty() ? std::string(kNone) : Join(references, ", "),
                      TextOr(image, "digest", kNone),
                      FormatMemoryMib(Int(image, "size_bytes", 0) / (1024 * 1024))});
    }
    text += fmt::format("Images:      {}\n", images.size());
    text += Indent(RenderTable(rows), "  ");
  }
  if (const std::string dropped = Text(node, "images_dropped"); !dropped.empty()) {
    text += fmt::format("Images not kept: {}\n", dropped);
  }
  return text;
}

}  // namespace

std::string DescribeNode(const json& node, const json& events) {
  std::string text;
  text += Field("Name", TextOr(node, "name", kNone));
  text += Field("State", TextOr(node, "state", kNone));
  text += FieldLines("Labels", Pairs(Member(node, "labels")));
  text += FieldLines("Topology", Pairs(Member(node, "topology")));
  text += Field("CPU", FormatMilli(Int(node, "cpu_milli", 0)));
  text += Field("Memory", FormatMemoryMib(Int(node, "memory_mib", 0)));
  text += Field("Version", TextOr(node, "version", kNone));
  const json& gpus = Member(node, "gpus");
  if (!gpus.is_array() || gpus.empty()) {
    text += Field("GPUs", kNone);
    return text + NodeImagesSection(node) + EventsSection(events);
  }
  const GpuCounts counts = CountGpus(node);
  text += fmt::format("GPUs:        {} ({} free, {} not healthy)\n", counts.total, counts.free,
                      counts.unhealthy);
  // Why a GPU is not healthy, as its agent's health rules or its quarantine said (only when some
  // GPU has reasons).
  bool any_reasons = false;
  const auto reasons_of = [](const json& gpu) {
    std::vector<std::string> reasons;
    if (const std::string quarantine = Text(gpu, "quarantine_reason"); !quarantine.empty()) {
      reasons.push_back("quarantined: " + quarantine);
    }
    const json& list = Member(gpu, "reasons");
    for (const json& reason : list.is_array() ? list : json::array()) {
      reasons.push_back(reason.is_string() ? reason.get<std::string>() : reason.dump());
    }
    return reasons;
  };
  for (const json& gpu : gpus) {
    any_reasons = any_reasons || !reasons_of(gpu).empty();
  }
  std::vector<std::vector<std::string>> rows = {{"INDEX", "MODEL", "HEALTH", "ALLOCATED"}};
  if (any_reasons) {
    rows[0].push_back("REASONS");
  }
  for (const json& gpu : gpus) {
    rows.push_back({TextOr(gpu, "index", kNone), TextOr(gpu, "model", kNone),
                    TextOr(gpu, "health", kNone), FormatMilli(Int(gpu, "allocated_milli", 0))});
    if (any_reasons) {
      const std::vector<std::string> reasons = reasons_of(gpu);
      rows.back().push_back(reasons.empty() ? "-" : Join(reasons, "; "));
    }
  }
  text += Indent(RenderTable(rows), "  ");
  return text + NodeImagesSection(node) + EventsSection(events);
}

std::string RenderTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  std::string text;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i + 1 == row.size()) {
        line += row[i];
      } else {
        line += row[i];
        line.append(widths[i] - row[i].size() + 3, ' ');
      }
    }
    while (!line.empty() && line.back() == ' ') {
      line.pop_back();
    }
    text += line + "\n";
  }
  return text;
}

std::string ToYaml(const json& value) {
  if (!IsBlock(value)) {
    return YamlScalar(value) + "\n";
  }
  std::string text;
  for (const std::string& line : YamlBlock(value)) {
    text += line + "\n";
  }
  return text;
}

std::string FormatMilli(int64_t milli) {
  const bool negative = milli < 0;
  const uint64_t magnitude =
      negative ? 0 - static_cast<uint64_t>(milli) : static_cast<uint64_t>(milli);
  std::string text = fmt::format("{}{}", negative ? "-" : "", magnitude / 1000);
  if (const uint64_t fraction = magnitude % 1000; fraction != 0) {
    std::string digits = fmt::format("{:03}", fraction);
    while (digits.back() == '0') {
      digits.pop_back();
    }
    text += "." + digits;
  }
  return text;
}

std::string FormatAge(int64_t seconds) {
  if (seconds < 0) {
    return "0s";
  }
  const int64_t minutes = seconds / 60;
  const int64_t hours = minutes / 60;
  const int64_t days = hours / 24;
  const int64_t years = days / 365;
  // With a remainder only while it still says something: "2m30s" but "17m".
  const auto two = [](int64_t big, const char* big_unit, int64_t small, const char* small_unit) {
    return small == 0 ? fmt::format("{}{}", big, big_unit)
                      : fmt::format("{}{}{}{}", big, big_unit, small, small_unit);
  };
  if (seconds < 120) {
    return fmt::format("{}s", seconds);
  }
  if (minutes < 10) {
    return two(minutes, "m", seconds % 60, "s");
  }
  if (minutes < 180) {
    return fmt::format("{}m", minutes);
  }
  if (hours < 8) {
    return two(hours, "h", minutes % 60, "m");
  }
  if (hours < 48) {
    return fmt::format("{}h", hours);
  }
  if (hours < 192) {
    return two(days, "d", hours % 24, "h");
  }
  if (days < 2 * 365) {
    return fmt::format("{}d", days);
  }
  if (years < 8) {
    return two(years, "y", days % 365, "d");
  }
  return fmt::format("{}y", years);
}

std::string QuoteCsvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) {
    return text;
  }
  std::string quoted = "\"";
  for (const char c : text) {
    quoted += c;
    if (c == '"') {
      quoted += '"';
    }
  }
  return quoted + "\"";
}

}  // namespace gpufleet::cli
