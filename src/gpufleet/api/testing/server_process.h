// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpufleet/core/status.h"

namespace gpufleet::api_testing {

// A `gpufleet server` child process for end-to-end tests and benchmarks: started from the built
// binary, its stdout and stderr drained by a thread into output(), killed and reaped on
// destruction. Thread-compatible: one owner thread.
class ServerProcess {
 public:
  // Runs `binary server ARGS...` and waits up to `timeout` for its "listening on
  // SCHEME://HOST:PORT" line. kUnavailable (with the output so far) if it exits or stays silent;
  // kInternal if it cannot be spawned.
  static Result<std::unique_ptr<ServerProcess>> Start(const std::string& binary,
                                                      const std::vector<std::string>& args,
                                                      std::chrono::milliseconds timeout);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  // Sends `signal` (SIGKILL: a crash; SIGTERM: a clean stop) and reaps the process. Returns its
  // wait status. Idempotent.
  int KillAndWait(int signal);
  // Everything it printed so far.
  std::string output() const;

 private:
  ServerProcess(pid_t pid, int output_fd);
  void Drain();

  const pid_t pid_;
  const int output_fd_;
  int port_ = 0;
  bool reaped_ = false;
  int wait_status_ = 0;
  mutable std::mutex mu_;
  std::condition_variable output_cv_;
  std::string output_;   // guarded by mu_
  bool closed_ = false;  // guarded by mu_; the child closed its end
  std::thread drainer_;
};

}  // namespace gpufleet::api_testing
