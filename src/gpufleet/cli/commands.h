// SPDX-License-Identifier: Apache-2.0
// The client verbs of the `gpufleet` binary (`submit`, `get`, `describe`, `cancel`, `create`,
// `update`, `delete`, `revoke` and the node operations) as functions of an ApiClient, their
// arguments and two streams, so that tests run them against a fake Transport. Each returns the
// process exit code: 0, or 1 after printing the error to `err` (`Error from server (NotFound):
// <message>` for an error the server answered, `error: <message>` for any other).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/http/client.h"

namespace gpufleet::cli {

// `submit -f FILE`: POSTs the file to /v1/jobs as application/yaml (.yaml, .yml) or
// application/json (.json; other names are sniffed: "{" first means JSON); prints
// "job/NAME created", then each warning of the answer on `err` ("warning: ..."), such as a job no
// node of the fleet could ever hold. `--strict` (?strict=true) refuses such a job instead.
struct SubmitArgs {
  std::string file;
  bool strict = false;
};
int RunSubmit(http::ApiClient& client, const SubmitArgs& args, std::ostream& out,
              std::ostream& err);

// `get jobs|nodes|queues|teams|tokens|deployments [NAME] [-o table|wide|json|yaml] [--state S]
// [--queue Q]`; deployments list as NAME, DESIRED, READY, UTIL, TARGET, AGE.
// `get job NAME` (the singular and plural spellings are the same; a token's NAME is its id).
// --state and --queue filter jobs only. `clock` gives the time the AGE column counts to.
struct GetArgs {
  std::string kind;
  std::string name;    // empty: list
  std::string output;  // empty: table
  std::string state;
  std::string queue;
};
int RunGet(http::ApiClient& client, const GetArgs& args, const WallClock& clock, std::ostream& out,
           std::ostream& err);

// `describe job NAME` (fields, reason, placements, events), `describe node NAME`, or `describe
// deployment NAME` (spec summary, desired/ready replicas, utilization, reason, each replica's
// state, events).
struct DescribeArgs {
  std::string kind;
  std::string name;
};
// `clock`: the now of "last checkpoint 2m ago".
int RunDescribe(http::ApiClient& client, const DescribeArgs& args, const WallClock& clock,
                std::ostream& out, std::ostream& err);

// `explain job NAME [-o json|yaml]`: why the job waits (GET /v1/jobs/NAME/explain,
// docs/explain.md): the reason and its message, the evidence, the ETA, the jobs ahead of it
// (other teams' counted) and the what-ifs, or the answer as JSON or YAML.
struct ExplainArgs {
  std::string kind;
  std::string name;
  std::string output;  // empty: text
};
int RunExplain(http::ApiClient& client, const ExplainArgs& args, std::ostream& out,
               std::ostream& err);

// `logs JOB [--task T] [-f]` (GET /v1/jobs/NAME/logs, docs/agent.md "Task logs"): the tail of
// each task's log that its agent shipped, each line prefixed "[TASK] " when the job has several
// tasks (or "[TASK#ATTEMPT] " over several attempts). What was not shipped is said on `err`
// (no run yet, no log yet, bytes before the tail). With `follow`, asks again after
// `wait(kLogsFollowInterval)` and prints what is new until the job has ended and each task's
// final tail was printed, or kLogsFollowPollsAfterEnd answers after the end.
struct LogsArgs {
  std::string name;
  std::string task;  // empty: every task
  bool follow = false;
};
inline constexpr std::chrono::milliseconds kLogsFollowInterval{2000};
inline constexpr int kLogsFollowPollsAfterEnd = 20;
int RunLogs(http::ApiClient& client, const LogsArgs& args,
            const std::function<void(std::chrono::milliseconds)>& wait, std::ostream& out,
            std::ostream& err);

// `create team NAME` ("team/NAME created"), `create queue NAME [--team T]` ("queue/NAME
// created"), `create token --role admin|member|agent [--team T] [--node NODE] --name N`
// ("token/ID created", then the
// token itself, which the server shows this once). Admin only, as the server checks.
// `create deployment -f FILE` POSTs the JSON or YAML file (told apart as `submit` does) to
// /v1/deployments ("deployment/NAME created"); admins and members alike.
struct CreateArgs {
  std::string kind;  // team, queue, token or deployment
  std::string file;  // deployments: -f
  std::string name;  // the team's or queue's name; for a token, what --name does not set
  std::string team;
  std::string role;        // tokens
  std::string token_name;  // tokens: --name
  std::string node;        // agent tokens: --node, the one node the credential acts for
  // Queues: quota entries "MODEL=GPUS" ("*" for any model), weight, and whether it may borrow.
  std::vector<std::string> guarantee;
  std::vector<std::string> limit;
  std::optional<double> weight;
  bool no_borrow = false;
  bool allow_host_network = false;  // members' container tasks may use hostNetwork
};
int RunCreate(http::ApiClient& client, const CreateArgs& args, std::ostream& out,
              std::ostream& err);

// `update queue NAME [--guarantee MODEL=GPUS|MODEL-]... [--limit ...]... [--weight W]
// [--borrow|--no-borrow] [--allow-host-network|--no-host-network]`: changes only what it names (a
// JSON merge patch, PATCH /v1/queues/NAME); "MODEL-" removes that model's entry. Prints "queue/NAME
// updated". Admin only. `update deployment NAME [--min N] [--max N] [--target PCT]`: changes only
// the autoscaling options named (PATCH /v1/deployments/NAME); prints "deployment/NAME updated". Its
// team or admin.
struct UpdateArgs {
  std::string kind;  // queue or deployment
  std::string name;
  std::vector<std::string> guarantee;
  std::vector<std::string> limit;
  std::optional<double> weight;
  bool borrow = false;
  bool no_borrow = false;
  bool allow_host_network = false;
  bool no_host_network = false;
  // Deployments: min_replicas, max_replicas and target_utilization_pct.
  std::optional<int> min_replicas;
  std::optional<int> max_replicas;
  std::optional<int> target_pct;
};
int RunUpdate(http::ApiClient& client, const UpdateArgs& args, std::ostream& out,
              std::ostream& err);

// `delete queue NAME`: prints "queue/NAME deleted". Admin only; the server refuses a queue with
// child queues, unfinished jobs or deployments, and the queue "default".
// `delete deployment NAME`: cancels its replica jobs and removes it (DELETE
// /v1/deployments/NAME); prints "deployment/NAME deleted". Its team or admin.
struct DeleteArgs {
  std::string kind;  // queue or deployment
  std::string name;
};
int RunDelete(http::ApiClient& client, const DeleteArgs& args, std::ostream& out,
              std::ostream& err);

// `revoke token ID`: prints "token/ID revoked"; the token stops working at once.
struct RevokeArgs {
  std::string kind;  // token
  std::string id;
};
int RunRevoke(http::ApiClient& client, const RevokeArgs& args, std::ostream& out,
              std::ostream& err);

// `cancel NAME`: prints "job/NAME cancelled".
int RunCancel(http::ApiClient& client, const std::string& job, std::ostream& out,
              std::ostream& err);

// `resume NAME`: a job suspended by idle reclaim waits to be scheduled again; prints
// "job/NAME resumed".
int RunResume(http::ApiClient& client, const std::string& job, std::ostream& out,
              std::ostream& err);

// `cordon|uncordon|drain NODE`: prints "node/NODE cordoned" (uncordoned, drained).
enum class NodeAction { kCordon, kUncordon, kDrain, kQuarantine, kRelease };
// `quarantine|release NODE[/GPU] [--gpu N] [--reason TEXT]`: without a GPU, every GPU of the
// node; the reason (quarantine only) is stored with the quarantine.
struct NodeArgs {
  std::string node;
  std::optional<int> gpu;  // quarantine and release only
  std::string reason;      // quarantine only
};
int RunNodeAction(http::ApiClient& client, NodeAction action, const NodeArgs& args,
                  std::ostream& out, std::ostream& err);

// The whole of the file at `path`; `what` names it in errors ("cannot read job spec \"x\": ...").
// kInvalidArgument for a directory, kNotFound when it cannot be opened.
Result<std::string> ReadTextFile(const std::string& path, std::string_view what);

// Prints `status` as kubectl does; returns 1.
int PrintError(const http::ApiClient& client, const Status& status, std::ostream& err);

// "NOT_FOUND" -> "NotFound", as in `Error from server (NotFound): ...`.
std::string ReasonName(StatusCode code);

}  // namespace gpufleet::cli
