// SPDX-License-Identifier: Apache-2.0
#include "flags.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpufleet/cli/commands.h"
#include "gpufleet/cli/usage_report.h"
#include "gpufleet/os/files.h"

namespace gpufleet::app {
namespace {

sigset_t StopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

}  // namespace

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    parts.push_back(text.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return parts;
}

Result<std::vector<std::string>> ParsePolicies(const std::string& text,
                                               const std::vector<std::string>& known) {
  if (text == "all") {
    return known;
  }
  std::vector<std::string> policies = SplitList(text);
  for (const std::string& name : policies) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return InvalidArgumentError(
          fmt::format("--policy: unknown policy \"{}\" (known: {})", name, fmt::join(known, ", ")));
    }
  }
  return policies;
}

Result<int> ParseInt(std::string_view text, std::string_view what) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is not a number", what, text));
  }
  return value;
}

Result<std::pair<std::string, int>> ParseHostPort(const std::string& text, std::string_view flag) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" (want HOST:PORT)", flag, text));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const int port,
                            ParseInt(text.substr(colon + 1), fmt::format("{} port", flag)));
  if (port < 0 || port > 65535) {
    return InvalidArgumentError(fmt::format("{}: port {} out of range", flag, port));
  }
  return std::make_pair(text.substr(0, colon), port);
}

Result<std::string> ReadSecretFile(const std::string& path, std::string_view flag) {
  std::ifstream in(path);
  if (!in) {
    return InvalidArgumentError(fmt::format("{}: cannot read \"{}\"", flag, path));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const size_t begin = text.find_first_not_of(" \t\r\n");
  const size_t end = text.find_last_not_of(" \t\r\n");
  if (begin == std::string::npos) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is empty", flag, path));
  }
  return text.substr(begin, end - begin + 1);
}

Status WriteSecretFile(const std::string& path, std::string_view secret) {
  return os::WriteFileAtomically(path, fmt::format("{}\n", secret), os::Durability::kMachineCrash);
}

void BlockStopSignals() {
  const sigset_t signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForStopSignal() {
  const sigset_t signals = StopSignals();
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  return signal_number;
}

std::optional<int> WaitForStopSignal(std::chrono::milliseconds timeout) {
  const sigset_t signals = StopSignals();
  timespec wait{};
  wait.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  wait.tv_nsec = static_cast<long>((timeout.count() % 1000) * 1000000);
  const int signal_number = sigtimedwait(&signals, nullptr, &wait);
  if (signal_number < 0) {
    return std::nullopt;  // EAGAIN (timeout) or EINTR: the caller's loop goes on
  }
  return signal_number;
}

Status WriteOutputFile(const std::string& path, const std::function<Status(std::ostream&)>& write) {
  std::ofstream out(path);
  if (!out) {
    return UnavailableError(fmt::format("{}: cannot open for writing", path));
  }
  GPUFLEET_RETURN_IF_ERROR(write(out));
  out.flush();
  if (!out) {
    return UnavailableError(fmt::format("{}: write failed", path));
  }
  fmt::print("wrote {}\n", path);
  return Status::Ok();
}

Result<std::optional<wire::PriceTable>> LoadPricesFlag(const std::string& path) {
  if (path.empty()) {
    return std::optional<wire::PriceTable>();
  }
  Result<std::string> text = cli::ReadTextFile(path, "prices");
  Result<wire::PriceTable> parsed =
      text.ok() ? cli::ParsePriceTable(*text, path) : Result<wire::PriceTable>(text.status());
  if (!parsed.ok()) {
    return Status(parsed.status().code(), "--prices: " + parsed.status().message());
  }
  return std::optional<wire::PriceTable>(*std::move(parsed));
}

}  // namespace gpufleet::app
