// SPDX-License-Identifier: Apache-2.0
// Where the client verbs find the server, the token and the CA certificate of an https://
// server: flags, then the environment (`GPUFLEET_ADDR`, `GPUFLEET_TOKEN`, `GPUFLEET_CA_CERT`),
// then `~/.config/gpufleet/config`, then the default.
#pragma once

#include <optional>
#include <string>

#include "gpufleet/core/status.h"

namespace gpufleet::cli {

inline constexpr char kDefaultAddress[] = "http://127.0.0.1:8080";

// What the client connects to.
struct CliConfig {
  std::string address;
  std::string token;
  std::string ca_cert;  // empty: the system's trusted certificates
};

// Every input of the resolution; an unset or empty value counts as absent.
struct ConfigSources {
  std::optional<std::string> flag_address;  // --server
  std::optional<std::string> flag_token;    // --token
  std::optional<std::string> env_address;   // GPUFLEET_ADDR
  std::optional<std::string> env_token;     // GPUFLEET_TOKEN
  std::optional<std::string> flag_ca_cert;  // --ca-cert
  std::optional<std::string> env_ca_cert;   // GPUFLEET_CA_CERT
  // The config file's text (absent when there is no file) and its path, for error messages.
  std::optional<std::string> file_text;
  std::string file_path;
};

// Helpers of the client's line-based files (the config file, price tables): `text` without
// leading and trailing blanks (space, tab, CR), and `value` without one pair of enclosing double
// or single quotes.
std::string_view Trim(std::string_view text);
std::string_view Unquote(std::string_view value);

// The config file: `key = value` lines (`address`, `token`, `ca_cert`), `#` comments and blank
// lines.
// kInvalidArgument naming "PATH:LINE" for a line without `=`, an unknown key or an empty value.
Result<CliConfig> ParseConfigFile(const std::string& text, const std::string& path);

// Pure: flag > environment > file > default (kDefaultAddress, no token, no CA file), per field.
// A malformed
// file is an error even when flags set both fields, so that it does not go unnoticed.
Result<CliConfig> ResolveConfig(const ConfigSources& sources);

// The config file of a home directory: HOME/.config/gpufleet/config.
std::string ConfigFilePath(const std::string& home);

// The process's environment values that matter (nullopt when unset).
struct ConfigEnvironment {
  std::optional<std::string> address;  // GPUFLEET_ADDR
  std::optional<std::string> token;    // GPUFLEET_TOKEN
  std::optional<std::string> ca_cert;  // GPUFLEET_CA_CERT
  std::optional<std::string> home;     // HOME
};
ConfigEnvironment ReadConfigEnvironment();

// The thin IO wrapper: reads the config file under `environment.home` (a missing file is fine,
// an unreadable one is kInvalidArgument) and resolves.
Result<CliConfig> LoadConfig(const std::optional<std::string>& flag_address,
                             const std::optional<std::string>& flag_token,
                             const ConfigEnvironment& environment,
                             const std::optional<std::string>& flag_ca_cert = std::nullopt);

}  // namespace gpufleet::cli
