// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/control/principal.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/policy/queues.h"

// Teams and queues as stored objects, and the request bodies that create them and tokens
// (docs/api.md). A stored document is the REST representation of the object without its
// `version`; later fields (a queue's parent, quota or weight) are added to the struct, to its
// request's accepted fields and to its document, and old documents read them as absent.
// Every function here is thread-safe (no shared state) and never throws.
namespace gpufleet::control {

// Store kinds; the object name is the team's or the queue's name.
inline constexpr std::string_view kTeamsKind = "teams";
inline constexpr std::string_view kQueuesKind = "queues";
// One object, name kQueueUsageName: the queue tree's decayed usage as the server last saved it,
// {"saved_at_unix_seconds": ..., "queues": {"research/nlp": {"H100-80GB": <GPU-seconds>}}}.
inline constexpr std::string_view kQueueUsageKind = "queue-usage";
inline constexpr std::string_view kQueueUsageName = "usage";
// The queue that always exists (the server creates it on its first start), shared by every team;
// a job spec without `metadata.queue` goes there.
inline constexpr std::string_view kDefaultQueue = "default";

// A team: what a member token belongs to and what owns jobs and queues.
struct Team {
  std::string name;  // a DNS label, e.g. "nlp"
};

// A queue that jobs are submitted to. "research/nlp" sits under "research" in the queue tree;
// quota and fair share work as policy/queues.h says (docs/utilization.md).
struct Queue {
  std::string name;  // DNS labels joined by '/', e.g. "research/nlp"
  // The team whose members may submit to it; empty: every team may (the default queue).
  std::string team;
  // Milli-GPU by canonical GPU model name, policy::kAnyGpuModel ("*") for any model.
  policy::GpuMilliByModel guarantee;
  policy::GpuMilliByModel limit;  // empty: unlimited
  double weight = 1.0;
  bool may_borrow = true;
  // Whether members may submit container tasks with `hostNetwork: true` to it: such a task shares
  // the node's network (its interfaces, services on loopback). Admins always may.
  bool allow_host_network = false;
  // How long its jobs and its sub-queues' run before they may be preempted, unless a job's
  // `spec.preemption.minRuntime` says otherwise; nullopt: the parent queue's, else the server's
  // (--min-runtime-before-preemption-s). Stored as "min_runtime", a spec duration ("10m").
  std::optional<int64_t> min_runtime_seconds;
};

// The queue tree of `queues`: a parent that was not created is implied, with no quota and
// weight 1, and "default" is always there. kInvalidArgument naming the queue and field when the
// quotas do not add up (a child guaranteed more than its parent, a limit below the guarantee).
Result<policy::QueueTree> BuildQueueTree(const std::vector<Queue>& queues,
                                         policy::QueueTreeOptions options = {});

// One quota field of a queue patch, merged as RFC 7386 merges objects: each named model is set,
// a model whose value is null is removed, and a null field clears the quota first.
struct QuotaPatch {
  bool clear = false;
  std::map<std::string, std::optional<int64_t>> entries;  // milli-GPU by canonical model
};

// A PATCH /v1/queues/NAME body (a JSON merge patch): an absent field keeps its value, a null one
// goes back to its default (no quota, weight 1, may borrow).
struct QueuePatch {
  std::optional<QuotaPatch> guarantee;
  std::optional<QuotaPatch> limit;
  std::optional<double> weight;
  std::optional<bool> may_borrow;
  std::optional<bool> allow_host_network;
  // Set: the new min_runtime_seconds (nullopt inside: none, the parent's or the server's).
  std::optional<std::optional<int64_t>> min_runtime_seconds;
  // The version the queue must be at (optimistic concurrency, as Kubernetes' resourceVersion);
  // nullopt: whatever it is.
  std::optional<int64_t> version;
};

// `queue` with `patch` merged in.
Queue ApplyQueuePatch(Queue queue, const QueuePatch& patch);

// A POST /v1/tokens body.
struct TokenRequest {
  Role role = Role::kMember;
  std::string team;  // required for a member; optional for an admin
  std::string name;  // who or what holds the token, e.g. "ci-bot"
  std::string node;  // agents only: the node this credential acts for (a DNS-1123 label)
};

// Strict readers of request bodies (JSON objects): kInvalidArgument naming the field and the bad
// value for malformed JSON, a missing required field, a value of the wrong type, an invalid name
// or an unknown field. They do not check that a named team exists (the server does).
// {"name": "nlp"}
Result<Team> ParseTeamRequest(std::string_view body);
// {"name": "research/nlp", "team": "nlp", "guarantee": {"H100-80GB": 16}, "limit": {"*": 64},
// "weight": 2, "may_borrow": true, "allow_host_network": false, "min_runtime": "10m"}; all but
// "name" are optional. Quota
// values are GPUs (up to three decimals), keyed by a GPU model of `catalog` (aliases are stored by
// canonical name) or "*".
Result<Queue> ParseQueueRequest(std::string_view body, const GpuCatalog& catalog);
// {"guarantee": {"H100-80GB": 8, "A100-80GB": null}, "limit": null, "weight": 2, "may_borrow":
// false, "version": 3}; every field is optional, values are validated as ParseQueueRequest does.
Result<QueuePatch> ParseQueuePatch(std::string_view body, const GpuCatalog& catalog);
// {"role": "member", "team": "nlp", "name": "ci-bot"}; "name" is printable ASCII, at most 63
// characters.
Result<TokenRequest> ParseTokenRequest(std::string_view body);

// Names of jobs and deployments are scoped by team, as Kubernetes names are by namespace
// (docs/api.md, "Names"): teams a and b may both have a job "train". The store key is
// TEAM/NAME; '/' cannot occur in a team name or a DNS-1123 object name, so the key splits back
// unambiguously. Objects of an admin token without a team keep the bare NAME as their key.
inline constexpr char kTeamSeparator = '/';
std::string TeamScopedKey(std::string_view team, std::string_view name);
// The key of a stored job or deployment document, from its "team" and "name".
std::string TeamScopedKeyOf(const nlohmann::json& document);
// NAME and TEAM of a key TEAM/NAME (the key itself and "" when it has no team).
std::string_view NameOfKey(std::string_view key);
std::string_view TeamOfKey(std::string_view key);
// A path's object name as a user writes it, NAME or TEAM/NAME, and the action after it.
struct ScopedPath {
  std::string name;
  std::string_view action;  // empty: the object itself
};
// Splits /v1/COLLECTION/NAME[/ACTION] and /v1/COLLECTION/TEAM/NAME[/ACTION] (`segments` without
// empty ones) of a request with `method`: a last segment "events" or "explain" of a GET, "cancel"
// or "resume" of a POST is the action. nullopt when there is no name or more segments than these
// forms have.
std::optional<ScopedPath> ParseScopedPath(const std::vector<std::string_view>& segments,
                                          std::string_view method);
// kInvalidArgument naming `field` for the names "events" and "explain": GET .../TEAM/events
// would read as the events of a job TEAM.
Status CheckScopedName(std::string_view field, std::string_view name);

// Stored documents, and lenient readers of them (a missing field reads as empty).
nlohmann::json TeamToJson(const Team& team);
nlohmann::json QueueToJson(const Queue& queue);
Queue QueueFromJson(const nlohmann::json& document);

}  // namespace gpufleet::control
