// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include <fmt/core.h>

namespace gpufleet::cli {

std::string_view Trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) {
    return {};
  }
  const size_t end = text.find_last_not_of(" \t\r");
  return text.substr(begin, end - begin + 1);
}

std::string_view Unquote(std::string_view value) {
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
      value.back() == value.front()) {
    return value.substr(1, value.size() - 2);
  }
  return value;
}

namespace {

const std::string* FirstSet(const std::optional<std::string>& a,
                            const std::optional<std::string>& b, const std::string& c) {
  if (a.has_value() && !a->empty()) {
    return &*a;
  }
  if (b.has_value() && !b->empty()) {
    return &*b;
  }
  if (!c.empty()) {
    return &c;
  }
  return nullptr;
}

std::optional<std::string> GetEnv(const char* name) {
  const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read at start-up
  if (value == nullptr) {
    return std::nullopt;
  }
  return std::string(value);
}

}  // namespace

Result<CliConfig> ParseConfigFile(const std::string& text, const std::string& path) {
  CliConfig config;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    const std::string_view trimmed = Trim(line);
    if (trimmed.empty() || trimmed.front() == '#') {
      continue;
    }
    const size_t equals = trimmed.find('=');
    if (equals == std::string_view::npos) {
      return InvalidArgumentError(
          fmt::format("{}:{}: expected \"key = value\", got \"{}\"", path, number, trimmed));
    }
    const std::string_view key = Trim(trimmed.substr(0, equals));
    const std::string_view value = Unquote(Trim(trimmed.substr(equals + 1)));
    if (value.empty()) {
      return InvalidArgumentError(fmt::format("{}:{}: empty value for \"{}\"", path, number, key));
    }
    if (key == "address") {
      config.address = value;
    } else if (key == "token") {
      config.token = value;
    } else if (key == "ca_cert") {
      config.ca_cert = value;
    } else {
      return InvalidArgumentError(fmt::format(
          "{}:{}: unknown key \"{}\" (expected address, token or ca_cert)", path, number, key));
    }
  }
  return config;
}

Result<CliConfig> ResolveConfig(const ConfigSources& sources) {
  CliConfig file;
  if (sources.file_text.has_value()) {
    GPUFLEET_ASSIGN_OR_RETURN(file, ParseConfigFile(*sources.file_text, sources.file_path));
  }
  CliConfig config;
  const std::string* address = FirstSet(sources.flag_address, sources.env_address, file.address);
  config.address = address != nullptr ? *address : kDefaultAddress;
  const std::string* token = FirstSet(sources.flag_token, sources.env_token, file.token);
  if (token != nullptr) {
    config.token = *token;
  }
  const std::string* ca_cert = FirstSet(sources.flag_ca_cert, sources.env_ca_cert, file.ca_cert);
  if (ca_cert != nullptr) {
    config.ca_cert = *ca_cert;
  }
  return config;
}

std::string ConfigFilePath(const std::string& home) {
  return (std::filesystem::path(home) / ".config" / "gpufleet" / "config").string();
}

ConfigEnvironment ReadConfigEnvironment() {
  return ConfigEnvironment{
      .address = GetEnv("GPUFLEET_ADDR"),
      .token = GetEnv("GPUFLEET_TOKEN"),
      .ca_cert = GetEnv("GPUFLEET_CA_CERT"),
      .home = GetEnv("HOME"),
  };
}

Result<CliConfig> LoadConfig(const std::optional<std::string>& flag_address,
                             const std::optional<std::string>& flag_token,
                             const ConfigEnvironment& environment,
                             const std::optional<std::string>& flag_ca_cert) {
  ConfigSources sources{
      .flag_address = flag_address,
      .flag_token = flag_token,
      .env_address = environment.address,
      .env_token = environment.token,
      .flag_ca_cert = flag_ca_cert,
      .env_ca_cert = environment.ca_cert,
  };
  if (environment.home.has_value() && !environment.home->empty()) {
    sources.file_path = ConfigFilePath(*environment.home);
    std::error_code error;
    if (std::filesystem::exists(sources.file_path, error)) {
      std::ifstream in(sources.file_path, std::ios::binary);
      if (!in) {
        return InvalidArgumentError(fmt::format("cannot read {}: {}", sources.file_path,
                                                std::strerror(errno)));  // NOLINT
      }
      std::ostringstream text;
      text << in.rdbuf();
      sources.file_text = text.str();
    }
  }
  return ResolveConfig(sources);
}

}  // namespace gpufleet::cli
