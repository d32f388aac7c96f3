// SPDX-License-Identifier: Apache-2.0
// `gpufleet server`: the REST API and the scheduling loop over a SQLite state store.
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
#include "gpufleet/api/tls.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/store/sqlite_store.h"

#include "flags.h"
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
  std::string tls_cert;
  std::string tls_key;
};

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

int Fail(const Status& status) {
  fmt::print(stderr, "gpufleet server: {}\n", status.ToString());
  return 1;
}

int RunServer(const ServerFlags& flags) {
  Result<std::pair<std::string, int>> listen = ParseHostPort(flags.listen);
  if (!listen.ok()) {
    return Fail(listen.status());
  }
  std::optional<api::ApiServer::TlsFiles> tls;
  if (!flags.tls_cert.empty() || !flags.tls_key.empty()) {
    if (flags.tls_cert.empty() || flags.tls_key.empty()) {
      return Fail(InvalidArgumentError("--tls-cert and --tls-key go together"));
    }
    // Checked before anything is written, so that a first start does not spend its one-time
    // admin token on a server that then refuses to start.
    if (Status status = api::CheckTlsFiles(flags.tls_cert, flags.tls_key); !status.ok()) {
      return Fail(status);
    }
    tls = api::ApiServer::TlsFiles{flags.tls_cert, flags.tls_key};
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
       .wall_clock = &clock,
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
    Result<std::string> token = ReadSecretFile(flags.admin_token_file, "--admin-token-file");
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

  BlockStopSignals();

  Result<int> port = (*server)->Start(listen->first, listen->second, tls);
  if (!port.ok()) {
    return Fail(port.status());
  }
  fmt::print("gpufleet server listening on {}://{}:{} (store {}, policy {})\n",
             tls ? "https" : "http", listen->first, *port, db_path, flags.policy);
  std::fflush(stdout);
  const int signal_number = WaitForStopSignal();
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
  server->add_option("--tls-cert", flags->tls_cert,
                     "serve HTTPS with this PEM certificate (chain); needs --tls-key");
  server->add_option("--tls-key", flags->tls_key, "the PEM private key of --tls-cert");
  server
      ->add_option("--cycle-interval-ms", flags->cycle_interval_ms,
                   "milliseconds between scheduling cycles")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  return [flags] { return RunServer(*flags); };
}

}  // namespace gpufleet::app
