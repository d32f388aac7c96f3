// SPDX-License-Identifier: Apache-2.0
// Set-up helpers of the tests that run real podman and Debian's docker-registry on loopback
// (docs/containers.md, "Tests"): files, shell commands, free ports and the registry itself.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gpufleet::runner_testing {

// How long a test waits for a registry to come up, or for a push.
inline constexpr std::chrono::seconds kRegistryPatience{60};

std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& content);
// Runs a shell command for a test's own set-up (PATH only in its environment, at most 2
// minutes); empty when it exits 0, else its output and the reason.
std::string Shell(const std::string& command);
// A port on loopback that was free a moment ago; -1 if none could be had.
int FreeLoopbackPort();

// Debian's docker-registry (the CNCF distribution registry) on a loopback port, with `image`
// pushed to it as `name` (e.g. "tiny:1") by `podman_prefix` (podman with a test's storage
// flags). Ends the registry however the test ends. Not thread-safe.
class LoopbackRegistry {
 public:
  // Starts the registry in `dir`; address() is empty when it could not be started, and error()
  // says why.
  LoopbackRegistry(std::string dir, const std::string& podman_prefix, const std::string& image,
                   const std::string& name = "tiny:1");
  ~LoopbackRegistry() { Stop(); }
  LoopbackRegistry(const LoopbackRegistry&) = delete;
  LoopbackRegistry& operator=(const LoopbackRegistry&) = delete;

  void Stop();
  const std::string& address() const { return address_; }
  const std::string& error() const { return error_; }
  // What the registry logged: each request with its method, path and status.
  std::string log() const { return ReadFile(dir_ + "/registry.log"); }
  // The stored blobs' data files (layers and configs).
  std::vector<std::string> BlobFiles() const;

 private:
  std::string dir_;
  std::string address_;
  std::string error_;
};

}  // namespace gpufleet::runner_testing
