// SPDX-License-Identifier: Apache-2.0
#pragma once

// When each event happened. The store keeps an event's text and the revision of the commit that
// appended it, not a time; the server's store, EventTimeStore around the real one (`gpufleet
// server` and `gpufleet dev` wrap theirs), writes the wall-clock time at the head of every event
// it appends ("@2026-12-03T12:00:05Z submitted by alice to queue default"), and GET .../events
// answers it apart as `at` (ParseEventText). Events written without it (before this change, or
// by a server whose store is not wrapped) have no time.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"

namespace gpufleet::api {

// `text` as stored with the time `unix_nanos` (to the second) at its head.
std::string StampEventText(int64_t unix_nanos, std::string_view text);

// A stored event's text split into its time (RFC 3339, UTC; nullopt when it carries none) and
// its message.
struct EventText {
  std::optional<std::string> at;
  std::string_view message;
};
EventText ParseEventText(std::string_view stored);

// A store that stamps the events of every commit with the wall-clock time of the commit (an
// event that carries a time already keeps it), and forwards everything else to `inner`
// unchanged. Thread-safe as `inner` is; `inner` and
// `wall_clock` must outlive it. Observers of `inner` see the stamped batch.
class EventTimeStore final : public store::StateStore {
 public:
  EventTimeStore(store::StateStore& inner, const WallClock& wall_clock)
      : inner_(inner), wall_clock_(wall_clock) {}

 protected:
  Result<store::StoredObject> DoGet(std::string_view kind, std::string_view name) override;
  Result<std::vector<store::StoredObject>> DoList(std::string_view kind,
                                                  std::string_view name_prefix) override;
  Result<std::vector<store::StoredObject>> DoListWhere(std::string_view kind,
                                                       const store::ListFilter& filter) override;
  Status DoCommit(const store::WriteBatch& batch) override;
  Result<int64_t> DoRevision() override;
  Result<std::vector<store::StoredEvent>> DoEvents(std::string_view kind,
                                                   std::string_view name) override;

 private:
  store::StateStore& inner_;
  const WallClock& wall_clock_;
};

}  // namespace gpufleet::api
