// SPDX-License-Identifier: Apache-2.0
// `gpufleet server`: the REST API and the scheduling loop over a SQLite state store.
#include <pthread.h>
#include <signal.h>

#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <fmt/core.h>

#include "gpufleet/api/server.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/store/sqlite_store.h"

#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct ServerFlags {
  std::string data_dir = "gpufleet-data";
  std::string listen = "127.0.0.1:8080";
  std::string simulated_nodes;
  std::string gpu_model = "H100-80GB";
  std::string admin_token_file;
  std::string policy = "best-fit";
  int64_t cycle_interval_ms = 1000;
};

Result<int> ParseInt(std::string_view text, std::string_view what) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is not a number", what, text));
  }
  return value;
}

// "HOST:PORT".
Result<std::pair<std::string, int>> ParseListen(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgumentError(fmt::format("--listen: \"{}\" (want HOST:PORT)", text));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const int port, ParseInt(text.substr(colon + 1), "--listen port"));
  if (port < 0 || port > 65535) {
    return InvalidArgumentError(fmt::format("--listen: port {} out of range", port));
  }
  return std::make_pair(text.substr(0, colon), port);
}

// "NODESxGPUS", e.g. "16x8": leaves of up to four nodes under one block.
Result<Cluster> SimulatedCluster(const std::string& text, const std::string& model,
                                 const GpuCatalog& catalog) {
  const size_t x = text.find('x');
  if (x == std::string::npos) {
    return InvalidArgumentError(
        fmt::format("--simulated-nodes: \"{}\" (want NODESxGPUS, e.g. 16x8)", text));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const int nodes, ParseInt(text.substr(0, x), "--simulated-nodes"));
  GPUFLEET_ASSIGN_OR_RETURN(const int gpus, ParseInt(text.substr(x + 1), "--simulated-nodes"));
  if (nodes <= 0 || gpus <= 0) {
    return InvalidArgumentError(fmt::format("--simulated-nodes: \"{}\" must be positive", text));
  }
  constexpr int kNodesPerLeaf = 4;
  SyntheticClusterSpec spec;
  spec.blocks = 1;
  spec.nodes_per_leaf = std::min(nodes, kNodesPerLeaf);
  spec.leaves_per_block = (nodes + kNodesPerLeaf - 1) / kNodesPerLeaf;
  spec.gpus_per_node = gpus;
  spec.gpu_model = model;
  spec.total_nodes = nodes;
  return MakeSyntheticCluster(spec, catalog);
}

Result<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return InvalidArgumentError(fmt::format("--admin-token-file: cannot read \"{}\"", path));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string token = buffer.str();
  const size_t begin = token.find_first_not_of(" \t\r\n");
  const size_t end = token.find_last_not_of(" \t\r\n");
  if (begin == std::string::npos) {
    return InvalidArgumentError(fmt::format("--admin-token-file: \"{}\" is empty", path));
  }
  return token.substr(begin, end - begin + 1);
}

int Fail(const Status& status) {
  fmt::print(stderr, "gpufleet server: {}\n", status.ToString());
  return 1;
}

int RunServer(const ServerFlags& flags) {
  Result<std::pair<std::string, int>> listen = ParseListen(flags.listen);
  if (!listen.ok()) {
    return Fail(listen.status());
  }
  const GpuCatalog catalog = GpuCatalog::Default();
  std::error_code error;
  std::filesystem::create_directories(flags.data_dir, error);
  if (error) {
    return Fail(UnavailableError(
        fmt::format("--data-dir: cannot create \"{}\": {}", flags.data_dir, error.message())));
  }
  const std::string db_path = (std::filesystem::path(flags.data_dir) / "gpufleet.db").string();
  Result<std::unique_ptr<store::SqliteStateStore>> store = store::SqliteStateStore::Open(db_path);
  if (!store.ok()) {
    return Fail(store.status());
  }
  SystemClock clock;
  Result<std::unique_ptr<api::ApiServer>> server = api::ApiServer::Create(
      {.store = **store,
       .catalog = catalog,
       .clock = clock,
       .policy = flags.policy,
       .cycle_interval = std::chrono::milliseconds(flags.cycle_interval_ms)});
  if (!server.ok()) {
    return Fail(server.status());
  }
  if (!flags.simulated_nodes.empty()) {
    Result<Cluster> cluster = SimulatedCluster(flags.simulated_nodes, flags.gpu_model, catalog);
    if (!cluster.ok()) {
      return Fail(cluster.status());
    }
    Result<int> added = (*server)->RegisterNodes(*cluster);
    if (!added.ok()) {
      return Fail(added.status());
    }
    fmt::print("registered {} simulated node(s) ({} already present)\n", *added,
               static_cast<int>(cluster->nodes.size()) - *added);
  }
  std::optional<std::string> given_token;
  if (!flags.admin_token_file.empty()) {
    Result<std::string> token = ReadTokenFile(flags.admin_token_file);
    if (!token.ok()) {
      return Fail(token.status());
    }
    given_token = *token;
  }
  Result<std::optional<std::string>> created = (*server)->authenticator().Bootstrap(given_token);
  if (!created.ok()) {
    return Fail(created.status());
  }
  if (created->has_value()) {
    fmt::print("admin token (shown once, keep it): {}\n", **created);
  }

  // SIGINT and SIGTERM are taken by sigwait below: block them before any thread starts so that
  // every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Result<int> port = (*server)->Start(listen->first, listen->second);
  if (!port.ok()) {
    return Fail(port.status());
  }
  fmt::print("gpufleet server listening on {}:{} (store {}, policy {})\n", listen->first, *port,
             db_path, flags.policy);
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  fmt::print("gpufleet server: signal {}, stopping\n", signal_number);
  (*server)->Stop();
  return 0;
}

}  // namespace

Action AddServerCommand(CLI::App& app) {
  auto flags = std::make_shared<ServerFlags>();
  CLI::App* server = app.add_subcommand("server", "run the REST API and the scheduling loop");
  server->add_option("--data-dir", flags->data_dir, "directory of gpufleet.db")
      ->capture_default_str();
  server->add_option("--listen", flags->listen, "HOST:PORT to serve on (port 0: any free port)")
      ->capture_default_str();
  server->add_option("--simulated-nodes", flags->simulated_nodes,
                     "register NODESxGPUS simulated nodes (e.g. 16x8) that are not present yet");
  server->add_option("--gpu-model", flags->gpu_model, "GPU model of the simulated nodes")
      ->capture_default_str();
  server->add_option("--admin-token-file", flags->admin_token_file,
                     "on first start, install the admin token read from this file");
  server->add_option("--policy", flags->policy, "placement policy")->capture_default_str();
  server
      ->add_option("--cycle-interval-ms", flags->cycle_interval_ms,
                   "milliseconds between scheduling cycles")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  return [flags] { return RunServer(*flags); };
}

}  // namespace gpufleet::app
