// SPDX-License-Identifier: Apache-2.0
#pragma once

// Repeated events of a job, stored once with a count, as Kubernetes groups them. A job that cannot
// fit is told why again whenever its reason changes, and the reason carries figures that change
// with the fleet ("32 lack free resources ... 46.73 free"): one such job logged 97 events in 6.5
// minutes. Events of one group, the same with their numbers left out (the same type and reason),
// are appended to the job's event log once, by the first of them; the later ones only count in
// the job's document ("event_groups": the group's latest message, count and first and last time).
// GET /v1/jobs/NAME/events shows the log entry with them (GroupEventItems).
//
// Bounded: a job's log grows by one entry per group, and a job keeps at most kMaxEventGroups
// groups (the oldest forgotten: its next event opens a new one), so a job told the same few
// reasons over and over stops growing its log; only more than kMaxEventGroups reasons in
// rotation add entries. A job placed starts afresh.

#include <cstddef>
#include <string>
#include <string_view>

#include "gpufleet/wire/json_fields.h"

namespace gpufleet::control {

inline constexpr size_t kMaxEventGroups = 32;

// `message` with each run of digits (and the '.' between two) as "#": the group of an event.
std::string EventGroupKey(std::string_view message);

// Counts `event`, at `now` (RFC 3339), in the groups of the job document `job`. Returns true when
// it opens a group (the caller appends it to the job's log), false when it only counted.
bool CountGroupedEvent(wire::Json& job, std::string_view event, std::string_view now);

// Forgets the job's groups (a new attempt's events start their own).
void ForgetEventGroups(wire::Json& job);

// The items of a job's event log as GET .../events answers them ({"revision", "message", "at"}
// each, oldest first), each with "count", "firstTime" and "lastTime": the latest entry of each of
// `job`'s groups gets the group's (its message the group's latest); every other entry, and one
// stored before events were grouped, is one event (count 1, both times its "at").
wire::Json GroupEventItems(wire::Json items, const wire::Json& job);

}  // namespace gpufleet::control
