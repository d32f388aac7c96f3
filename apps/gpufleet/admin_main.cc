// SPDX-License-Identifier: Apache-2.0
// `gpufleet admin backup FILE` and `gpufleet admin restore FILE`: the SQLite store of a data
// directory copied out with SQLite's online backup API (while the server runs), and copied back
// in (while no server holds the directory). A PostgreSQL store is backed up with pg_dump
// (docs/operations.md, "Back up and restore").
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/core.h>

#include "gpufleet/store/sqlite_store.h"

#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct AdminFlags {
  std::string data_dir = "gpufleet-data";  // as `gpufleet server --data-dir`
  std::string file;
};

std::string StorePath(const AdminFlags& flags) {
  return (std::filesystem::path(flags.data_dir) / "gpufleet.db").string();
}

int RunBackup(const AdminFlags& flags) {
  const std::string store = StorePath(flags);
  const Result<int64_t> version = store::SqliteStateStore::Backup(store, flags.file);
  if (!version.ok()) {
    fmt::print(stderr, "gpufleet admin backup: {}\n", version.status().ToString());
    return 1;
  }
  fmt::print("backed up {} to {} (schema version {})\n", store, flags.file, *version);
  return 0;
}

int RunRestore(const AdminFlags& flags) {
  const std::string store = StorePath(flags);
  const Result<int64_t> version = store::SqliteStateStore::Restore(flags.file, store);
  if (!version.ok()) {
    fmt::print(stderr, "gpufleet admin restore: {}\n", version.status().ToString());
    return 1;
  }
  fmt::print(
      "restored {} from {} (schema version {}); the store it replaced is {}.pre-restore.bak\n",
      store, flags.file, *version, store);
  return 0;
}

}  // namespace

Action AddAdminCommand(CLI::App& app) {
  auto flags = std::make_shared<AdminFlags>();
  CLI::App* admin = app.add_subcommand(
      "admin", "back up or restore the server's SQLite store (docs/operations.md)");
  admin->require_subcommand(1);
  CLI::App* backup = admin->add_subcommand(
      "backup", "copy the store to FILE (a new file), safe while the server runs");
  CLI::App* restore = admin->add_subcommand(
      "restore", "replace the store with the backup FILE; refused while a server runs on it");
  for (CLI::App* command : {backup, restore}) {
    command->add_option("--data-dir", flags->data_dir, "the server's --data-dir (gpufleet.db)")
        ->capture_default_str();
    command->add_option("FILE", flags->file, "the backup file")->required();
  }
  return [flags, backup] { return backup->parsed() ? RunBackup(*flags) : RunRestore(*flags); };
}

}  // namespace gpufleet::app
