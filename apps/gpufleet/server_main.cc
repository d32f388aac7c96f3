// SPDX-License-Identifier: Apache-2.0
// `gpufleet server`: the REST API and the scheduling loop over a SQLite (--data-dir, the default)
// or PostgreSQL (--store) state store.
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "gpufleet/api/event_time_store.h"
#include "gpufleet/api/remediation_hooks.h"
#include "gpufleet/api/server.h"
#include "gpufleet/api/tls.h"
#include "gpufleet/control/retention_controller.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/fabric/fabric.h"
#include "gpufleet/policy/idle_reclaim.h"
#include "gpufleet/store/directory_lock.h"
#include "gpufleet/store/postgres_store.h"
#include "gpufleet/store/sqlite_store.h"

#include "config_file.h"
#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct ServerFlags {
  std::string data_dir = "gpufleet-data";
  bool data_dir_given = false;
  std::string store;  // a PostgreSQL URI; empty: SQLite in data_dir
  std::string listen = "127.0.0.1:8080";
  std::string simulated_nodes;
  std::string gpu_model = "H100-80GB";
  std::string admin_token_file;
  std::string policy = "gpufleet";
  std::string workload_half_life = "24h";
  int64_t workload_max_shapes = 64;
  std::string fabric;
  std::string prices;  // a price table per GPU model; empty: no cost in GET /v1/usage
  int64_t cycle_interval_ms = 1000;
  int64_t mig_apply_timeout_s = 120;
  int64_t heartbeat_interval_ms = 10000;
  int64_t node_timeout_s = 40;
  int64_t stop_grace_s = 30;
  int64_t min_runtime_before_preemption_s = 60;
  int64_t max_checkpoint_grace_s = 300;
  int64_t gang_start_timeout_s = 300;
  std::string retain_finished = "30d";
  int64_t reliability_interval_s = 300;
  double quarantine_fleet_share = 0.02;
  double quarantine_leaf_share = 0.05;
  bool no_quarantine = false;
  bool quarantine_health_rule = false;
  bool no_diagnostics_loop = false;
  std::string diagnostic_kind = "builtin";
  std::string loop_drain = "after-timeout";
  int64_t loop_drain_timeout_s = 3600;
  std::vector<std::string> remediation_hooks;
  int64_t remediation_timeout_s = 300;
  int max_remediations = 3;
  double breaker_share = 0.5;
  int64_t breaker_window_s = 300;
  bool idle_reclaim = false;
  int64_t idle_reclaim_threshold_pct = 10;
  int64_t idle_reclaim_after_s = 30 * 60;
  int64_t idle_reclaim_warning_s = 15 * 60;
  std::string idle_reclaim_action = "suspend";
  std::string tls_cert;
  std::string tls_key;
  int max_connections = 4096;
  int max_connections_per_client = 256;
  int64_t header_timeout_s = 10;
  // Several servers on one PostgreSQL (docs/ha.md).
  std::string advertise_address;
  int64_t leader_lease_ms = 5000;
  int64_t leader_renew_ms = 1000;
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

// The state store, and what must live as long as it.
struct OpenedStore {
  std::optional<store::DirectoryLock> lock;  // SQLite: one server per data directory
  std::unique_ptr<store::StateStore> store;
  store::PostgresStateStore* postgres = nullptr;  // `store` when it is PostgreSQL
  std::string description;                        // for the start-up line; no password
};

Result<OpenedStore> OpenStore(const ServerFlags& flags) {
  if (!flags.store.empty()) {
    if (flags.data_dir_given) {
      return InvalidArgumentError(
          "--store and --data-dir cannot be given together: the state is either in PostgreSQL "
          "(--store) or in SQLite under --data-dir");
    }
    Result<std::unique_ptr<store::PostgresStateStore>> postgres =
        store::PostgresStateStore::Open(flags.store);
    if (!postgres.ok()) {
      return Status(postgres.status().code(), "--store: " + postgres.status().message());
    }
    OpenedStore opened;
    opened.description = (*postgres)->redacted_uri();
    opened.postgres = postgres->get();
    opened.store = std::move(postgres).value();
    return opened;
  }
  std::error_code error;
  // A data directory the server makes is the server user's alone (0700); one a site made is
  // left as it is, and the database in it is 0600 either way (store/sqlite_store.cc).
  if (std::filesystem::create_directories(flags.data_dir, error) && !error) {
    std::filesystem::permissions(flags.data_dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, error);
  }
  if (error) {
    return UnavailableError(
        fmt::format("--data-dir: cannot create \"{}\": {}", flags.data_dir, error.message()));
  }
  // One server per data directory: a second one refuses to start, naming the first.
  Result<store::DirectoryLock> lock = store::DirectoryLock::Acquire(flags.data_dir);
  if (!lock.ok()) {
    return lock.status();
  }
  OpenedStore opened;
  opened.lock = std::move(lock).value();
  opened.description = (std::filesystem::path(flags.data_dir) / "gpufleet.db").string();
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<store::SqliteStateStore> sqlite,
                            store::SqliteStateStore::Open(opened.description));
  if (!sqlite->pre_migration_backup().empty()) {
    fmt::print(
        "gpufleet server: migrated the store's schema to version {}; the store as it was "
        "is in {}\n",
        store::SqliteStateStore::LatestSchemaVersion(), sqlite->pre_migration_backup());
  }
  opened.store = std::move(sqlite);
  return opened;
}

int FailServer(const Status& status) {
  fmt::print(stderr, "gpufleet server: {}\n", status.ToString());
  return 1;
}

// The election of the servers on one PostgreSQL database. The identity names this process: a
// restarted server starts a new term.
Result<std::unique_ptr<store::PostgresLeaderElection>> OpenElection(const ServerFlags& flags,
                                                                    store::PostgresStateStore& db,
                                                                    const std::string& address) {
  if (flags.leader_renew_ms * 2 > flags.leader_lease_ms) {
    return InvalidArgumentError(fmt::format(
        "--leader-renew-ms {} must be at most half of --leader-lease-ms {}, so that one late "
        "renewal does not cost the lease",
        flags.leader_renew_ms, flags.leader_lease_ms));
  }
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  const std::string identity = fmt::format(
      "{}/pid-{}-{:x}", address.empty() ? flags.listen.substr(0, flags.listen.rfind(':')) : address,
      getpid(), std::chrono::duration_cast<std::chrono::microseconds>(now).count() & 0xffffff);
  Result<std::unique_ptr<store::PostgresLeaderElection>> election =
      store::PostgresLeaderElection::Open(
          flags.store, db,
          {.identity = identity,
           .address = address,
           .lease = std::chrono::milliseconds(flags.leader_lease_ms)});
  if (!election.ok()) {
    return Status(election.status().code(), "--store: " + election.status().message());
  }
  return election;
}

int RunServer(const ServerFlags& flags) {
  Result<std::pair<std::string, int>> listen = ParseHostPort(flags.listen);
  if (!listen.ok()) {
    return FailServer(listen.status());
  }
  std::optional<api::ApiServer::TlsFiles> tls;
  if (!flags.tls_cert.empty() || !flags.tls_key.empty()) {
    if (flags.tls_cert.empty() || flags.tls_key.empty()) {
      return FailServer(InvalidArgumentError("--tls-cert and --tls-key go together"));
    }
    // Checked before anything is written, so that a first start does not spend its one-time
    // admin token on a server that then refuses to start.
    if (Status status = api::CheckTlsFiles(flags.tls_cert, flags.tls_key); !status.ok()) {
      return FailServer(status);
    }
    tls = api::ApiServer::TlsFiles{flags.tls_cert, flags.tls_key};
  }
  // The fabric and the workload flags are checked before the store is opened: a bad file
  // stops the server before anything is written.
  std::shared_ptr<const fabric::Fabric> network;
  if (!flags.fabric.empty()) {
    Result<std::shared_ptr<const fabric::Fabric>> loaded = LoadFabricFile(flags.fabric);
    if (!loaded.ok()) {
      return FailServer(Status(loaded.status().code(), "--fabric: " + loaded.status().message()));
    }
    network = *loaded;
  }
  const Result<Duration> half_life =
      control::ParseRetention("--workload-half-life", flags.workload_half_life);
  if (!half_life.ok() || *half_life <= Duration::zero()) {
    return FailServer(InvalidArgumentError(
        fmt::format("--workload-half-life: \"{}\" is not a positive duration (a whole number "
                    "with s, m, h or d, e.g. 24h)",
                    flags.workload_half_life)));
  }
  if (flags.workload_max_shapes <= 0 || flags.workload_max_shapes > 100000) {
    return FailServer(InvalidArgumentError(
        fmt::format("--workload-max-shapes: {} (must be 1..100000)", flags.workload_max_shapes)));
  }
  Result<std::optional<wire::PriceTable>> prices = LoadPricesFlag(flags.prices);
  if (!prices.ok()) {
    return FailServer(prices.status());
  }
  const GpuCatalog catalog = GpuCatalog::Default();
  Result<OpenedStore> store = OpenStore(flags);
  if (!store.ok()) {
    return FailServer(store.status());
  }
  if (!flags.advertise_address.empty() && store->postgres == nullptr) {
    return FailServer(InvalidArgumentError(
        "--advertise-address is for several servers on one PostgreSQL database (--store)"));
  }
  const char* scheme = tls ? "https" : "http";
  // How the other servers and the clients reach this one when it leads; with port 0 it is known
  // once bound.
  std::string address = flags.advertise_address;
  if (address.empty() && listen->second != 0) {
    address = fmt::format("{}://{}:{}", scheme, listen->first, listen->second);
  }
  std::unique_ptr<store::PostgresLeaderElection> election;
  bool leading = true;
  if (store->postgres != nullptr) {
    Result<std::unique_ptr<store::PostgresLeaderElection>> opened =
        OpenElection(flags, *store->postgres, address);
    if (!opened.ok()) {
      return FailServer(opened.status());
    }
    election = std::move(opened).value();
    // Once at start, so that the first server makes the start-up writes below.
    Result<store::LeaseState> lease = election->Campaign();
    if (!lease.ok()) {
      return FailServer(lease.status());
    }
    leading = lease->leader;
    fmt::print(
        "{} (identity {}, fencing token {})\n",
        leading ? "leading" : fmt::format("following {} at {}", lease->holder, lease->address),
        election->identity(), lease->token);
  }
  SystemClock clock;
  control::ReliabilityOptions reliability;
  reliability.interval = std::chrono::seconds(flags.reliability_interval_s);
  reliability.budget = {flags.quarantine_fleet_share, flags.quarantine_leaf_share};
  reliability.rules.enabled = !flags.no_quarantine;
  reliability.quarantine_on_health_rule = flags.quarantine_health_rule;
  reliability.loop.enabled = !flags.no_diagnostics_loop;
  reliability.loop.diagnostic_kind = flags.diagnostic_kind;
  const std::optional<control::LoopDrain> loop_drain = control::ParseLoopDrain(flags.loop_drain);
  if (!loop_drain) {
    return FailServer(InvalidArgumentError(fmt::format(
        "--loop-drain: \"{}\" (must be now, after-job or after-timeout)", flags.loop_drain)));
  }
  reliability.loop.drain = *loop_drain;
  reliability.loop.drain_timeout = std::chrono::seconds(flags.loop_drain_timeout_s);
  reliability.loop.max_remediations = flags.max_remediations;
  reliability.loop.breaker_share = flags.breaker_share;
  reliability.loop.breaker_window = std::chrono::seconds(flags.breaker_window_s);
  const Result<std::map<std::string, std::string>> hook_commands =
      api::ParseRemediationHooks(flags.remediation_hooks);
  if (!hook_commands.ok()) {
    return FailServer(hook_commands.status());
  }
  std::optional<policy::IdleReclaimOptions> idle_reclaim;
  if (flags.idle_reclaim) {
    Result<policy::ReclaimAction> action = policy::ParseReclaimAction(flags.idle_reclaim_action);
    if (!action.ok()) {
      return FailServer(InvalidArgumentError("--idle-reclaim-" + action.status().message()));
    }
    idle_reclaim.emplace();
    idle_reclaim->threshold_milli = flags.idle_reclaim_threshold_pct * 10;  // percent -> milli
    idle_reclaim->idle_seconds = flags.idle_reclaim_after_s;
    idle_reclaim->warning_seconds = flags.idle_reclaim_warning_s;
    idle_reclaim->action = *action;
  }
  const Result<Duration> retain_finished =
      control::ParseRetention("--retain-finished", flags.retain_finished);
  if (!retain_finished.ok()) {
    return FailServer(retain_finished.status());
  }
  api::EventTimeStore timed_store(*store->store, clock);  // each event with its time
  // Made before the server and so gone after it: the loop may ask for a hook until its end.
  api::RemediationHooks remediation_hooks(*hook_commands, timed_store, clock,
                                          std::chrono::seconds(flags.remediation_timeout_s));
  reliability.loop.remediate = [&remediation_hooks](const control::RemediationRequest& request) {
    return remediation_hooks.Start(request);
  };
  Result<std::unique_ptr<api::ApiServer>> server = api::ApiServer::Create(
      {.store = timed_store,
       .catalog = catalog,
       .clock = clock,
       .wall_clock = &clock,
       .policy = flags.policy,
       .workload_history = {.half_life = *half_life,
                            .max_shapes = static_cast<size_t>(flags.workload_max_shapes)},
       .fabric = network,
       .cycle_interval = std::chrono::milliseconds(flags.cycle_interval_ms),
       .heartbeat_interval = std::chrono::milliseconds(flags.heartbeat_interval_ms),
       .node_timeout = std::chrono::seconds(flags.node_timeout_s),
       .stop_grace = std::chrono::seconds(flags.stop_grace_s),
       .min_runtime_before_preemption = std::chrono::seconds(flags.min_runtime_before_preemption_s),
       .max_checkpoint_grace = std::chrono::seconds(flags.max_checkpoint_grace_s),
       .reliability = reliability,
       .idle_reclaim = idle_reclaim,
       .mig_apply_timeout = std::chrono::seconds(flags.mig_apply_timeout_s),
       .gang_start_timeout = std::chrono::seconds(flags.gang_start_timeout_s),
       .retain_finished = *retain_finished,
       .http = {.header_timeout = std::chrono::seconds(flags.header_timeout_s),
                .max_connections = flags.max_connections,
                .max_connections_per_client = flags.max_connections_per_client},
       .election = election.get(),
       .election_interval = std::chrono::milliseconds(flags.leader_renew_ms),
       .usage_prices = *prices});
  if (!server.ok()) {
    return FailServer(server.status());
  }
  // A follower's writes are refused: the leader registers the nodes and installs the token.
  if (!leading) {
    fmt::print("a follower: --simulated-nodes and the admin token are the leader's to write\n");
  } else if (!flags.simulated_nodes.empty()) {
    Result<Cluster> cluster = SimulatedCluster(flags.simulated_nodes, flags.gpu_model, catalog);
    if (!cluster.ok()) {
      return FailServer(cluster.status());
    }
    Result<int> added = (*server)->RegisterNodes(*cluster);
    if (!added.ok()) {
      return FailServer(added.status());
    }
    fmt::print("registered {} simulated node(s) ({} already present)\n", *added,
               static_cast<int>(cluster->nodes.size()) - *added);
  }
  std::optional<std::string> given_token;
  if (leading && !flags.admin_token_file.empty()) {
    Result<std::string> token = ReadSecretFile(flags.admin_token_file, "--admin-token-file");
    if (!token.ok()) {
      return FailServer(token.status());
    }
    given_token = *token;
  }
  if (leading) {
    Result<std::optional<std::string>> created = (*server)->authenticator().Bootstrap(given_token);
    if (!created.ok()) {
      return FailServer(created.status());
    }
    if (created->has_value()) {
      fmt::print("admin token (shown once, keep it): {}\n", **created);
    }
  }

  BlockStopSignals();

  Result<int> port = (*server)->Start(listen->first, listen->second, tls);
  if (!port.ok()) {
    return FailServer(port.status());
  }
  if (election != nullptr && address.empty()) {
    election->SetAddress(fmt::format("{}://{}:{}", scheme, listen->first, *port));
  }
  fmt::print("gpufleet server listening on {}://{}:{} (store {}, policy {}{})\n", scheme,
             listen->first, *port, store->description, flags.policy,
             network != nullptr ? ", fabric " + flags.fabric : std::string());
  std::fflush(stdout);
  // A deposed leader ends, as a Kubernetes controller manager does: its supervisor starts it
  // again and it rejoins as a follower, with nothing of its old term in memory.
  constexpr auto kDeposedCheck = std::chrono::milliseconds(200);
  while (true) {
    if (const std::optional<int> signal_number = WaitForStopSignal(kDeposedCheck)) {
      fmt::print("gpufleet server: signal {}, stopping\n", *signal_number);
      (*server)->Stop();
      return 0;
    }
    if ((*server)->deposed()) {
      (*server)->Stop();
      return FailServer(FailedPreconditionError(
          "lost the leader lease (see above); exiting so that a restart rejoins as a follower"));
    }
  }
}

}  // namespace

Action AddServerCommand(CLI::App& app) {
  auto flags = std::make_shared<ServerFlags>();
  CLI::App* server = app.add_subcommand("server", "run the REST API and the scheduling loop");
  AddConfigFlags(*server);
  CLI::Option* data_dir =
      server->add_option("--data-dir", flags->data_dir, "directory of gpufleet.db (SQLite)")
          ->capture_default_str();
  server->add_option("--store", flags->store,
                     "keep the state in PostgreSQL instead of SQLite: a libpq URI such as "
                     "postgresql://USER@HOST:PORT/DATABASE (password from PGPASSFILE or the URI; "
                     "not with --data-dir)");
  server->add_option("--listen", flags->listen, "HOST:PORT to serve on (port 0: any free port)")
      ->capture_default_str();
  server->add_option("--advertise-address", flags->advertise_address,
                     "with --store: the URL other servers and clients reach this one at when it "
                     "leads, e.g. http://10.0.0.5:8080 (default: http(s)://--listen)");
  server
      ->add_option("--leader-lease-ms", flags->leader_lease_ms,
                   "with --store: milliseconds the leader lease lasts unless renewed; a follower "
                   "takes over this long after the leader stops renewing")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{200}, int64_t{600000}));
  server
      ->add_option("--leader-renew-ms", flags->leader_renew_ms,
                   "with --store: milliseconds between campaigns (renewals of the lease, or "
                   "attempts to take it); at most half the lease")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{50}, int64_t{300000}));
  server->add_option("--simulated-nodes", flags->simulated_nodes,
                     "register NODESxGPUS simulated nodes (e.g. 16x8) that are not present yet");
  server->add_option("--gpu-model", flags->gpu_model, "GPU model of the simulated nodes")
      ->capture_default_str();
  server->add_option("--admin-token-file", flags->admin_token_file,
                     "on first start, install the admin token read from this file");
  server
      ->add_option("--policy", flags->policy,
                   "placement policy: gpufleet or fgd (scored against the task mix learnt from "
                   "the jobs this server starts), best-fit, gpu-packing, gpu-clustering, dot-prod "
                   "or random (docs/policies.md)")
      ->capture_default_str();
  server
      ->add_option("--workload-half-life", flags->workload_half_life,
                   "gpufleet and fgd: a started job's shape loses half its weight in the learnt "
                   "task mix after this long (s, m, h or d)")
      ->capture_default_str();
  server
      ->add_option("--workload-max-shapes", flags->workload_max_shapes,
                   "gpufleet and fgd: distinct task shapes kept in the learnt mix; rarer ones "
                   "merge into their nearest")
      ->capture_default_str();
  server->add_option("--fabric", flags->fabric,
                     "the network fabric (YAML, or Slurm topology.conf): multi-node jobs are "
                     "placed to keep their collectives off oversubscribed tiers (docs/fabric.md)");
  server->add_option("--prices", flags->prices,
                     "a price per GPU-hour of each GPU model (MODEL,PRICE lines or MODEL: PRICE, "
                     "as `report usage --prices`): GET /v1/usage and the dashboard show the cost");
  server->add_option("--tls-cert", flags->tls_cert,
                     "serve HTTPS with this PEM certificate (chain); needs --tls-key");
  server->add_option("--tls-key", flags->tls_key, "the PEM private key of --tls-cert");
  server
      ->add_option("--cycle-interval-ms", flags->cycle_interval_ms,
                   "milliseconds between scheduling cycles")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  server
      ->add_option("--heartbeat-interval-ms", flags->heartbeat_interval_ms,
                   "how often agents are told to heartbeat")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{100}, int64_t{600000}));
  server
      ->add_option("--node-timeout-s", flags->node_timeout_s,
                   "a node's lease: seconds without a heartbeat before it is NotReady and its "
                   "agent stops its tasks")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{3600}));
  server
      ->add_option("--stop-grace-s", flags->stop_grace_s,
                   "seconds after the lease until a lost node's tasks are surely gone and their "
                   "GPUs free (at least the agents' --stop-grace-s)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3600}));
  server
      ->add_option("--retain-finished", flags->retain_finished,
                   "finished jobs (Succeeded, Failed, Cancelled) leave the store with their "
                   "events this long after they finished, e.g. 30d, 12h; 0 or forever keeps "
                   "them all (docs/api.md, \"Retention of finished jobs\")")
      ->capture_default_str();
  server
      ->add_option("--gang-start-timeout-s", flags->gang_start_timeout_s,
                   "a gang started on some of its nodes but not on others for this long is "
                   "requeued whole")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{24 * 3600}));
  server
      ->add_option("--min-runtime-before-preemption-s", flags->min_runtime_before_preemption_s,
                   "a job that has held its GPUs for less than this is not preempted")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{7 * 24 * 3600}));
  server
      ->add_option("--max-checkpoint-grace-s", flags->max_checkpoint_grace_s,
                   "the most time a preemption notice gives a victim to save a checkpoint "
                   "(spec.preemption.checkpointGraceSeconds is cut to it); 0: no notices")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, kMaxCheckpointGraceSeconds));
  server
      ->add_option("--max-connections", flags->max_connections,
                   "open connections the API holds at most; more are answered 503 and closed")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  server
      ->add_option("--max-connections-per-client", flags->max_connections_per_client,
                   "open connections one remote address may hold")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  server
      ->add_option("--header-timeout-s", flags->header_timeout_s,
                   "seconds a client has to send a request's headers before it is cut off")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{600}));
  server
      ->add_option("--mig-apply-timeout-s", flags->mig_apply_timeout_s,
                   "seconds a job waits for MIG instances its agent does not report before it "
                   "is requeued")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  server
      ->add_option("--reliability-interval-s", flags->reliability_interval_s,
                   "seconds between failure attributions over the job outcomes (0: every cycle)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86400}));
  server
      ->add_option("--quarantine-fleet-share", flags->quarantine_fleet_share,
                   "most of the fleet's GPUs that may be quarantined at once")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  server
      ->add_option("--quarantine-leaf-share", flags->quarantine_leaf_share,
                   "most of one leaf's GPUs that may be quarantined at once")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  server->add_flag("--no-quarantine", flags->no_quarantine,
                   "report failure suspects but quarantine none of them");
  server->add_flag("--quarantine-health-rule", flags->quarantine_health_rule,
                   "quarantine a GPU its agent drains for an XID that blames it");
  server->add_flag("--no-diagnostics-loop", flags->no_diagnostics_loop,
                   "quarantine suspects on statistics alone, without diagnosing them first, also "
                   "on nodes whose agent runs diagnostics");
  server
      ->add_option("--diagnostic-kind", flags->diagnostic_kind,
                   "the diagnostic the loop asks of a suspect: builtin or command (the agent's "
                   "--diagnostic-command)")
      ->capture_default_str()
      ->check(CLI::IsMember({"builtin", "command"}));
  server
      ->add_option("--loop-drain", flags->loop_drain,
                   "how the loop empties a suspect GPU before its diagnostic: now, after-job, or "
                   "after-timeout (a checkpoint notice, then the stop)")
      ->capture_default_str();
  server
      ->add_option("--loop-drain-timeout-s", flags->loop_drain_timeout_s,
                   "seconds a run on a suspect GPU has to checkpoint (--loop-drain after-timeout)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86400}));
  server
      ->add_option("--remediation-hook", flags->remediation_hooks,
                   "ACTION=COMMAND: the command run for a remediation (reset-gpu, reboot-node, "
                   "ticket), with NODE GPU REASON as arguments and GPUFLEET_* in its environment; "
                   "repeatable")
      ->take_all();
  server
      ->add_option("--remediation-timeout-s", flags->remediation_timeout_s,
                   "seconds a remediation hook may run before it is killed")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600}));
  server
      ->add_option("--max-remediations", flags->max_remediations,
                   "remediations of one GPU within 7 days before it needs a person")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  server
      ->add_option("--breaker-share", flags->breaker_share,
                   "the loop's circuit breaker: no automatic drain or quarantine while more than "
                   "this share of the fleet's GPUs (0.5 = 50 %) went out within the window")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  server
      ->add_option("--breaker-window-s", flags->breaker_window_s,
                   "the circuit breaker's window in seconds")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  CLI::Option* idle_reclaim = server->add_flag(
      "--idle-reclaim", flags->idle_reclaim,
      "warn, then suspend or preempt, running interactive jobs whose GPUs idle while jobs wait");
  server
      ->add_option("--idle-reclaim-threshold-pct", flags->idle_reclaim_threshold_pct,
                   "a job is idle while its GPUs' mean utilization is under this percent")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{100}))
      ->needs(idle_reclaim);
  server
      ->add_option("--idle-reclaim-after-s", flags->idle_reclaim_after_s,
                   "seconds a job must idle, while jobs wait, before it is warned")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{7 * 86400}))
      ->needs(idle_reclaim);
  server
      ->add_option("--idle-reclaim-warning-s", flags->idle_reclaim_warning_s,
                   "seconds between the warning and the reclaim")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{7 * 86400}))
      ->needs(idle_reclaim);
  server
      ->add_option("--idle-reclaim-action", flags->idle_reclaim_action,
                   "suspend (until the owner resumes it) or preempt (requeue)")
      ->capture_default_str()
      ->check(CLI::IsMember({"suspend", "preempt"}))
      ->needs(idle_reclaim);
  return [flags, server, data_dir] {
    if (std::optional<int> exit_code = HandleConfigFlags(*server)) {
      return *exit_code;
    }
    flags->data_dir_given = data_dir->count() > 0;
    return RunServer(*flags);
  };
}

}  // namespace gpufleet::app
