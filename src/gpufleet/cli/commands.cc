// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/commands.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "gpufleet/cli/format.h"
#include "gpufleet/cli/provenance.h"
#include "gpufleet/core/rfc3339.h"

namespace gpufleet::cli {
namespace {

using nlohmann::json;

// "/v1/queues/research/nlp", "/v1/jobs/nlp/train": each segment of a name with slashes (a queue
// path, a job's or deployment's TEAM/NAME) encoded on its own, as the server reads them.
std::string ObjectPath(std::string_view collection, std::string_view name) {
  std::string path = fmt::format("/v1/{}", collection);
  for (size_t start = 0; start <= name.size();) {
    const size_t slash = std::min(name.find('/', start), name.size());
    path += "/" + http::UrlEncode(name.substr(start, slash - start));
    start = slash + 1;
  }
  return path;
}

// Only the client's own checks come here (never a server answer), so kubectl's "error:" form.
int PrintUsageError(std::string_view message, std::ostream& err) {
  err << "error: " << message << "\n";
  return 1;
}

std::string NameOf(const json& object, std::string_view fallback) {
  if (object.is_object()) {
    const auto it = object.find("name");
    if (it != object.end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
      return it->get<std::string>();
    }
  }
  return std::string(fallback);
}

std::string Lower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return lower;
}

std::string ContentTypeFor(const std::string& path, const std::string& text) {
  const std::string extension = Lower(std::filesystem::path(path).extension().string());
  if (extension == ".yaml" || extension == ".yml") {
    return "application/yaml";
  }
  if (extension == ".json") {
    return "application/json";
  }
  const size_t first = text.find_first_not_of(" \t\r\n");
  return first != std::string::npos && text[first] == '{' ? "application/json" : "application/yaml";
}

Result<std::string> ReadSpecFile(const std::string& path) {
  if (path.empty()) {
    return InvalidArgumentError("submit needs a job spec file: -f FILE");
  }
  return ReadTextFile(path, "job spec");
}

const char* NodeActionPath(NodeAction action) {
  switch (action) {
    case NodeAction::kCordon:
      return "cordon";
    case NodeAction::kUncordon:
      return "uncordon";
    case NodeAction::kDrain:
      return "drain";
    case NodeAction::kQuarantine:
      return "quarantine";
    case NodeAction::kRelease:
      return "release";
  }
  return "";
}

const char* NodeActionDone(NodeAction action) {
  switch (action) {
    case NodeAction::kCordon:
      return "cordoned";
    case NodeAction::kUncordon:
      return "uncordoned";
    case NodeAction::kDrain:
      return "drained";
    case NodeAction::kQuarantine:
      return "quarantined";
    case NodeAction::kRelease:
      return "released";
  }
  return "";
}

// Queues, teams and tokens have no GET route of their own: one is found in the list, by `key`.
Result<json> FindInList(http::ApiClient& client, const std::string& path, std::string_view what,
                        std::string_view key, const std::string& name) {
  GPUFLEET_ASSIGN_OR_RETURN(const json answer, client.Get(path));
  if (answer.is_object() && answer.contains("items") && answer["items"].is_array()) {
    for (const json& item : answer["items"]) {
      const auto it = item.is_object() ? item.find(key) : item.end();
      if (item.is_object() && it != item.end() && it->is_string() &&
          it->get<std::string>() == name) {
        return item;
      }
    }
  }
  return NotFoundError(fmt::format("{} \"{}\" not found", what, name));
}

// The list route of a kind.
std::string ListPath(ResourceKind kind) {
  switch (kind) {
    case ResourceKind::kJob:
      return "/v1/jobs";
    case ResourceKind::kNode:
      return "/v1/nodes";
    case ResourceKind::kQueue:
      return "/v1/queues";
    case ResourceKind::kTeam:
      return "/v1/teams";
    case ResourceKind::kToken:
      return "/v1/tokens";
  }
  return "";
}

int64_t UnixSeconds(const WallClock& clock) {
  return clock.UnixNanos() / 1'000'000'000;
}

// Adds `--FIELD MODEL=GPUS` entries to body[field]; with `removable`, "MODEL-" (as `kubectl label
// KEY-` removes a label) adds null, which removes the model from the queue's quota.
Status AddQuotaEntries(std::string_view field, const std::vector<std::string>& entries,
                       bool removable, json& body) {
  for (const std::string& entry : entries) {
    if (removable && entry.size() > 1 && entry.back() == '-' &&
        entry.find('=') == std::string::npos) {
      body[field][entry.substr(0, entry.size() - 1)] = nullptr;
      continue;
    }
    const size_t equals = entry.find('=');
    double gpus = 0;
    const char* end = entry.data() + entry.size();
    const auto parsed = equals == std::string::npos
                            ? std::from_chars_result{entry.data(), std::errc::invalid_argument}
                            : std::from_chars(entry.data() + equals + 1, end, gpus);
    if (equals == 0 || parsed.ec != std::errc() || parsed.ptr != end) {
      return InvalidArgumentError(
          fmt::format("--{} {}: expected MODEL=GPUS, e.g. H100-80GB=16 or *=8{}", field, entry,
                      removable ? ", or MODEL- to remove one" : ""));
    }
    body[field][entry.substr(0, equals)] = gpus;
  }
  return Status::Ok();
}

}  // namespace

std::string ReasonName(StatusCode code) {
  std::string reason;
  bool upper = true;
  for (const char c : std::string_view(StatusCodeName(code))) {
    if (c == '_') {
      upper = true;
      continue;
    }
    reason += upper ? c : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    upper = false;
  }
  return reason;
}

Result<std::string> ReadTextFile(const std::string& path, std::string_view what) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return InvalidArgumentError(fmt::format("cannot read {} \"{}\": is a directory", what, path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFoundError(fmt::format("cannot read {} \"{}\": {}", what, path,
                                     std::strerror(errno)));  // NOLINT(concurrency-mt-unsafe)
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int PrintError(const http::ApiClient& client, const Status& status, std::ostream& err) {
  if (client.last_error_from_server()) {
    err << "Error from server (" << ReasonName(status.code()) << "): " << status.message() << "\n";
  } else {
    err << "error: " << status.message() << "\n";
  }
  return 1;
}

namespace {

bool IsDeploymentKind(std::string_view kind) {
  return kind == "deployment" || kind == "deployments" || kind == "deploy";
}

std::vector<std::string> DeploymentRow(const json& deployment, int64_t now_unix_seconds) {
  const json& utilization = Member(deployment, "utilization_pct");
  const json& target = Member(Member(deployment, "autoscaling"), "target_utilization_pct");
  const Result<int64_t> created = ParseRfc3339(Text(Member(deployment, "created_at")));
  const std::string team = Text(Member(deployment, "team"));
  return {NameOf(deployment, "<none>"),
          team.empty() ? "<none>" : team,
          Text(Member(deployment, "desired_replicas")),
          Text(Member(deployment, "ready_replicas")),
          utilization.is_number() ? Text(utilization) + "%" : "<unknown>",
          target.is_number() ? Text(target) + "%" : "<unknown>",
          created.ok() ? FormatAge(now_unix_seconds - *created / 1'000'000'000) : "<unknown>"};
}

// `get deployments [NAME]`: kept apart from the generic kinds, whose tables live in format.cc.
int RunGetDeployments(http::ApiClient& client, const GetArgs& args, const WallClock& clock,
                      std::ostream& out, std::ostream& err) {
  Result<OutputFormat> format = ParseOutputFormat(args.output);
  if (!format.ok()) {
    return PrintUsageError(format.status().message(), err);
  }
  if (!args.state.empty() || !args.queue.empty()) {
    return PrintUsageError("--state and --queue filter jobs only", err);
  }
  Result<json> answer = client.Get(args.name.empty() ? std::string("/v1/deployments")
                                                     : ObjectPath("deployments", args.name));
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  if (*format == OutputFormat::kJson) {
    out << answer->dump(2) << "\n";
    return 0;
  }
  if (*format == OutputFormat::kYaml) {
    out << ToYaml(*answer);
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "TEAM", "DESIRED", "READY", "UTIL", "TARGET", "AGE"}};
  const json& items = args.name.empty() ? Member(*answer, "items") : json::array({*answer});
  for (const json& deployment : items.is_array() ? items : json::array()) {
    rows.push_back(DeploymentRow(deployment, UnixSeconds(clock)));
  }
  if (rows.size() == 1) {
    err << "No resources found.\n";
    return 0;
  }
  out << RenderTable(rows);
  return 0;
}

int RunCreateDeployment(http::ApiClient& client, const CreateArgs& args, std::ostream& out,
                        std::ostream& err) {
  if (args.file.empty() || !args.name.empty() || !args.team.empty() || !args.role.empty()) {
    return PrintUsageError("usage: create deployment -f FILE", err);
  }
  Result<std::string> text = ReadSpecFile(args.file);
  if (!text.ok()) {
    return PrintUsageError(text.status().message(), err);
  }
  Result<json> deployment = client.Post("/v1/deployments", *text, ContentTypeFor(args.file, *text));
  if (!deployment.ok()) {
    return PrintError(client, deployment.status(), err);
  }
  out << "deployment/" << NameOf(*deployment, "<unknown>") << " created\n";
  return 0;
}

// `describe deployment`: what the spec asks for, what the controller last measured and decided,
// each replica with its state (`states`: name -> state, absent when the job is gone) and events.
std::string DescribeDeployment(const json& deployment,
                               const std::map<std::string, std::string>& states,
                               const json& events) {
  auto text_or_none = [](const json& value) {
    const std::string text = Text(value);
    return text.empty() ? std::string("<none>") : text;
  };
  const json& autoscaling = Member(deployment, "autoscaling");
  const json& tasks = Member(Member(Member(deployment, "template"), "spec"), "tasks");
  static const json kAbsent;
  const json& gpus =
      tasks.is_array() && !tasks.empty() ? Member(Member(tasks[0], "resources"), "gpus") : kAbsent;
  std::string replica_gpus = Text(Member(gpus, "count"));
  if (const std::string model = Text(Member(gpus, "model")); !model.empty()) {
    replica_gpus += " x " + model;
  }
  if (const std::string mig = Text(Member(gpus, "migProfile")); !mig.empty()) {
    replica_gpus += " (" + mig + ")";
  }
  std::string text;
  text += Field("Name", text_or_none(Member(deployment, "name")));
  text += Field("Team", text_or_none(Member(deployment, "team")));
  text += Field("Queue", text_or_none(Member(deployment, "queue")));
  text += Field("Created", text_or_none(Member(deployment, "created_at")));
  text += Field("GPUs", replica_gpus.empty() ? "<none>" : replica_gpus + " per replica");
  text +=
      Field("Autoscaling", fmt::format("min {}, max {}, target {}% (tolerance {}%)",
                                       text_or_none(Member(autoscaling, "min_replicas")),
                                       text_or_none(Member(autoscaling, "max_replicas")),
                                       text_or_none(Member(autoscaling, "target_utilization_pct")),
                                       text_or_none(Member(autoscaling, "tolerance_pct"))));
  text += Field("Replicas", fmt::format("{} desired, {} ready",
                                        text_or_none(Member(deployment, "desired_replicas")),
                                        text_or_none(Member(deployment, "ready_replicas"))));
  const json& utilization = Member(deployment, "utilization_pct");
  text +=
      Field("Utilization", utilization.is_null() ? std::string("<none>") : Text(utilization) + "%");
  text += Field("Reason", text_or_none(Member(deployment, "reason")));
  text += Field("Version", text_or_none(Member(deployment, "version")));
  const json& replicas = Member(deployment, "replicas");
  if (!replicas.is_array() || replicas.empty()) {
    text += Field("Replica jobs", "<none>");
  } else {
    std::vector<std::vector<std::string>> rows = {{"JOB", "STATE"}};
    for (const json& replica : replicas) {
      const auto state = states.find(Text(replica));
      rows.push_back({Text(replica), state == states.end() ? "<gone>" : state->second});
    }
    text += "Replica jobs:\n" + Indent(RenderTable(rows), "  ");
  }
  return text + EventsSection(events);
}

int RunDescribeDeployment(http::ApiClient& client, const DescribeArgs& args, std::ostream& out,
                          std::ostream& err) {
  const std::string path = ObjectPath("deployments", args.name);
  Result<json> deployment = client.Get(path);
  if (!deployment.ok()) {
    return PrintError(client, deployment.status(), err);
  }
  Result<json> events = client.Get(path + "/events");
  if (!events.ok()) {
    return PrintError(client, events.status(), err);
  }
  std::map<std::string, std::string> states;
  const json& replicas = Member(*deployment, "replicas");
  // Replicas are named within the deployment's team: TEAM/NAME reaches them for an admin too.
  const std::string team = Text(Member(*deployment, "team"));
  for (const json& replica : replicas.is_array() ? replicas : json::array()) {
    const std::string job_name = team.empty() ? Text(replica) : team + "/" + Text(replica);
    Result<json> job = client.Get(ObjectPath("jobs", job_name));
    if (job.ok()) {
      states[Text(replica)] = Text(Member(*job, "state"));
    } else if (job.status().code() != StatusCode::kNotFound) {
      return PrintError(client, job.status(), err);
    }
  }
  out << DescribeDeployment(*deployment, states, *events);
  return 0;
}

int RunUpdateDeployment(http::ApiClient& client, const UpdateArgs& args, std::ostream& out,
                        std::ostream& err) {
  if (args.name.empty()) {
    return PrintUsageError("usage: update deployment NAME [--min N] [--max N] [--target PCT]", err);
  }
  if (!args.guarantee.empty() || !args.limit.empty() || args.weight || args.borrow ||
      args.no_borrow) {
    return PrintUsageError(
        "update deployment takes --min, --max and --target; the others are for queues", err);
  }
  json autoscaling = json::object();
  if (args.min_replicas) {
    autoscaling["min_replicas"] = *args.min_replicas;
  }
  if (args.max_replicas) {
    autoscaling["max_replicas"] = *args.max_replicas;
  }
  if (args.target_pct) {
    autoscaling["target_utilization_pct"] = *args.target_pct;
  }
  if (autoscaling.empty()) {
    return PrintUsageError("update deployment needs at least one of --min, --max, --target", err);
  }
  const json body = {{"autoscaling", autoscaling}};
  Result<json> answer =
      client.Patch(ObjectPath("deployments", args.name), body.dump(), "application/json");
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  out << "deployment/" << NameOf(*answer, args.name) << " updated\n";
  return 0;
}

int RunDeleteDeployment(http::ApiClient& client, const DeleteArgs& args, std::ostream& out,
                        std::ostream& err) {
  if (args.name.empty()) {
    return PrintUsageError("usage: delete deployment NAME", err);
  }
  Result<json> answer = client.Delete(ObjectPath("deployments", args.name));
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  out << "deployment/" << NameOf(*answer, args.name) << " deleted\n";
  return 0;
}

}  // namespace

int RunSubmit(http::ApiClient& client, const SubmitArgs& args, std::ostream& out,
              std::ostream& err) {
  Result<std::string> text = ReadSpecFile(args.file);
  if (!text.ok()) {
    return PrintUsageError(text.status().message(), err);
  }
  Result<json> job = client.Post(args.strict ? "/v1/jobs?strict=true" : "/v1/jobs", *text,
                                 ContentTypeFor(args.file, *text));
  if (!job.ok()) {
    return PrintError(client, job.status(), err);
  }
  out << "job/" << NameOf(*job, "<unknown>") << " created\n";
  if (const auto it = job->find("warnings"); it != job->end() && it->is_array()) {
    for (const json& warning : *it) {
      err << "warning: " << Text(warning) << "\n";
    }
  }
  return 0;
}

int RunGet(http::ApiClient& client, const GetArgs& args, const WallClock& clock, std::ostream& out,
           std::ostream& err) {
  if (IsDeploymentKind(args.kind)) {
    return RunGetDeployments(client, args, clock, out, err);
  }
  Result<ResourceKind> kind = ParseResourceKind(args.kind);
  if (!kind.ok()) {
    return PrintUsageError(kind.status().message(), err);
  }
  Result<OutputFormat> format = ParseOutputFormat(args.output);
  if (!format.ok()) {
    return PrintUsageError(format.status().message(), err);
  }
  if (*kind != ResourceKind::kJob && (!args.state.empty() || !args.queue.empty())) {
    return PrintUsageError("--state and --queue filter jobs only", err);
  }
  if (!args.name.empty()) {
    Result<json> object = Status(StatusCode::kInternal, "unset");
    switch (*kind) {
      case ResourceKind::kJob:
        object = client.Get(ObjectPath("jobs", args.name));
        break;
      case ResourceKind::kNode:
        object = client.Get("/v1/nodes/" + http::UrlEncode(args.name));
        break;
      case ResourceKind::kQueue:
        object = FindInList(client, ListPath(*kind), "queue", "name", args.name);
        break;
      case ResourceKind::kTeam:
        object = FindInList(client, ListPath(*kind), "team", "name", args.name);
        break;
      case ResourceKind::kToken:
        object = FindInList(client, ListPath(*kind), "token", "id", args.name);
        break;
    }
    if (!object.ok()) {
      return PrintError(client, object.status(), err);
    }
    out << RenderObject(*kind, *object, *format, UnixSeconds(clock));
    return 0;
  }
  std::string path = ListPath(*kind);
  if (*kind == ResourceKind::kJob) {
    std::vector<std::string> query;
    if (!args.state.empty()) {
      query.push_back("state=" + http::UrlEncode(args.state));
    }
    if (!args.queue.empty()) {
      query.push_back("queue=" + http::UrlEncode(args.queue));
    }
    for (size_t i = 0; i < query.size(); ++i) {
      path += (i == 0 ? "?" : "&") + query[i];
    }
  }
  Result<json> answer = client.Get(path);
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  const std::string text = RenderList(*kind, *answer, *format, UnixSeconds(clock));
  if (text.empty()) {
    err << "No resources found.\n";
    return 0;
  }
  out << text;
  return 0;
}

int RunDescribe(http::ApiClient& client, const DescribeArgs& args, const WallClock& clock,
                std::ostream& out, std::ostream& err) {
  if (IsDeploymentKind(args.kind)) {
    return args.name.empty() ? PrintUsageError("describe deployment needs a NAME", err)
                             : RunDescribeDeployment(client, args, out, err);
  }
  Result<ResourceKind> kind = ParseResourceKind(args.kind);
  if (!kind.ok()) {
    return PrintUsageError(kind.status().message(), err);
  }
  if (args.name.empty()) {
    return PrintUsageError(fmt::format("describe {} needs a NAME", args.kind), err);
  }
  const std::string name = http::UrlEncode(args.name);
  switch (*kind) {
    case ResourceKind::kJob: {
      const std::string path = ObjectPath("jobs", args.name);
      Result<json> job = client.Get(path);
      if (!job.ok()) {
        return PrintError(client, job.status(), err);
      }
      Result<json> events = client.Get(path + "/events");
      if (!events.ok()) {
        return PrintError(client, events.status(), err);
      }
      out << DescribeJob(*job, *events, UnixSeconds(clock));
      // A server before provenance records answers 404: the section is left out.
      if (Result<json> records = client.Get("/v1/provenance?job=" + http::UrlEncode(args.name));
          records.ok()) {
        out << DescribeProvenance(Member(*records, "items"));
      }
      return 0;
    }
    case ResourceKind::kNode: {
      Result<json> node = client.Get("/v1/nodes/" + name);
      if (!node.ok()) {
        return PrintError(client, node.status(), err);
      }
      Result<json> events = client.Get("/v1/nodes/" + name + "/events");
      if (!events.ok() && events.status().code() == StatusCode::kPermissionDenied) {
        events = json{{"items", json::array()}};  // a node's events are for admins
      }
      if (!events.ok()) {
        return PrintError(client, events.status(), err);
      }
      out << DescribeNode(*node, *events);
      return 0;
    }
    case ResourceKind::kQueue:
    case ResourceKind::kTeam:
    case ResourceKind::kToken:
      break;
  }
  return PrintUsageError("describe takes job, node or deployment", err);
}

namespace {

// `explain job`'s text: the answer of GET /v1/jobs/NAME/explain.
std::string RenderExplanation(const json& answer) {
  std::string text;
  const json& evidence = Member(answer, "evidence");
  const int64_t position = Member(answer, "queuePosition").is_number_integer()
                               ? Member(answer, "queuePosition").get<int64_t>()
                               : 0;
  text += Field(
      "Job", fmt::format(
                 "{} ({}{})", Text(Member(answer, "job")), Text(Member(answer, "phase")),
                 position > 0 ? fmt::format(", number {} in the queue", position) : std::string()));
  text += Field("Reason", Text(Member(answer, "reason")));
  text += Field("Message", Text(Member(answer, "message")));
  if (const json& nodes = Member(evidence, "nodes"); nodes.is_object()) {
    text += Field("Nodes",
                  fmt::format("{} fit a task now, {} lack free resources, {} are excluded by its "
                              "constraints, {} are unhealthy or not Ready",
                              Text(Member(nodes, "fits")), Text(Member(nodes, "capacity")),
                              Text(Member(nodes, "constraints")), Text(Member(nodes, "health"))));
    text += Field("GPUs", fmt::format("needs {}, {} free that it may use",
                                      Text(Member(evidence, "neededGpus")),
                                      Text(Member(evidence, "freeGpus"))));
  }
  if (const json& best = Member(evidence, "bestDomain"); best.is_object()) {
    text += Field("Best domain",
                  fmt::format("{} {}: {} GPUs free of {}, lacks {}", Text(Member(best, "level")),
                              Text(Member(best, "name")), Text(Member(best, "freeGpus")),
                              Text(Member(best, "totalGpus")), Text(Member(best, "lacksGpus"))));
  }
  const json& eta = Member(answer, "eta");
  const std::string at = Text(Member(eta, "at"));
  // Relative to now beside the absolute time: "in 4m" reads at a glance, the time stays exact.
  const json& in = Member(eta, "inSeconds");
  const std::string relative = !in.is_number_integer() ? std::string()
                               : in.get<int64_t>() <= 0
                                   ? std::string("now; ")
                                   : fmt::format("in {}; ", FormatAge(in.get<int64_t>()));
  text +=
      Field("ETA", at.empty() ? Text(Member(eta, "why"))
                              : fmt::format("{} ({}{})", at, relative, Text(Member(eta, "why"))));
  if (const json& ahead = Member(answer, "ahead"); ahead.is_array() && !ahead.empty()) {
    std::vector<std::vector<std::string>> rows = {{"JOB", "GPUS"}};
    for (const json& job : ahead) {
      if (Member(job, "hidden").is_number()) {
        rows.push_back({fmt::format("({} of other teams)", Text(Member(job, "hidden"))), ""});
      } else if (Member(job, "more").is_number()) {
        rows.push_back({fmt::format("({} more)", Text(Member(job, "more"))), ""});
      } else {
        rows.push_back({Text(Member(job, "name")), Text(Member(job, "gpus"))});
      }
    }
    text += "Ahead:\n" + Indent(RenderTable(rows), "  ");
  }
  if (const json& what_ifs = Member(answer, "whatIf"); what_ifs.is_array() && !what_ifs.empty()) {
    std::vector<std::vector<std::string>> rows = {{"WHAT IF", "STARTS NOW", "DETAIL"}};
    for (const json& what_if : what_ifs) {
      rows.push_back({Text(Member(what_if, "change")),
                      Member(what_if, "wouldStartNow") == true ? "yes" : "no",
                      Text(Member(what_if, "detail"))});
    }
    text += "What if:\n" + Indent(RenderTable(rows), "  ");
  }
  return text;
}

}  // namespace

namespace {

// What `logs` has printed of one task run's log: the byte of the whole log it printed up to.
struct PrintedLog {
  int64_t upto = 0;
  bool final = false;
};

// Prints the part of `item`'s tail that `printed` has not printed, each line with `prefix`;
// says on `err`, naming the run by `label`, when bytes were skipped (before the tail, or the
// log was cut on the node).
void PrintLogTail(const json& item, const std::string& label, const std::string& prefix,
                  PrintedLog& printed, std::ostream& out, std::ostream& err) {
  const std::string text = Text(Member(item, "text"));
  const int64_t size =
      Member(item, "size").is_number_integer() ? Member(item, "size").get<int64_t>() : 0;
  const int64_t from = size - static_cast<int64_t>(text.size());
  if (size < printed.upto) {
    err << fmt::format("[{}: the log was cut on the node; it starts again]\n", label);
    printed.upto = 0;
  }
  if (from > printed.upto) {
    err << fmt::format("[{}: {} bytes before this are on node {} only]\n", label,
                       from - printed.upto, Text(Member(item, "node")));
    printed.upto = from;
  }
  const std::string fresh = text.substr(static_cast<size_t>(printed.upto - from));
  printed.upto = size;
  printed.final = Member(item, "final").is_boolean() && Member(item, "final").get<bool>();
  for (size_t start = 0; start < fresh.size();) {
    const size_t end = std::min(fresh.find('\n', start), fresh.size());
    out << prefix << (prefix.empty() ? "" : " ") << fresh.substr(start, end - start) << "\n";
    start = end + 1;
  }
}

bool JobHasEnded(std::string_view state) {
  return state == "Succeeded" || state == "Failed" || state == "Cancelled";
}

}  // namespace

int RunLogs(http::ApiClient& client, const LogsArgs& args,
            const std::function<void(std::chrono::milliseconds)>& wait, std::ostream& out,
            std::ostream& err) {
  if (args.name.empty()) {
    return PrintUsageError("logs needs a JOB", err);
  }
  std::string path = ObjectPath("jobs", args.name) + "/logs";
  if (!args.task.empty()) {
    path += "?task=" + http::UrlEncode(args.task);
  }
  std::map<std::string, PrintedLog> printed;  // by TASK#ATTEMPT
  std::set<std::string> said;                 // what was said on err once
  for (int polls_after_end = 0;;) {
    const Result<json> answer = client.Get(path);
    if (!answer.ok()) {
      return PrintError(client, answer.status(), err);
    }
    const json& items = Member(*answer, "items");
    std::set<std::string> tasks;
    std::set<std::string> attempts;
    for (const json& item : items.is_array() ? items : json::array()) {
      tasks.insert(Text(Member(item, "task")));
      attempts.insert(Text(Member(item, "attempt")));
    }
    bool all_final = true;
    for (const json& item : items.is_array() ? items : json::array()) {
      const std::string run =
          fmt::format("{}#{}", Text(Member(item, "task")), Text(Member(item, "attempt")));
      const std::string label = attempts.size() > 1 ? run : Text(Member(item, "task"));
      const std::string prefix =
          attempts.size() > 1 || tasks.size() > 1 ? fmt::format("[{}]", label) : std::string();
      if (Member(item, "text").is_null()) {
        all_final = false;
        if (said.insert(run).second) {
          err << fmt::format("[{} on node {}: {}]\n", run, Text(Member(item, "node")),
                             Text(Member(item, "why")));
        }
        continue;
      }
      PrintedLog& log = printed[run];
      PrintLogTail(item, label, prefix, log, out, err);
      all_final = all_final && log.final;
    }
    if (const std::string why = Text(Member(*answer, "why"));
        !why.empty() && said.insert(why).second) {
      err << fmt::format("[job {} ({}): {}]\n", args.name, Text(Member(*answer, "state")), why);
    }
    if (!args.follow) {
      return 0;
    }
    if (JobHasEnded(Text(Member(*answer, "state")))) {
      // A job that ended without runs has nothing to wait for.
      if (tasks.empty() || (all_final && !printed.empty()) ||
          ++polls_after_end > kLogsFollowPollsAfterEnd) {
        return 0;
      }
    }
    out.flush();  // as `tail -f` does: a pipe (`logs -f | grep`) sees each line as it comes
    wait(kLogsFollowInterval);
  }
}

int RunExplain(http::ApiClient& client, const ExplainArgs& args, std::ostream& out,
               std::ostream& err) {
  const Result<ResourceKind> kind = ParseResourceKind(args.kind);
  if (!kind.ok() || *kind != ResourceKind::kJob) {
    return PrintUsageError(fmt::format("explain takes job, not \"{}\"", args.kind), err);
  }
  if (args.name.empty()) {
    return PrintUsageError("explain job needs a NAME", err);
  }
  const Result<OutputFormat> format = ParseOutputFormat(args.output);
  if (!format.ok()) {
    return PrintUsageError(format.status().message(), err);
  }
  const Result<json> answer = client.Get(ObjectPath("jobs", args.name) + "/explain");
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  switch (*format) {
    case OutputFormat::kJson:
      out << answer->dump(2) << "\n";
      break;
    case OutputFormat::kYaml:
      out << ToYaml(*answer);
      break;
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      out << RenderExplanation(*answer);
      break;
  }
  return 0;
}

int RunCreate(http::ApiClient& client, const CreateArgs& args, std::ostream& out,
              std::ostream& err) {
  if (IsDeploymentKind(args.kind)) {
    return RunCreateDeployment(client, args, out, err);
  }
  const Result<ResourceKind> kind = ParseResourceKind(args.kind);
  const bool creatable =
      kind.ok() && (*kind == ResourceKind::kTeam || *kind == ResourceKind::kQueue ||
                    *kind == ResourceKind::kToken);
  if (!creatable) {
    return PrintUsageError(
        fmt::format("create takes team, queue, token or deployment, not \"{}\"", args.kind), err);
  }
  json body = json::object();
  std::string path;
  switch (*kind) {
    case ResourceKind::kTeam:
      if (args.name.empty() || !args.team.empty() || !args.role.empty()) {
        return PrintUsageError("usage: create team NAME", err);
      }
      body["name"] = args.name;
      path = "/v1/teams";
      break;
    case ResourceKind::kQueue: {
      if (args.name.empty() || !args.role.empty()) {
        return PrintUsageError(
            "usage: create queue NAME [--team TEAM] [--guarantee MODEL=GPUS]... "
            "[--limit MODEL=GPUS]... [--weight W] [--no-borrow] [--allow-host-network]",
            err);
      }
      body["name"] = args.name;
      if (!args.team.empty()) {
        body["team"] = args.team;
      }
      for (const auto& [field, entries] :
           {std::pair{"guarantee", &args.guarantee}, std::pair{"limit", &args.limit}}) {
        if (const Status status = AddQuotaEntries(field, *entries, false, body); !status.ok()) {
          return PrintUsageError(status.message(), err);
        }
      }
      if (args.weight) {
        body["weight"] = *args.weight;
      }
      if (args.no_borrow) {
        body["may_borrow"] = false;
      }
      if (args.allow_host_network) {
        body["allow_host_network"] = true;
      }
      path = "/v1/queues";
      break;
    }
    default: {
      const std::string& name = args.token_name.empty() ? args.name : args.token_name;
      if (args.role.empty() || name.empty()) {
        return PrintUsageError(
            "usage: create token --role admin|member|agent [--team TEAM] [--node NODE] --name NAME",
            err);
      }
      body = {{"role", args.role}, {"name", name}};
      if (!args.team.empty()) {
        body["team"] = args.team;
      }
      if (!args.node.empty()) {
        body["node"] = args.node;
      }
      path = "/v1/tokens";
      break;
    }
  }
  Result<json> answer = client.Post(path, body.dump(), "application/json");
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  if (*kind == ResourceKind::kToken) {
    const json& token = *answer;
    const auto text_of = [&token](const char* key) {
      return token.is_object() && token.contains(key) && token[key].is_string()
                 ? token[key].get<std::string>()
                 : std::string("<unknown>");
    };
    out << "token/" << text_of("id") << " created\n";
    out << "token (shown once, keep it): " << text_of("token") << "\n";
    return 0;
  }
  out << (*kind == ResourceKind::kTeam ? "team/" : "queue/") << NameOf(*answer, args.name)
      << " created\n";
  return 0;
}

int RunUpdate(http::ApiClient& client, const UpdateArgs& args, std::ostream& out,
              std::ostream& err) {
  if (IsDeploymentKind(args.kind)) {
    return RunUpdateDeployment(client, args, out, err);
  }
  const Result<ResourceKind> kind = ParseResourceKind(args.kind);
  if (!kind.ok() || *kind != ResourceKind::kQueue) {
    return PrintUsageError(fmt::format("update takes queue or deployment, not \"{}\"", args.kind),
                           err);
  }
  if (args.name.empty()) {
    return PrintUsageError(
        "usage: update queue NAME [--guarantee MODEL=GPUS|MODEL-]... [--limit "
        "MODEL=GPUS|MODEL-]... "
        "[--weight W] [--borrow|--no-borrow] [--allow-host-network|--no-host-network]",
        err);
  }
  if (args.borrow && args.no_borrow) {
    return PrintUsageError("--borrow and --no-borrow contradict each other", err);
  }
  if (args.allow_host_network && args.no_host_network) {
    return PrintUsageError("--allow-host-network and --no-host-network contradict each other", err);
  }
  json body = json::object();
  for (const auto& [field, entries] :
       {std::pair{"guarantee", &args.guarantee}, std::pair{"limit", &args.limit}}) {
    if (const Status status = AddQuotaEntries(field, *entries, true, body); !status.ok()) {
      return PrintUsageError(status.message(), err);
    }
  }
  if (args.weight) {
    body["weight"] = *args.weight;
  }
  if (args.borrow || args.no_borrow) {
    body["may_borrow"] = args.borrow;
  }
  if (args.allow_host_network || args.no_host_network) {
    body["allow_host_network"] = args.allow_host_network;
  }
  if (body.empty()) {
    return PrintUsageError(
        "update queue needs at least one of --guarantee, --limit, --weight, --borrow, --no-borrow, "
        "--allow-host-network, --no-host-network",
        err);
  }
  Result<json> answer =
      client.Patch(ObjectPath("queues", args.name), body.dump(), "application/json");
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  out << "queue/" << NameOf(*answer, args.name) << " updated\n";
  return 0;
}

int RunDelete(http::ApiClient& client, const DeleteArgs& args, std::ostream& out,
              std::ostream& err) {
  if (IsDeploymentKind(args.kind)) {
    return RunDeleteDeployment(client, args, out, err);
  }
  const Result<ResourceKind> kind = ParseResourceKind(args.kind);
  if (!kind.ok() || (*kind != ResourceKind::kQueue && *kind != ResourceKind::kNode)) {
    return PrintUsageError(
        fmt::format("delete takes queue, node or deployment, not \"{}\"", args.kind), err);
  }
  const bool node = *kind == ResourceKind::kNode;
  if (args.name.empty()) {
    return PrintUsageError(node ? "usage: delete node NAME" : "usage: delete queue NAME", err);
  }
  Result<json> answer = client.Delete(node ? "/v1/nodes/" + http::UrlEncode(args.name)
                                           : ObjectPath("queues", args.name));
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  out << (node ? "node/" : "queue/") << NameOf(*answer, args.name) << " deleted\n";
  return 0;
}

int RunRevoke(http::ApiClient& client, const RevokeArgs& args, std::ostream& out,
              std::ostream& err) {
  const Result<ResourceKind> kind = ParseResourceKind(args.kind);
  if (!kind.ok() || *kind != ResourceKind::kToken) {
    return PrintUsageError(fmt::format("revoke takes token, not \"{}\"", args.kind), err);
  }
  if (args.id.empty()) {
    return PrintUsageError("usage: revoke token ID (the ID column of `get tokens`)", err);
  }
  Result<json> answer = client.Post("/v1/tokens/" + http::UrlEncode(args.id) + "/revoke", "", "");
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  out << "token/" << args.id << " revoked\n";
  return 0;
}

int RunCancel(http::ApiClient& client, const std::string& job, std::ostream& out,
              std::ostream& err) {
  if (job.empty()) {
    return PrintUsageError("cancel needs a job NAME", err);
  }
  Result<json> answer = client.Post(ObjectPath("jobs", job) + "/cancel", "", "");
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  out << "job/" << NameOf(*answer, job) << " cancelled";
  if (answer->is_object() && answer->value("state", "") == "Stopping") {
    out << " (Stopping: its tasks are told to stop; its GPUs are free once they have ended)";
  }
  out << "\n";
  return 0;
}

int RunResume(http::ApiClient& client, const std::string& job, std::ostream& out,
              std::ostream& err) {
  if (job.empty()) {
    return PrintUsageError("resume needs a job NAME", err);
  }
  Result<json> answer = client.Post(ObjectPath("jobs", job) + "/resume", "", "");
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  out << "job/" << NameOf(*answer, job) << " resumed\n";
  return 0;
}

int RunNodeAction(http::ApiClient& client, NodeAction action, const NodeArgs& given,
                  std::ostream& out, std::ostream& err) {
  NodeArgs args = given;
  const bool takes_gpu = action == NodeAction::kQuarantine || action == NodeAction::kRelease;
  // NODE/GPU names one GPU as --gpu does.
  if (const size_t slash = args.node.rfind('/'); takes_gpu && slash != std::string::npos) {
    const std::string index = args.node.substr(slash + 1);
    int parsed = -1;
    const auto [end, error] = std::from_chars(index.data(), index.data() + index.size(), parsed);
    if (error != std::errc() || end != index.data() + index.size() || parsed < 0 ||
        (args.gpu.has_value() && *args.gpu != parsed)) {
      return PrintUsageError(
          fmt::format("NODE: \"{}\" (expected NODE or NODE/GPU, one GPU index)", args.node), err);
    }
    args.node.resize(slash);
    args.gpu = parsed;
  }
  if (args.node.empty()) {
    return PrintUsageError(fmt::format("{} needs a NODE", NodeActionPath(action)), err);
  }
  if (args.gpu.has_value() && (!takes_gpu || *args.gpu < 0)) {
    return PrintUsageError(takes_gpu ? fmt::format("--gpu {} is not a GPU index", *args.gpu)
                                     : fmt::format("{} takes no --gpu", NodeActionPath(action)),
                           err);
  }
  if (!args.reason.empty() && action != NodeAction::kQuarantine) {
    return PrintUsageError(fmt::format("{} takes no --reason", NodeActionPath(action)), err);
  }
  const std::string path =
      fmt::format("/v1/nodes/{}/{}", http::UrlEncode(args.node), NodeActionPath(action));
  json request = json::object();
  if (args.gpu.has_value()) {
    request["gpu"] = *args.gpu;
  }
  if (!args.reason.empty()) {
    request["reason"] = args.reason;
  }
  std::string body;
  std::string content_type;
  if (!request.empty()) {
    body = request.dump();
    content_type = "application/json";
  }
  Result<json> answer = client.Post(path, body, content_type);
  if (!answer.ok()) {
    return PrintError(client, answer.status(), err);
  }
  out << "node/" << NameOf(*answer, args.node);
  if (args.gpu.has_value()) {
    out << " gpu " << *args.gpu;
  }
  out << " " << NodeActionDone(action) << "\n";
  return 0;
}

}  // namespace gpufleet::cli
