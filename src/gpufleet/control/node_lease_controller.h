// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"

// The node lifecycle's leases (docs/agent.md, "Leases and fencing"): each agent node holds a
// lease that its heartbeats renew. A node silent for the lease becomes NotReady (its agent,
// unable to renew, stops its tasks itself); after the lease plus the stop grace its tasks are
// surely gone. It is the one writer of a node's NotReady state; a heartbeat undoes it.
namespace gpufleet::control {

// Thread-safe: heartbeats renew leases on the HTTP threads while the cycle checks them.
class NodeLeaseController {
 public:
  struct Options {
    // Must outlive the controller.
    store::StateStore& store;
    const Clock& clock;
    // A node not heard from since then gets the full lease from then (a restarted server).
    MonoTime started_at;
    Duration lease = std::chrono::seconds(40);
    Duration stop_grace = std::chrono::seconds(30);
  };
  explicit NodeLeaseController(Options options) : options_(std::move(options)) {}

  // A heartbeat of `node` numbered `sequence` (0: unnumbered) renews its lease, unless a report
  // numbered as high was applied already (delivered late: false, and nothing renewed). A
  // registration (`registering`) always renews. Call it before the node document is read, so
  // that a NotReady mark either sees it or is written before, for the heartbeat to undo.
  bool Renew(const std::string& node, int64_t sequence, bool registering);
  // A deleted node's lease goes.
  void Forget(const std::string& node);
  // Forgets every heartbeat: each node gets the full lease from `started_at` (a server that has
  // just become the leader, whose heartbeats went to the previous leader until now).
  void Restart(MonoTime started_at);
  // The latest heartbeat of each of `nodes` that sent one.
  std::map<std::string, MonoTime> HeartbeatTimes(const std::set<std::string>& nodes) const;

  // The cycle's part: agent nodes of the view silent for longer than the lease become NotReady
  // (a node update and an event each). The only caller of view.TakeNodeChanges(). Returns whether
  // anything was written. A write the store refuses for a conflict is left to the next cycle; any
  // other error ends the cycle (the view reads everything again).
  Result<bool> MarkSilentNodesNotReady(SchedulingView& view);
  // Nodes of `nodes` whose tasks are surely gone, with why: no agent runs tasks there, or the
  // lease expired plus the stop grace ago (the agent fenced itself).
  std::map<std::string, std::string> LostNodes(const std::map<std::string, ViewNode>& nodes) const;

 private:
  struct Heartbeat {
    MonoTime at;
    std::list<std::string>::iterator in_order;  // its place in heard_order_
  };

  // How long `node` has been silent. REQUIRES: mu_.
  Duration SilentFor(const std::string& node, MonoTime now) const;
  // The view's agent nodes, not NotReady, silent for longer than the lease at `now`. REQUIRES: mu_.
  std::vector<std::string> SilentNodes(SchedulingView& view, MonoTime now);

  Options options_;
  mutable std::mutex mu_;
  std::map<std::string, Heartbeat> last_heartbeat_;  // guarded by mu_
  // The nodes of last_heartbeat_, least recently heard first (a renewal moves a node to the
  // back): the cycle finds the nodes silent for the lease at the front, without a walk of the
  // whole fleet.
  std::list<std::string> heard_order_;            // guarded by mu_
  std::map<std::string, int64_t> last_sequence_;  // guarded by mu_
  // Whether every node of the view must be looked at for one not heard from since started_at
  // (once the lease from then has passed; after a full load of the view, or a failed write):
  // otherwise only the nodes the view read again since the last cycle can be such a node.
  bool unheard_walk_due_ = true;  // guarded by mu_
};

}  // namespace gpufleet::control
