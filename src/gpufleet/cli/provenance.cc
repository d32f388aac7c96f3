// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/provenance.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/cli/commands.h"
#include "gpufleet/cli/format.h"

namespace gpufleet::cli {
namespace {

using nlohmann::json;

// The node labels agents set (core/cluster.h, wire/agent_protocol.h).
constexpr std::pair<const char*, const char*> kVersionLabels[] = {
    {"driver", "gpufleet.io/driver-version"},
    {"cuda", "gpufleet.io/cuda-version"},
    {"nvml", "gpufleet.io/nvml-version"}};

std::string Or(const json& value) {
  const std::string text = Text(value);
  return text.empty() ? kNone : text;
}

std::string Joined(const json& list, std::string_view separator) {
  std::vector<std::string> parts;
  if (list.is_array()) {
    for (const json& item : list) {
      parts.push_back(Text(item));
    }
  }
  return parts.empty() ? kNone : fmt::format("{}", fmt::join(parts, separator));
}

std::string Gpus(const json& gpus) {
  std::vector<std::string> parts;
  if (gpus.is_array()) {
    for (const json& gpu : gpus) {
      parts.push_back(fmt::format("{} (serial {}, VBIOS {})", Or(Member(gpu, "uuid")),
                                  Or(Member(gpu, "serial")), Or(Member(gpu, "vbios_version"))));
    }
  }
  return parts.empty() ? kNone : fmt::format("{}", fmt::join(parts, ", "));
}

std::string JoinedPairs(const json& map) {
  std::vector<std::string> parts;
  if (map.is_object()) {
    for (const auto& [key, value] : map.items()) {
      parts.push_back(fmt::format("{}={}", key, Text(value)));
    }
  }
  return parts.empty() ? kNone : fmt::format("{}", fmt::join(parts, " "));
}

int64_t AttemptOf(const json& record) {
  const json& attempt = Member(record, "attempt");
  return attempt.is_number_integer() ? attempt.get<int64_t>() : 0;
}

// The records of one attempt (the latest when `attempt` is 0), by task name.
std::map<std::string, json> RunOf(const json& records, int64_t attempt) {
  if (attempt == 0 && records.is_array()) {
    for (const json& record : records) {
      attempt = std::max(attempt, AttemptOf(record));
    }
  }
  std::map<std::string, json> out;
  if (records.is_array()) {
    for (const json& record : records) {
      if (AttemptOf(record) == attempt) {
        out[Text(Member(record, "task"))] = record;
      }
    }
  }
  return out;
}

// One record as the flat fields a diff compares.
std::map<std::string, std::string> Fields(const json& record) {
  std::map<std::string, std::string> out;
  for (const char* key :
       {"node", "image", "image_digest", "driver_version", "cuda_version", "nvml_version"}) {
    out[key] = Or(Member(record, key));
  }
  out["command"] = Joined(Member(record, "command"), " ");
  out["env_names"] = Joined(Member(record, "env_names"), ",");
  const json& gpus = Member(record, "gpus");
  out["gpus"] = std::to_string(gpus.is_array() ? gpus.size() : 0);
  if (gpus.is_array()) {
    for (size_t i = 0; i < gpus.size(); ++i) {
      for (const char* key : {"uuid", "serial", "vbios_version"}) {
        out[fmt::format("gpus[{}].{}", i, key)] = Or(Member(gpus[i], key));
      }
    }
  }
  return out;
}

}  // namespace

std::string DescribeProvenance(const json& records) {
  const std::map<std::string, json> run = RunOf(records, 0);
  if (run.empty()) {
    return "";
  }
  const int64_t attempt = AttemptOf(run.begin()->second);
  std::set<int64_t> earlier;
  if (records.is_array()) {
    for (const json& record : records) {
      if (AttemptOf(record) != attempt) {
        earlier.insert(AttemptOf(record));
      }
    }
  }
  std::string text = fmt::format("Provenance:  attempt {}", attempt);
  if (!earlier.empty()) {
    text += fmt::format(
        " (also recorded: attempt {}; gpufleet diff job NAME --attempt N "
        "--attempt M)",
        fmt::join(earlier, ", "));
  }
  text += "\n";
  std::vector<std::vector<std::string>> rows = {
      {"TASK", "NODE", "IMAGE", "DIGEST", "DRIVER", "CUDA", "NVML", "RECORDED"}};
  for (const auto& [task, record] : run) {
    rows.push_back({task, Or(Member(record, "node")), Or(Member(record, "image")),
                    Or(Member(record, "image_digest")), Or(Member(record, "driver_version")),
                    Or(Member(record, "cuda_version")), Or(Member(record, "nvml_version")),
                    Or(Member(record, "recorded_at"))});
  }
  for (const std::string& line : [&] {
         std::vector<std::string> lines;
         const std::string table = RenderTable(rows);
         size_t start = 0;
         while (start < table.size()) {
           const size_t end = table.find('\n', start);
           lines.push_back(table.substr(start, end - start));
           start = end + 1;
         }
         return lines;
       }()) {
    text += "  " + line + "\n";
  }
  for (const auto& [task, record] : run) {
    text += fmt::format("  {}:\n", task);
    text += fmt::format("    GPUs:       {}\n", Gpus(Member(record, "gpus")));
    text += fmt::format("    Command:    {}\n", Joined(Member(record, "command"), " "));
    text += fmt::format("    Env names:  {}\n", Joined(Member(record, "env_names"), ", "));
  }
  const json& first = run.begin()->second;
  text += fmt::format("  Job provenance:  {}\n", JoinedPairs(Member(first, "provenance")));
  text += fmt::format("  Job labels:      {}\n", JoinedPairs(Member(first, "labels")));
  return text;
}

std::string RenderProvenanceDiff(const json& a, const std::string& a_label, const json& b,
                                 const std::string& b_label) {
  const std::map<std::string, json> run_a = RunOf(a, 0);
  const std::map<std::string, json> run_b = RunOf(b, 0);
  std::vector<std::vector<std::string>> rows = {{"FIELD", a_label, b_label}};
  std::set<std::string> tasks;
  for (const auto* run : {&run_a, &run_b}) {
    for (const auto& [task, record] : *run) {
      tasks.insert(task);
    }
  }
  // The job's side (its provenance map and labels) once, from any record of each run.
  const auto job_side = [](const std::map<std::string, json>& run) {
    std::map<std::string, std::string> out;
    if (run.empty()) {
      return out;
    }
    for (const char* section : {"provenance", "labels"}) {
      const json& map = Member(run.begin()->second, section);
      if (map.is_object()) {
        for (const auto& [key, value] : map.items()) {
          out[fmt::format("{}.{}", section, key)] = Text(value);
        }
      }
    }
    return out;
  };
  const auto compare = [&](const std::string& prefix, const std::map<std::string, std::string>& x,
                           const std::map<std::string, std::string>& y) {
    std::set<std::string> keys;
    for (const auto* side : {&x, &y}) {
      for (const auto& [key, value] : *side) {
        keys.insert(key);
      }
    }
    for (const std::string& key : keys) {
      const auto ix = x.find(key);
      const auto iy = y.find(key);
      const std::string vx = ix == x.end() ? kNone : ix->second;
      const std::string vy = iy == y.end() ? kNone : iy->second;
      if (vx != vy) {
        rows.push_back({prefix + key, vx, vy});
      }
    }
  };
  compare("", job_side(run_a), job_side(run_b));
  for (const std::string& task : tasks) {
    const auto ia = run_a.find(task);
    const auto ib = run_b.find(task);
    if (ia == run_a.end() || ib == run_b.end()) {
      rows.push_back({task, ia == run_a.end() ? "(no record)" : "(recorded)",
                      ib == run_b.end() ? "(no record)" : "(recorded)"});
      continue;
    }
    compare(task + " ", Fields(ia->second), Fields(ib->second));
  }
  if (rows.size() == 1) {
    return fmt::format("no differences between {} and {}\n", a_label, b_label);
  }
  return RenderTable(rows);
}

int RunDiff(http::ApiClient& client, const DiffArgs& args, std::ostream& out, std::ostream& err) {
  constexpr char kUsage[] =
      "usage: diff job A B | diff job A --attempt N --attempt M | diff job A B --attempt N "
      "--attempt M";
  if (args.kind != "job" && args.kind != "jobs") {
    err << "error: diff takes job, not \"" << args.kind << "\"\n" << kUsage << "\n";
    return 1;
  }
  const bool two_jobs =
      args.names.size() == 2 && (args.attempts.empty() || args.attempts.size() == 2);
  const bool two_attempts = args.names.size() == 1 && args.attempts.size() == 2;
  if (!two_jobs && !two_attempts) {
    err << "error: " << kUsage << "\n";
    return 1;
  }
  std::vector<json> sides;
  std::vector<std::string> labels;
  for (size_t i = 0; i < 2; ++i) {
    const std::string& name = args.names[two_jobs ? i : 0];
    std::string path = "/v1/provenance?job=" + http::UrlEncode(name);
    int64_t attempt = 0;
    if (!args.attempts.empty()) {
      attempt = args.attempts[i];
      path += fmt::format("&attempt={}", attempt);
    }
    Result<json> answer = client.Get(path);
    if (!answer.ok()) {
      return PrintError(client, answer.status(), err);
    }
    const json& items = Member(*answer, "items");
    if (!items.is_array() || items.empty()) {
      err << "error: job " << name
          << (attempt > 0 ? fmt::format(" has no provenance records of attempt {}", attempt)
                          : std::string(" has no provenance records"))
          << "\n";
      return 1;
    }
    const std::map<std::string, json> run = RunOf(items, attempt);
    labels.push_back(fmt::format("{} (attempt {})", name, AttemptOf(run.begin()->second)));
    json records = json::array();
    for (const auto& [task, record] : run) {
      records.push_back(record);
    }
    sides.push_back(std::move(records));
  }
  out << RenderProvenanceDiff(sides[0], labels[0], sides[1], labels[1]);
  return 0;
}

std::string RenderVersionReport(const json& nodes) {
  // What each node reports: its version labels and, per image reference, the digest it holds.
  std::map<std::string, std::map<std::string, std::string>> values;  // what -> node -> value
  const json& items = Member(nodes, "items");
  size_t count = 0;
  if (items.is_array()) {
    for (const json& node : items) {
      const std::string name = Text(Member(node, "name"));
      ++count;
      for (const auto& [what, label] : kVersionLabels) {
        const std::string value = Text(Member(Member(node, "labels"), label));
        if (!value.empty()) {
          values[what][name] = value;
        }
      }
      const json& images = Member(node, "images");
      if (images.is_array()) {
        for (const json& image : images) {
          const json& references = Member(image, "references");
          if (!references.is_array()) {
            continue;
          }
          for (const json& reference : references) {
            values["image " + Text(reference)][name] = Text(Member(image, "digest"));
          }
        }
      }
    }
  }
  std::vector<std::vector<std::string>> rows = {{"WHAT", "MAJORITY", "NODES", "OFF MAJORITY"}};
  for (const auto& [what, by_node] : values) {
    if (what.starts_with("image ") && by_node.size() < 2) {
      continue;  // an image one node holds cannot be skewed
    }
    std::map<std::string, size_t> tally;
    for (const auto& [node, value] : by_node) {
      ++tally[value];
    }
    // The most common value; ties go to the smaller value, so the report is stable.
    const auto majority =
        std::max_element(tally.begin(), tally.end(),
                         [](const auto& x, const auto& y) { return x.second < y.second; });
    std::vector<std::string> off;
    for (const auto& [node, value] : by_node) {
      if (value != majority->first) {
        off.push_back(fmt::format("{} ({})", node, value));
      }
    }
    rows.push_back({what, majority->first, fmt::format("{}/{}", majority->second, by_node.size()),
                    off.empty() ? "-" : fmt::format("{}", fmt::join(off, ", "))});
  }
  std::string text = fmt::format("Fleet: {} nodes\n", count);
  if (rows.size() == 1) {
    return text + "no versions reported\n";
  }
  return text + RenderTable(rows);
}

}  // namespace gpufleet::cli
