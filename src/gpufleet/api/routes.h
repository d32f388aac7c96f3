// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/api/auth.h"
#include "gpufleet/api/server.h"
#include "gpufleet/control/control_plane.h"
#include "gpufleet/control/principal.h"
#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"

namespace gpufleet::api {

// The handlers of the REST routes (docs/api.md) that ApiServer's route table calls once it has
// authenticated a request and checked that this server may serve it: they read the store, call
// the control plane for what it owns and answer through JsonResponse/ErrorResponse. Thread-safe
// as the server is.
class ApiRoutes {
 public:
  // All must outlive the routes; `ready` is whether a cycle has run (explain needs one).
  ApiRoutes(const ApiServer::Options& options, control::ControlPlane& control,
            TokenAuthenticator& authenticator, const std::atomic<bool>& ready)
      : options_(options), control_(&control), authenticator_(authenticator), ready_(ready) {}

  // The /v1 collections of jobs, nodes and the agent protocol (server.cc): nullopt for a method
  // or path they do not serve.
  std::optional<ApiResponse> RouteJobs(const control::Principal& who, const ApiRequest& request,
                                       const std::vector<std::string_view>& segments);
  std::optional<ApiResponse> RouteNodes(const control::Principal& who, const ApiRequest& request,
                                        const std::vector<std::string_view>& segments);
  std::optional<ApiResponse> RouteAgents(const control::Principal& who, const ApiRequest& request,
                                         const std::vector<std::string_view>& segments);
  // The dashboard (server_dashboard.cc, docs/dashboard.md): its embedded files at / and
  // /assets/... (no token: they hold no data; nullopt for another path), and GET /v1/utilization
  // and GET /v1/whoami (nullopt for another method or path).
  std::optional<ApiResponse> ServeDashboard(const ApiRequest& request) const;
  std::optional<ApiResponse> RouteDashboard(const control::Principal& who,
                                            const ApiRequest& request,
                                            const std::vector<std::string_view>& segments);

  // A stored node; NodeNotFound when there is none.
  Result<store::StoredObject> StoredNode(std::string_view name);
  // kind/name from the store: `absent` when it is not there or its name is no valid key, the
  // store's other errors as they are.
  Result<store::StoredObject> ReadObject(std::string_view kind, std::string_view name,
                                         const Status& absent);
  // The same for a team-owned object (job, deployment) as `who` may see it: one of a team `who`
  // does not see (Principal::Sees) is `absent` too, so names do not leak.
  Result<store::StoredObject> ReadVisible(const control::Principal& who, std::string_view kind,
                                          std::string_view name, const Status& absent);
  // Adds `stopping.waiting_for` (DescribeStopping) to a Stopping job as served.
  void AnnotateStopping(Json& job) const;

  // The handlers of one job take its store key (ResolveName), not the name a user wrote.
  // Submit and cancel as `who` (the HTTP routes and the deployment controller's replicas): the
  // stored job as served, or why not (kAlreadyExists: the name is taken in the team;
  // kFailedPrecondition: the job has ended and cannot be cancelled).
  //
  // A job that no node of the fleet could ever hold (policy/never_fits.h) is accepted with a
  // warning in the answer ("warnings") and the reason "never fits: ..." (the cycle checks it again
  // whenever nodes change); with `strict` it is refused (kFailedPrecondition naming the field).
  // Only a strict submission waits for a running cycle to check; another is checked by the cycle.
  // `check_fleet` false skips the check: the deployment controller submits from inside the cycle,
  // which holds the cycle mutex.
  struct SubmitOptions {
    bool strict = false;
    bool check_fleet = true;
  };
  Result<Json> SubmitJob(const control::Principal& who, std::string_view body,
                         SubmitOptions options);
  Result<Json> SubmitJob(const control::Principal& who, std::string_view body) {
    return SubmitJob(who, body, SubmitOptions{});
  }
  ApiResponse ListJobs(const control::Principal& who, const ApiRequest& request);
  ApiResponse GetJob(const control::Principal& who, std::string_view name);
  // The run going of a job that holds resources, as "progress": {"elapsed_s", "busy_pct"}
  // (docs/api.md): since its placement, and its GPUs' measured utilization over that time.
  void AddRunGoing(Json& job);
  // GET /v1/jobs/NAME/explain (server_explain.cc, docs/explain.md): why the job waits, as `who`
  // may see it. Takes the cycle mutex.
  ApiResponse ExplainJob(const control::Principal& who, std::string_view name);
  Result<Json> CancelJob(const control::Principal& who, std::string_view name);
  // A job's events, repeats grouped: each with "count", "firstTime" and "lastTime".
  ApiResponse JobEvents(const control::Principal& who, std::string_view name);
  // GET /v1/jobs/NAME/logs?task=T (server_logs.cc).
  ApiResponse JobLogs(const control::Principal& who, std::string_view name,
                      const ApiRequest& request);
  // {"items": [{"revision": ..., "message": ...}]} of a job or node.
  ApiResponse ObjectEvents(std::string_view kind, std::string_view name);
  // The items of ObjectEvents ("at" where the event carries its time).
  Result<Json> EventItems(std::string_view kind, std::string_view name);
  ApiResponse ListNodes(const control::Principal& who);
  ApiResponse GetNode(const control::Principal& who, std::string_view name);
  // DELETE /v1/nodes/NAME (admin): removes a node that holds no runs (409 naming the jobs
  // otherwise). An agent still running there registers it again at its next heartbeat.
  ApiResponse DeleteNode(const control::Principal& who, std::string_view name);
  ApiResponse NodeAction(const control::Principal& who, std::string_view name,
                         std::string_view action, const std::string& body);

  // Tenancy (server_tenancy.cc): the /v1/tokens, /v1/teams and /v1/queues routes (nullopt for a
  // path or method they do not serve), and the checks of a submission: the
  // token's team and the queue exist (kInvalidArgument) and a member may use the queue
  // (kPermissionDenied).
  // Reliability (server_reliability.cc): the /v1/outcomes and /v1/reports routes (nullopt for a
  // path they do not serve).
  std::optional<ApiResponse> RouteReliability(const control::Principal& who,
                                              const ApiRequest& request,
                                              const std::vector<std::string_view>& segments);
  std::optional<ApiResponse> RouteTenancy(const control::Principal& who, const ApiRequest& request,
                                          const std::vector<std::string_view>& segments);
  Status CheckSubmission(const control::Principal& who, std::string_view queue_name,
                         bool host_network);
  // The store key of the job or deployment (`kind`; `noun` for messages) that `who` names `text`,
  // NAME or TEAM/NAME (docs/api.md, "Names"). A member's names are its own team's: another
  // team's TEAM/NAME is kNotFound, as for any hidden object. An admin's bare NAME is its own
  // team's object if there is one, else the one team's object of that name: kNotFound when no
  // team has one, kInvalidArgument naming `name` and the candidates when several do.
  Result<std::string> ResolveName(const control::Principal& who, std::string_view kind,
                                  std::string_view noun, std::string_view text);

  // POST /v1/jobs/NAME/resume (server_reclaim.cc): a Suspended job back to Pending (admin or the
  // job's team).
  ApiResponse ResumeJob(const control::Principal& who, std::string_view name);

  // Deployments (server_deployments.cc): the /v1/deployments routes (nullopt for a path they do
  // not serve). The cycle's DeploymentController step submits and cancels replicas through
  // SubmitJob and CancelJob (ApiServer's replica_jobs_).
  std::optional<ApiResponse> RouteDeployments(const control::Principal& who,
                                              const ApiRequest& request,
                                              const std::vector<std::string_view>& segments);
  // DELETE /v1/deployments/NAME: cancels the live replicas, then removes the deployment.
  // PATCH /v1/deployments/NAME {"autoscaling": {...}}: merges the options, checked as on creation,
  // and rebuilds the autoscaler. Both take the control plane's cycle mutex.
  ApiResponse DeleteDeployment(const control::Principal& who, std::string_view name);
  ApiResponse UpdateDeployment(const control::Principal& who, std::string_view name,
                               std::string_view body);

  // GET /v1/provenance?job=NAME[&attempt=N] (server_provenance.cc): the job's records, by
  // attempt and task (nullopt for another method or path).
  std::optional<ApiResponse> RouteProvenance(const control::Principal& who,
                                             const ApiRequest& request,
                                             const std::vector<std::string_view>& segments);
  // Usage ledger (server_usage.cc, docs/usage.md): GET /v1/usage (nullopt for a path it does not
  // serve).
  std::optional<ApiResponse> RouteUsage(const control::Principal& who, const ApiRequest& request,
                                        const std::vector<std::string_view>& segments);

 private:
  const ApiServer::Options& options_;
  control::ControlPlane* const control_;
  TokenAuthenticator& authenticator_;
  const std::atomic<bool>& ready_;
};

}  // namespace gpufleet::api
