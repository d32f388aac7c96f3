// SPDX-License-Identifier: Apache-2.0
// The one gpufleet binary: maps the first argument to a subcommand.
#include <fmt/core.h>

#include "subcommands.h"

int main(int argc, char** argv) {
  CLI::App app{"gpufleet: a GPU cluster manager (scheduler, simulator)", "gpufleet"};
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("gpufleet {} ({})", gpufleet::app::BuildVersion(),
                                                gpufleet::app::BuildCommit()));

  CLI::App* version = app.add_subcommand("version", "print the version and the git commit");
  version->callback([] {
    fmt::print("gpufleet {}\ncommit {}\n", gpufleet::app::BuildVersion(),
               gpufleet::app::BuildCommit());
  });
  gpufleet::app::Action sim = gpufleet::app::AddSimCommand(app);
  gpufleet::app::Action server = gpufleet::app::AddServerCommand(app);
  gpufleet::app::Action agent = gpufleet::app::AddAgentCommand(app);
  gpufleet::app::Action dev = gpufleet::app::AddDevCommand(app);
  gpufleet::app::Action probe = gpufleet::app::AddProbeCommand(app);
  gpufleet::app::Action admin = gpufleet::app::AddAdminCommand(app);
  gpufleet::app::Action fabric = gpufleet::app::AddFabricCommand(app);
  gpufleet::app::Action cli = gpufleet::app::AddCliCommands(app);
  gpufleet::app::Action completion = gpufleet::app::AddCompletionCommand(app);

  CLI11_PARSE(app, argc, argv);
  if (sim && app.got_subcommand("sim")) {
    return sim();
  }
  if (server && app.got_subcommand("server")) {
    return server();
  }
  if (agent && app.got_subcommand("agent")) {
    return agent();
  }
  if (dev && app.got_subcommand("dev")) {
    return dev();
  }
  if (probe && app.got_subcommand("probe")) {
    return probe();
  }
  if (admin && app.got_subcommand("admin")) {
    return admin();
  }
  if (fabric && app.got_subcommand("fabric")) {
    return fabric();
  }
  if (app.got_subcommand("completion")) {
    return completion();
  }
  if (cli && !app.get_subcommands().empty() &&
      app.get_subcommands().front()->get_group() == gpufleet::app::kCliGroup) {
    return cli();
  }
  return 0;
}
