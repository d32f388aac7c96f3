// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string_view>

// The store kinds the control plane shares with the API server, and the retry bound of their
// read-modify-writes. Job and node documents are JSON; their layout is the REST representation
// (docs/api.md) plus a few internal fields the scheduling loop needs.
namespace gpufleet::control {

inline constexpr std::string_view kJobsKind = "jobs";
inline constexpr std::string_view kNodesKind = "nodes";
// Fleet-wide objects: kTopologyName, {"levels": ["block", "leaf"]}, the cluster's declared levels
// (the API server writes it), and "reliability-breaker", the reliability loop's circuit breaker
// (ReliabilityController).
inline constexpr std::string_view kClusterKind = "cluster";
inline constexpr std::string_view kTopologyName = "topology";
// Provenance records (docs/provenance.md), one object per run of a task, named by its task id
// (JOB/TASK/ATTEMPT), created once and never updated.
inline constexpr std::string_view kProvenanceKind = "provenance";
// The member of a node document that says its credential was made by a join token's registration
// and has not been used since: the agent may never have received it, so the join token may
// register the node again, replacing it (docs/agent.md, "Credentials").
inline constexpr std::string_view kCredentialUnclaimed = "credential_unclaimed";
// The member of a node document's GPU that holds it for the reliability loop's diagnostic
// ({"id", "kind", "reason", "requested_ns", "drain"}, and "result" once the agent reported it):
// the scheduler places nothing on the GPU while it is there (docs/reliability.md, "The loop").
inline constexpr char kDiagnosticHoldField[] = "diagnostic";
// Compare-and-set retries of one request before it answers 409.
inline constexpr int kCasAttempts = 5;

}  // namespace gpufleet::control
