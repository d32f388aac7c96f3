// SPDX-License-Identifier: Apache-2.0
// Crash safety of `gpufleet server` (issue 4): the real binary is SIGKILLed 50 times at seeded
// random moments while clients submit and cancel jobs and its scheduling loop places them, and is
// restarted each time on the same data directory. Afterwards the store must hold every
// acknowledged submission, every acknowledged cancel, no GPU share held twice, and job histories
// that only ever moved forward.
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/event_time_store.h"
#include "gpufleet/api/testing/server_process.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/store/sqlite_store.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet {
namespace {

using Json = nlohmann::json;

constexpr char kAdminToken[] = "crash-test-admin-token-0123456789";
constexpr int kRounds = 50;
constexpr int kWorkers = 3;
constexpr uint64_t kSeed = 20261129;
constexpr auto kStartTimeout = std::chrono::seconds(20);

std::string JobSpec(const std::string& name, int replicas, int gpus) {
  return Json{
      {"apiVersion", "gpufleet.io/v1"},
      {"kind", "Job"},
      {"metadata", {{"name", name}}},
      {"spec",
       {{"tasks",
         {{{"name", "main"},
           {"command", {"train"}},
           {"replicas", replicas},
           {"resources", {{"cpu", "1"}, {"memory", "1Gi"}, {"gpus", {{"count", gpus}}}}}}}}}}}
      .dump();
}

// What the clients were told: the jobs whose submission (201) or cancel (200) was acknowledged.
struct Acknowledged {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<std::string> submitted;  // guarded by mu
  std::set<std::string> cancelled;     // guarded by mu
  int this_round = 0;                  // guarded by mu; operations acknowledged this round
};

// Submits and cancels against the server on `port` until `stop`. Failures (the server is being
// killed) are expected and ignored.
void RunClient(int port, int round, int worker, std::atomic<bool>& stop, Acknowledged& acknowledged,
               uint64_t seed) {
  Random random(seed);
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(std::chrono::seconds(2));
  client.set_read_timeout(std::chrono::seconds(5));
  client.set_bearer_token_auth(kAdminToken);
  for (int sequence = 0; !stop.load(); ++sequence) {
    std::string cancel_target;
    if (random.Uniform(10) < 3) {
      std::lock_guard<std::mutex> lock(acknowledged.mu);
      if (!acknowledged.submitted.empty()) {
        cancel_target = acknowledged.submitted[random.Uniform(acknowledged.submitted.size())];
      }
    }
    if (!cancel_target.empty()) {
      httplib::Result answer =
          client.Post(fmt::format("/v1/jobs/{}/cancel", cancel_target), "", "text/plain");
      if (answer && answer->status == 200) {
        std::lock_guard<std::mutex> lock(acknowledged.mu);
        acknowledged.cancelled.insert(cancel_target);
        ++acknowledged.this_round;
        acknowledged.changed.notify_all();
      }
      continue;
    }
    const std::string name = fmt::format("job-{}-{}-{}", round, worker, sequence);
    const bool gang = random.Uniform(5) == 0;
    const std::string spec =
        gang ? JobSpec(name, 2, 8) : JobSpec(name, 1, static_cast<int>(1 + random.Uniform(8)));
    httplib::Result answer = client.Post("/v1/jobs", spec, "application/json");
    if (answer && answer->status == 201) {
      std::lock_guard<std::mutex> lock(acknowledged.mu);
      acknowledged.submitted.push_back(name);
      ++acknowledged.this_round;
      acknowledged.changed.notify_all();
    }
  }
}

// The state an event moves a job to, and the states it may come from.
struct Transition {
  std::string prefix;
  std::set<std::string> from;  // empty: the first event
  std::string to;
};

const std::vector<Transition>& Transitions() {
  static const std::vector<Transition> kTransitions = {
      {"submitted by ", {}, "Pending"},
      {"unschedulable: ", {"Pending"}, "Pending"},
      {"scheduled on ", {"Pending"}, "Scheduled"},
      {"cancelled by ", {"Pending"}, "Cancelled"},
      // A run ends through Stopping; the simulated nodes run no agent, so the next cycle finds
      // its tasks gone.
      {"Stopping, then Cancelled: cancelled by ", {"Scheduled", "Running"}, "Stopping"},
      {"task ", {"Stopping"}, "Stopping"},
      {"stopped: every task has ended; now Cancelled", {"Stopping"}, "Cancelled"},
      {"stopped: every task has ended; now Pending", {"Stopping"}, "Pending"},
      {"requeued", {"Scheduled", "Running"}, "Pending"},
  };
  return kTransitions;
}

class CrashSafetyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "gpufleet-crash-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ / "admin-token") << kAdminToken << "\n";
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  Result<std::unique_ptr<api_testing::ServerProcess>> StartServer() {
    return api_testing::ServerProcess::Start(
        GPUFLEET_BINARY,
        {"--data-dir", dir_.string(), "--listen", "127.0.0.1:0", "--simulated-nodes", "4x8",
         "--admin-token-file", (dir_ / "admin-token").string(), "--cycle-interval-ms", "5"},
        kStartTimeout);
  }

  std::filesystem::path dir_;
};

TEST_F(CrashSafetyTest, KilledFiftyTimesLosesNothingAcknowledged) {
  Acknowledged acknowledged;
  Random kill_points(kSeed);
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    Result<std::unique_ptr<api_testing::ServerProcess>> server = StartServer();
    ASSERT_OK(server);
    // The kill comes after a seeded number of acknowledged operations, wherever the server then
    // is: in a commit, between a commit and its answer, or in a scheduling cycle.
    const int kill_after = static_cast<int>(2 + kill_points.Uniform(30));
    std::atomic<bool> stop{false};
    {
      std::lock_guard<std::mutex> lock(acknowledged.mu);
      acknowledged.this_round = 0;
    }
    std::vector<std::thread> clients;
    for (int worker = 0; worker < kWorkers; ++worker) {
      clients.emplace_back(RunClient, (*server)->port(), round, worker, std::ref(stop),
                           std::ref(acknowledged),
                           kSeed + static_cast<uint64_t>(round * kWorkers + worker));
    }
    {
      std::unique_lock<std::mutex> lock(acknowledged.mu);
      EXPECT_TRUE(acknowledged.changed.wait_for(
          lock, kStartTimeout, [&] { return acknowledged.this_round >= kill_after; }))
          << "the server acknowledged too little: " << (*server)->output();
    }
    const int status = (*server)->KillAndWait(SIGKILL);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << (*server)->output();
    stop.store(true);
    for (std::thread& client : clients) {
      client.join();
    }
  }

  // A last start must serve again (and its scheduling loop must accept the store it finds).
  {
    Result<std::unique_ptr<api_testing::ServerProcess>> server = StartServer();
    ASSERT_OK(server);
    httplib::Client client("127.0.0.1", (*server)->port());
    client.set_read_timeout(std::chrono::seconds(10));
    // Its first cycle may write many pending reasons (one fsync each), so allow it time.
    const SystemClock clock;
    const MonoTime deadline = clock.Now() + kStartTimeout;
    bool ready = false;
    while (!ready && clock.Now() < deadline) {
      httplib::Result answer = client.Get("/readyz");
      ready = answer && answer->status == 200;
      if (!ready) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    EXPECT_TRUE(ready) << (*server)->output();
    (*server)->KillAndWait(SIGTERM);
  }

  Result<std::unique_ptr<store::SqliteStateStore>> store =
      store::SqliteStateStore::Open((dir_ / "gpufleet.db").string());
  ASSERT_OK(store);
  Result<std::vector<store::StoredObject>> jobs = (*store)->List("jobs");
  ASSERT_OK(jobs);
  std::map<std::string, Json> by_name;
  for (const store::StoredObject& object : *jobs) {
    by_name[object.name] = wire::ParseDocument(object.data);
  }
  std::lock_guard<std::mutex> lock(acknowledged.mu);
  EXPECT_GT(acknowledged.submitted.size(), static_cast<size_t>(kRounds));
  EXPECT_FALSE(acknowledged.cancelled.empty());
  for (const std::string& name : acknowledged.submitted) {
    EXPECT_EQ(by_name.count(name), 1u) << "acknowledged job " << name << " is lost";
  }
  for (const std::string& name : acknowledged.cancelled) {
    EXPECT_EQ(wire::StrOr(by_name[name], "state"), "Cancelled") << name;
  }

  std::map<std::string, int64_t> milli_by_gpu;  // by GPU UUID
  int scheduled = 0;
  for (const auto& [name, job] : by_name) {
    SCOPED_TRACE(name);
    const std::string state = wire::StrOr(job, "state");
    const Json& placements = wire::ArrayOr(job, "placements");
    if (state == "Scheduled" || state == "Running" || state == "Stopping") {
      ++scheduled;
      const int64_t replicas = job["spec"]["spec"]["tasks"][0].value("replicas", int64_t{1});
      EXPECT_EQ(static_cast<int64_t>(placements.size()), replicas) << "a gang placed in part";
      for (const Json& placement : placements) {
        const Json& assignments = wire::ArrayOr(placement, "assignments");
        const Json& uuids = wire::ArrayOr(placement, "gpu_uuids");
        ASSERT_EQ(uuids.size(), assignments.size()) << placement.dump();
        for (size_t i = 0; i < assignments.size(); ++i) {
          ASSERT_TRUE(uuids[i].is_string() && !uuids[i].get<std::string>().empty())
              << placement.dump();
          milli_by_gpu[uuids[i].get<std::string>()] += wire::IntOr(assignments[i], "milli", 0);
        }
      }
    } else {
      EXPECT_TRUE(state == "Pending" || state == "Cancelled") << "illegal state " << state;
      EXPECT_TRUE(placements.empty()) << state << " but holding GPUs";
    }

    // The history only moves forward, and the document agrees with its last step.
    Result<std::vector<store::StoredEvent>> events = (*store)->Events("jobs", name);
    ASSERT_OK(events);
    std::string current;
    for (const store::StoredEvent& event : *events) {
      // The server writes each event's time at its head.
      const api::EventText text = api::ParseEventText(event.text);
      EXPECT_TRUE(text.at.has_value()) << "no time on \"" << event.text << "\"";
      const Transition* matched = nullptr;
      for (const Transition& transition : Transitions()) {
        if (text.message.starts_with(transition.prefix)) {
          matched = &transition;
        }
      }
      ASSERT_NE(matched, nullptr) << "unknown event \"" << event.text << "\"";
      EXPECT_TRUE(matched->from.empty() ? current.empty() : matched->from.count(current) > 0)
          << "\"" << event.text << "\" after " << (current.empty() ? "nothing" : current);
      if (matched->prefix == "cancelled by ") {
        EXPECT_NE(text.message.find(fmt::format("(was {})", current)), std::string::npos)
            << event.text << " but the job was " << current;
      }
      current = matched->to;
    }
    EXPECT_EQ(current, state) << "the event log ends in " << current;
  }
  EXPECT_GT(scheduled, 0) << "the scheduling loop placed nothing; the test proves little";
  fmt::print(
      "{} kills; {} jobs stored, {} submissions and {} cancels acknowledged, {} jobs "
      "holding GPUs\n",
      kRounds, by_name.size(), acknowledged.submitted.size(), acknowledged.cancelled.size(),
      scheduled);
  for (const auto& [gpu, milli] : milli_by_gpu) {
    EXPECT_LE(milli, 1000) << gpu << " is held by more than one task";
  }
}

}  // namespace
}  // namespace gpufleet
