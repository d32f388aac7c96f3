// SPDX-License-Identifier: Apache-2.0
// The client verbs of `gpufleet` (`submit`, `get`, `describe`, `explain`, `logs`, `cancel`,
// `resume`, `create`, `update`, `delete`, `revoke`, `cordon`, `uncordon`, `drain`, `quarantine`,
// `release`, `report`): flags here, the work in `gpufleet/cli/commands.h` and
// `gpufleet/cli/report.h`.
#include <algorithm>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/cli/commands.h"
#include "gpufleet/cli/config.h"
#include "gpufleet/cli/export_jobs.h"
#include "gpufleet/cli/format.h"
#include "gpufleet/cli/provenance.h"
#include "gpufleet/cli/report.h"
#include "gpufleet/cli/terminal.h"
#include "gpufleet/cli/usage_report.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/http/client.h"
#include "gpufleet/sim/slurm_failures.h"
#include "gpufleet/sim/slurm_history.h"

#include "subcommands.h"

namespace gpufleet::app {
namespace {

// `report failures --sacct FILE`: the failure report over a Slurm history, no server needed.
struct SlurmReportFlags {
  std::string sacct;
  std::string slurm_nodes;
  std::vector<int> infra_exit_codes;
  std::string timeouts = "hang";
  int top = 20;
};

// Prints the report on a Slurm history; 0, or 1 after printing the error.
int RunSlurmFailureReport(const SlurmReportFlags& flags, const std::string& output) {
  Result<cli::OutputFormat> format = cli::ParseOutputFormat(output);
  if (!format.ok()) {
    std::cerr << "error: " << format.status().message() << "\n";
    return 1;
  }
  if (flags.timeouts != "hang" && flags.timeouts != "app") {
    std::cerr << "error: --timeouts: \"" << flags.timeouts << "\" (expected hang or app)\n";
    return 1;
  }
  GpuCatalog catalog = GpuCatalog::Default();
  sim::SacctOptions sacct;
  sim::SlurmFailureOptions options;
  options.infra_exit_codes.insert(flags.infra_exit_codes.begin(), flags.infra_exit_codes.end());
  options.timeouts_are_hangs = flags.timeouts == "hang";
  options.attribution.report_top = std::max(flags.top, 0);
  if (!flags.slurm_nodes.empty()) {
    std::ifstream in(flags.slurm_nodes);
    if (!in) {
      std::cerr << "error: " << flags.slurm_nodes << ": cannot open file\n";
      return 1;
    }
    std::stringstream text;
    text << in.rdbuf();
    Result<std::vector<sim::SlurmNodeShape>> nodes =
        sim::ParseScontrolNodes(text.str(), flags.slurm_nodes, sacct, catalog);
    if (!nodes.ok()) {
      std::cerr << "error: " << nodes.status().message() << "\n";
      return 1;
    }
    options.nodes = *std::move(nodes);
  }
  std::ifstream in(flags.sacct);
  if (!in) {
    std::cerr << "error: " << flags.sacct << ": cannot open file\n";
    return 1;
  }
  Result<sim::SlurmFailureReport> report =
      sim::AnalyzeSacctFailures(in, flags.sacct, sacct, options, catalog);
  if (!report.ok()) {
    std::cerr << "error: " << report.status().message() << "\n";
    return 1;
  }
  switch (*format) {
    case cli::OutputFormat::kJson:
      sim::WriteSlurmFailureJson(*report, std::cout);
      break;
    case cli::OutputFormat::kYaml: {
      std::ostringstream json;
      sim::WriteSlurmFailureJson(*report, json);
      std::cout << cli::ToYaml(nlohmann::json::parse(json.str()));
      break;
    }
    case cli::OutputFormat::kTable:
    case cli::OutputFormat::kWide:
      std::cout << sim::RenderSlurmFailureReport(
          *report, *format == cli::OutputFormat::kWide ? flags.top : std::min(flags.top, 10));
      break;
  }
  return 0;
}

// Every flag of every verb; CLI11 writes into it while parsing, so it outlives the parse.
struct CliState {
  std::string server;
  std::string token;
  std::string ca_cert;
  cli::SubmitArgs submit;
  cli::GetArgs get;
  cli::DescribeArgs describe;
  cli::ExplainArgs explain;
  cli::LogsArgs logs;
  cli::DiffArgs diff;
  std::string cancel;
  std::string resume;
  cli::CreateArgs create;
  cli::UpdateArgs update;
  cli::RevokeArgs revoke;
  cli::DeleteArgs delete_args;
  cli::NodeArgs node;
  cli::ReportArgs report;
  cli::UsageReportArgs usage;
  cli::ExportArgs export_args;
  CLI::App* report_verb = nullptr;
  SlurmReportFlags slurm_report;
  int gpu = 0;
  std::vector<std::pair<CLI::App*, std::function<int(http::ApiClient&)>>> verbs;
};

// A verb with the global flags; `run` is what it does once parsed.
void AddVerb(CliState& state, CLI::App* verb, std::function<int(http::ApiClient&)> run) {
  verb->group(kCliGroup);
  verb->add_option("--server", state.server,
                   "server address, http(s)://host:port, or several comma-separated (the "
                   "leader is followed; docs/ha.md) (else $GPUFLEET_ADDR, "
                   "~/.config/gpufleet/config, http://127.0.0.1:8080)");
  verb->add_option("--token", state.token,
                   "bearer token (else $GPUFLEET_TOKEN, ~/.config/gpufleet/config)");
  verb->add_option("--ca-cert", state.ca_cert,
                   "PEM CA certificate that signed an https:// server's certificate (else "
                   "$GPUFLEET_CA_CERT, ~/.config/gpufleet/config, the system's)");
  state.verbs.emplace_back(verb, std::move(run));
}

void AddNodeVerb(CLI::App& app, CliState& state, const std::string& name,
                 const std::string& description, cli::NodeAction action, bool takes_gpu) {
  CLI::App* verb = app.add_subcommand(name, description);
  verb->add_option("NODE", state.node.node,
                   takes_gpu ? "node name, or NODE/GPU for one GPU" : "node name")
      ->required();
  CLI::Option* gpu =
      takes_gpu ? verb->add_option("--gpu", state.gpu, "one GPU index (default: every GPU)")
                : nullptr;
  if (action == cli::NodeAction::kQuarantine) {
    verb->add_option("--reason", state.node.reason,
                     "why, stored with the quarantine and shown on the node and failure report");
  }
  AddVerb(state, verb, [&state, action, gpu](http::ApiClient& client) {
    if (gpu != nullptr && gpu->count() > 0) {
      state.node.gpu = state.gpu;
    }
    return cli::RunNodeAction(client, action, state.node, std::cout, std::cerr);
  });
}

}  // namespace

Action AddCliCommands(CLI::App& app) {
  auto state = std::make_shared<CliState>();
  CliState& s = *state;

  CLI::App* submit = app.add_subcommand("submit", "submit a job spec (YAML or JSON)");
  submit->add_option("-f,--filename", s.submit.file, "the job spec file")->required();
  submit->add_flag("--strict", s.submit.strict,
                   "refuse a job that no node of the fleet could ever hold (else a warning)");
  AddVerb(s, submit, [&s](http::ApiClient& client) {
    return cli::RunSubmit(client, s.submit, std::cout, std::cerr);
  });

  CLI::App* get = app.add_subcommand(
      "get", "list jobs, nodes, queues, teams, tokens or deployments, or show one");
  get->add_option("TYPE", s.get.kind,
                  "jobs, nodes, queues, teams, tokens or deployments (or job, node, ...)")
      ->required();
  get->add_option("NAME", s.get.name, "one object's name (a job or deployment: NAME or TEAM/NAME)");
  get->add_option("-o,--output", s.get.output, "table (default), wide, json or yaml");
  get->add_option("--state", s.get.state, "jobs in this state only (Pending, Running, ...)");
  get->add_option("--queue", s.get.queue, "jobs of this queue only");
  AddVerb(s, get, [&s](http::ApiClient& client) {
    const SystemClock clock;
    return cli::RunGet(client, s.get, clock, std::cout, std::cerr);
  });

  CLI::App* describe =
      app.add_subcommand("describe", "show a job, a node or a deployment in detail");
  describe->add_option("TYPE", s.describe.kind, "job, node or deployment")->required();
  describe->add_option("NAME", s.describe.name, "its name (a job or deployment: NAME or TEAM/NAME)")
      ->required();
  AddVerb(s, describe, [&s](http::ApiClient& client) {
    const SystemClock clock;
    return cli::RunDescribe(client, s.describe, clock, std::cout, std::cerr);
  });

  CLI::App* explain = app.add_subcommand(
      "explain", "say why a job waits, when it may start and what would start it now");
  explain->add_option("TYPE", s.explain.kind, "job")->required();
  explain->add_option("NAME", s.explain.name, "the job's name (NAME or TEAM/NAME)")->required();
  explain->add_option("-o,--output", s.explain.output, "text (default), json or yaml");
  AddVerb(s, explain, [&s](http::ApiClient& client) {
    return cli::RunExplain(client, s.explain, std::cout, std::cerr);
  });

  CLI::App* logs = app.add_subcommand(
      "logs", "print the tail of a job's task logs (docs/agent.md, \"Task logs\")");
  logs->add_option("JOB", s.logs.name, "the job's name (NAME or TEAM/NAME)")->required();
  logs->add_option("--task", s.logs.task, "one task, GROUP-REPLICA (e.g. main-0); default: all");
  logs->add_flag("-f,--follow", s.logs.follow,
                 "print what is new every 2 s until the job has ended and its last logs came");
  AddVerb(s, logs, [&s](http::ApiClient& client) {
    return cli::RunLogs(
        client, s.logs, [](std::chrono::milliseconds pause) { std::this_thread::sleep_for(pause); },
        std::cout, std::cerr);
  });

  CLI::App* diff = app.add_subcommand(
      "diff", "show what differs between the provenance of two runs (docs/provenance.md)");
  diff->add_option("TYPE", s.diff.kind, "job")->required();
  diff->add_option("NAMES", s.diff.names, "one job (with two --attempt) or two jobs")
      ->required()
      ->expected(1, 2);
  diff->add_option("--attempt", s.diff.attempts,
                   "an attempt to compare (twice: the first job's, then the second's or the "
                   "same job's other)")
      ->expected(0, 2)
      ->check(CLI::PositiveNumber);
  AddVerb(s, diff, [&s](http::ApiClient& client) {
    return cli::RunDiff(client, s.diff, std::cout, std::cerr);
  });

  CLI::App* cancel = app.add_subcommand("cancel", "cancel a job");
  cancel->add_option("NAME", s.cancel, "job name: NAME in your team, or TEAM/NAME")->required();
  AddVerb(s, cancel, [&s](http::ApiClient& client) {
    return cli::RunCancel(client, s.cancel, std::cout, std::cerr);
  });

  CLI::App* resume = app.add_subcommand(
      "resume", "resume a job that idle reclaim suspended (owner's team, admin)");
  resume->add_option("NAME", s.resume, "job name: NAME in your team, or TEAM/NAME")->required();
  AddVerb(s, resume, [&s](http::ApiClient& client) {
    return cli::RunResume(client, s.resume, std::cout, std::cerr);
  });

  CLI::App* create = app.add_subcommand(
      "create", "create a team, a queue or a token (admin), or a deployment (-f FILE)");
  create->add_option("TYPE", s.create.kind, "team, queue, token or deployment")->required();
  create->add_option("-f,--filename", s.create.file, "deployment: the JSON spec file");
  create->add_option("NAME", s.create.name, "the team's or queue's name");
  create->add_option("--team", s.create.team, "queue: the team that may use it; token: its team");
  create->add_option("--role", s.create.role, "token: admin, member or agent");
  create->add_option("--node", s.create.node,
                     "agent token: the one node it acts for (without: a join token, exchanged "
                     "for a node credential at the node's first registration)");
  create->add_option("--name", s.create.token_name, "token: who or what holds it, e.g. ci-bot");
  create->add_option("--guarantee", s.create.guarantee,
                     "queue: guaranteed GPUs MODEL=GPUS (\"*\": any model); repeatable");
  create->add_option("--limit", s.create.limit,
                     "queue: most GPUs it may hold, MODEL=GPUS (\"*\": in total); repeatable");
  create->add_option("--weight", s.create.weight, "queue: fair-share weight among its siblings");
  create->add_flag("--no-borrow", s.create.no_borrow, "queue: never hold more than its guarantee");
  create->add_flag("--allow-host-network", s.create.allow_host_network,
                   "queue: members' container tasks may share the node's network (hostNetwork)");
  AddVerb(s, create, [&s](http::ApiClient& client) {
    return cli::RunCreate(client, s.create, std::cout, std::cerr);
  });

  CLI::App* update =
      app.add_subcommand("update", "change a queue's quota (admin) or a deployment's autoscaling");
  update->add_option("TYPE", s.update.kind, "queue or deployment")->required();
  update->add_option("NAME", s.update.name, "the queue's or deployment's name")->required();
  update->add_option("--guarantee", s.update.guarantee,
                     "set MODEL=GPUS, or remove MODEL- (\"*\": any model); repeatable");
  update->add_option("--limit", s.update.limit,
                     "set MODEL=GPUS, or remove MODEL- (\"*\": in total); repeatable");
  update->add_option("--weight", s.update.weight, "fair-share weight among its siblings");
  update->add_flag("--borrow", s.update.borrow, "may hold more than its guarantee");
  update->add_flag("--no-borrow", s.update.no_borrow, "never hold more than its guarantee");
  update->add_flag("--allow-host-network", s.update.allow_host_network,
                   "members' container tasks may share the node's network (hostNetwork)");
  update->add_flag("--no-host-network", s.update.no_host_network,
                   "only admins' tasks may share the node's network");
  update->add_option("--min", s.update.min_replicas, "deployment: min_replicas");
  update->add_option("--max", s.update.max_replicas, "deployment: max_replicas");
  update->add_option("--target", s.update.target_pct, "deployment: target_utilization_pct");
  AddVerb(s, update, [&s](http::ApiClient& client) {
    return cli::RunUpdate(client, s.update, std::cout, std::cerr);
  });

  CLI::App* remove =
      app.add_subcommand("delete", "delete a queue (admin) or a deployment and its replicas");
  remove->add_option("TYPE", s.delete_args.kind, "queue, node or deployment")->required();
  remove->add_option("NAME", s.delete_args.name, "the queue's or deployment's name")->required();
  AddVerb(s, remove, [&s](http::ApiClient& client) {
    return cli::RunDelete(client, s.delete_args, std::cout, std::cerr);
  });

  CLI::App* revoke = app.add_subcommand("revoke", "revoke a token (admin)");
  revoke->add_option("TYPE", s.revoke.kind, "token")->required();
  revoke->add_option("ID", s.revoke.id, "the token's id (`gpufleet get tokens`)")->required();
  AddVerb(s, revoke, [&s](http::ApiClient& client) {
    return cli::RunRevoke(client, s.revoke, std::cout, std::cerr);
  });

  CLI::App* report = app.add_subcommand("report", "show a fleet report (admin)");
  report
      ->add_option("TYPE", s.report.kind,
                   "failures: the GPUs and nodes behind failed jobs; versions: the fleet's "
                   "driver, CUDA, NVML and image skew; usage: GPU-hours allocated, busy and "
                   "idle per group, and their cost (docs/usage.md)")
      ->required();
  report->add_option("-o,--output", s.report.output, "table (default), wide, json or yaml");
  report->add_option("--sacct", s.slurm_report.sacct,
                     "failures: a Slurm history (sacct --parsable2 with NodeList) instead of the "
                     "server's outcomes; no server needed (docs/slurm.md)");
  report->add_option("--slurm-nodes", s.slurm_report.slurm_nodes,
                     "with --sacct: `scontrol show nodes` output for the nodes' GPUs");
  report
      ->add_option("--infra-exit-codes", s.slurm_report.infra_exit_codes,
                   "with --sacct: exit codes of FAILED jobs that mean an infrastructure failure")
      ->delimiter(',');
  report->add_option("--timeouts", s.slurm_report.timeouts,
                     "with --sacct: TIMEOUT as a hang (default) or as the job's own (app)");
  report->add_option("--top", s.slurm_report.top, "with --sacct: nodes listed besides the flagged")
      ->check(CLI::Range(0, 100000));
  report->add_option("--from", s.usage.from,
                     "usage: the period's start (RFC 3339, UTC; default 7 days before its end)");
  report->add_option("--to", s.usage.to, "usage: the period's end (RFC 3339, UTC; default now)");
  report->add_option("--by", s.usage.by, "usage: team (default), queue, user or model");
  report->add_option("--prices", s.usage.prices,
                     "usage: a price table per GPU model (MODEL,PRICE lines or MODEL: PRICE)");
  report->add_option("--format", s.usage.format, "usage: table (default), csv or json");
  s.report_verb = report;
  AddVerb(s, report, [&s](http::ApiClient& client) {
    if (s.report.kind == "usage") {
      if (s.usage.format.empty()) {
        s.usage.format = s.report.output;  // -o json works too; -o yaml is refused
      }
      const SystemClock clock;
      return cli::RunUsageReport(client, s.usage, clock, std::cout, std::cerr);
    }
    return cli::RunReport(client, s.report, std::cout, std::cerr);
  });

  CLI::App* export_verb = app.add_subcommand(
      "export",
      "write the server's job log as a trace `gpufleet sim replay --format native` reads");
  export_verb->add_option("TYPE", s.export_args.kind, "jobs: every finished job that ran")
      ->required();
  export_verb->add_option("-o,--output", s.export_args.output, "the CSV file (default stdout)");
  AddVerb(s, export_verb, [&s](http::ApiClient& client) {
    return cli::RunExport(client, s.export_args, std::cout, std::cerr);
  });

  AddNodeVerb(app, s, "cordon", "mark a node unschedulable", cli::NodeAction::kCordon, false);
  AddNodeVerb(app, s, "uncordon", "mark a node schedulable again", cli::NodeAction::kUncordon,
              false);
  AddNodeVerb(app, s, "drain", "cordon a node and move its work away", cli::NodeAction::kDrain,
              false);
  AddNodeVerb(app, s, "quarantine", "take a node's GPUs (or one) out of service",
              cli::NodeAction::kQuarantine, true);
  AddNodeVerb(app, s, "release", "return quarantined GPUs to service", cli::NodeAction::kRelease,
              true);

  return [state] {
    if (state->report_verb->parsed() && !state->slurm_report.sacct.empty()) {
      if (state->report.kind != "failures") {
        std::cerr << "error: --sacct is for `report failures`\n";
        return 1;
      }
      return RunSlurmFailureReport(state->slurm_report, state->report.output);
    }
    for (const auto& [verb, run] : state->verbs) {
      if (!verb->parsed()) {
        continue;
      }
      const std::optional<std::string> server =
          state->server.empty() ? std::nullopt : std::optional<std::string>(state->server);
      const std::optional<std::string> token =
          state->token.empty() ? std::nullopt : std::optional<std::string>(state->token);
      const std::optional<std::string> ca_cert =
          state->ca_cert.empty() ? std::nullopt : std::optional<std::string>(state->ca_cert);
      Result<cli::CliConfig> config =
          cli::LoadConfig(server, token, cli::ReadConfigEnvironment(), ca_cert);
      if (!config.ok()) {
        std::cerr << "error: " << config.status().message() << "\n";
        return 1;
      }
      http::ApiClient client(config->address, config->token, config->ca_cert);
      // The server's answers hold other users' text: no control character reaches the terminal.
      const cli::EscapeControlCharacters escaped_out(std::cout);
      const cli::EscapeControlCharacters escaped_err(std::cerr);
      return run(client);
    }
    return 0;
  };
}

}  // namespace gpufleet::app
