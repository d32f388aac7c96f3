// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/node_lease_controller.h"

#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/cluster.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::control {
namespace {

int64_t Seconds(Duration duration) {
  return std::chrono::duration_cast<std::chrono::seconds>(duration).count();
}

}  // namespace

bool NodeLeaseController::Renew(const std::string& node, int64_t sequence, bool registering) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t& last_sequence = last_sequence_[node];
  if (!registering && sequence != 0 && sequence <= last_sequence) {
    return false;
  }
  const MonoTime now = options_.clock.Now();
  auto [beat, first] = last_heartbeat_.try_emplace(node);
  if (first) {
    beat->second.in_order = heard_order_.insert(heard_order_.end(), node);
  } else {
    heard_order_.splice(heard_order_.end(), heard_order_, beat->second.in_order);
  }
  beat->second.at = now;
  last_sequence = sequence;
  return true;
}

void NodeLeaseController::Restart(MonoTime started_at) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.started_at = started_at;
  last_heartbeat_.clear();
  heard_order_.clear();
  last_sequence_.clear();
  unheard_walk_due_ = true;
}

void NodeLeaseController::Forget(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto beat = last_heartbeat_.find(node); beat != last_heartbeat_.end()) {
    heard_order_.erase(beat->second.in_order);
    last_heartbeat_.erase(beat);
  }
  last_sequence_.erase(node);
}

std::map<std::string, MonoTime> NodeLeaseController::HeartbeatTimes(
    const std::set<std::string>& nodes) const {
  std::map<std::string, MonoTime> times;
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& node : nodes) {
    if (const auto beat = last_heartbeat_.find(node); beat != last_heartbeat_.end()) {
      times.emplace(node, beat->second.at);
    }
  }
  return times;
}

Duration NodeLeaseController::SilentFor(const std::string& node, MonoTime now) const {
  const auto it = last_heartbeat_.find(node);
  return now - (it == last_heartbeat_.end() ? options_.started_at : it->second.at);
}

std::vector<std::string> NodeLeaseController::SilentNodes(SchedulingView& view, MonoTime now) {
  const auto watched = [&](const std::string& name) {
    const auto node = view.nodes().find(name);
    return node != view.nodes().end() && node->second.agent &&
           node->second.node.state != NodeState::kNotReady;
  };
  std::vector<std::string> silent;
  // Heard from, oldest first, up to the first node heard within the lease.
  for (const std::string& name : heard_order_) {
    if (now - last_heartbeat_.at(name).at <= options_.lease) {
      break;
    }
    if (watched(name)) {
      silent.push_back(name);
    }
  }
  // Not heard from since started_at: none is silent before the lease from then has passed (the
  // view's changes wait for then). Then every node of the view is looked at once; after that a
  // node can become such a one only by a change the view reads (added, uncordoned, written by
  // another server), or by a write of ours that failed.
  if (now - options_.started_at <= options_.lease) {
    return silent;
  }
  const std::optional<std::set<std::string>> changed = view.TakeNodeChanges();
  const auto unheard = [&](const std::string& name) {
    if (!last_heartbeat_.contains(name) && watched(name)) {
      silent.push_back(name);
    }
  };
  if (unheard_walk_due_ || !changed) {
    for (const auto& [name, node] : view.nodes()) {
      unheard(name);
    }
    unheard_walk_due_ = false;
  } else {
    for (const std::string& name : *changed) {
      unheard(name);
    }
  }
  return silent;
}

Result<bool> NodeLeaseController::MarkSilentNodesNotReady(SchedulingView& view) {
  std::vector<std::string> silent_nodes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    silent_nodes = SilentNodes(view, options_.clock.Now());
  }
  bool wrote = false;
  for (const std::string& name : silent_nodes) {
    // Held across the write: a heartbeat renews before it reads the node, so it either comes
    // first (the node is not silent) or waits and then finds NotReady to undo.
    std::lock_guard<std::mutex> lock(mu_);
    const Duration silent = SilentFor(name, options_.clock.Now());
    if (silent <= options_.lease) {
      continue;
    }
    Result<store::StoredObject> object = options_.store.Get(kNodesKind, name);
    if (!object.ok()) {
      unheard_walk_due_ = true;  // this node, or one after it, may be one never heard from
      return object.status();
    }
    Json doc = wire::ParseDocument(object->data);
    doc["state_before_not_ready"] = wire::StrOr(doc, "state", NodeStateName(NodeState::kReady));
    doc["state"] = NodeStateName(NodeState::kNotReady);
    store::WriteBatch batch;
    batch.Update(std::string(kNodesKind), name, doc.dump(), object->version);
    batch.AppendEvent(
        std::string(kNodesKind), name,
        fmt::format("NotReady: no heartbeat for {}s; its lease expired, so its agent stops its "
                    "tasks; their GPUs are free after another {}s",
                    Seconds(silent), Seconds(options_.stop_grace)));
    const Status status = options_.store.Commit(batch);
    if (!status.ok() && status.code() != StatusCode::kAborted) {
      unheard_walk_due_ = true;
      view.ReadAllAgain();
      return status;
    }
    wrote = wrote || status.ok();
  }
  return wrote;
}

std::map<std::string, std::string> NodeLeaseController::LostNodes(
    const std::map<std::string, ViewNode>& nodes) const {
  const MonoTime now = options_.clock.Now();
  std::map<std::string, std::string> lost;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, node] : nodes) {
    if (!node.agent) {
      lost[name] = fmt::format("node {} runs no agent", name);
      continue;
    }
    const Duration silent = SilentFor(name, now);
    if (silent > options_.lease + options_.stop_grace) {
      lost[name] =
          fmt::format("node {} lost: no heartbeat for {}s (lease {}s + stop grace {}s)", name,
                      Seconds(silent), Seconds(options_.lease), Seconds(options_.stop_grace));
    }
  }
  return lost;
}

}  // namespace gpufleet::control
