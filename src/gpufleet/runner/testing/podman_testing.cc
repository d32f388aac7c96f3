// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/testing/podman_testing.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/os/command.h"

namespace gpufleet::runner_testing {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path);
  out << content;
}

std::string Shell(const std::string& command) {
  SystemClock clock;
  os::CommandSpec spec;
  spec.argv = {"/bin/sh", "-c", command};
  spec.env = {fmt::format("PATH={}", getenv("PATH") != nullptr ? getenv("PATH") : "/usr/bin:/bin")};
  spec.timeout = std::chrono::minutes(2);
  const Result<os::CommandOutcome> outcome = os::RunCommand(spec, clock);
  if (!outcome.ok()) {
    return outcome.status().ToString();
  }
  return outcome->exit_code == 0 ? "" : outcome->output + outcome->errors;
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return -1;
  }
  close(fd);
  return ntohs(address.sin_port);
}

LoopbackRegistry::LoopbackRegistry(std::string dir, const std::string& podman_prefix,
                                   const std::string& image, const std::string& name)
    : dir_(std::move(dir)) {
  if (!std::filesystem::exists("/usr/bin/docker-registry")) {
    error_ = "install docker-registry (scripts/setup)";
    return;
  }
  const int port = FreeLoopbackPort();
  WriteFile(dir_ + "/registry.yml",
            fmt::format("version: 0.1\nstorage: {{filesystem: {{rootdirectory: {}/registry}}}}\n"
                        "http: {{addr: 127.0.0.1:{}}}\n",
                        dir_, port));
  if (port <= 0 || !Shell(fmt::format("/usr/bin/docker-registry serve {0}/registry.yml "
                                      ">{0}/registry.log 2>&1 & echo $! >{0}/registry.pid",
                                      dir_))
                        .empty()) {
    error_ = "cannot start docker-registry";
    return;
  }
  const std::string address = fmt::format("127.0.0.1:{}", port);
  // The registry answers once it listens; the push then puts the image there. The shell retries
  // within the patience, so this process reads no clock.
  const std::string pushed = Shell(fmt::format(
      "timeout {} sh -c 'until {} push --tls-verify=false {} {}/{}; do sleep 0.1; done'",
      std::chrono::duration_cast<std::chrono::seconds>(kRegistryPatience).count(), podman_prefix,
      image, address, name));
  if (!pushed.empty()) {
    error_ = "cannot push to the registry: " + pushed + log();
    return;
  }
  address_ = address;
}

void LoopbackRegistry::Stop() {
  Shell(fmt::format("kill $(cat {}/registry.pid) 2>/dev/null", dir_));
}

std::vector<std::string> LoopbackRegistry::BlobFiles() const {
  std::vector<std::string> files;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(dir_ + "/registry/docker/registry/v2/blobs")) {
    if (entry.path().filename() == "data") {
      files.push_back(entry.path().string());
    }
  }
  return files;
}

}  // namespace gpufleet::runner_testing
