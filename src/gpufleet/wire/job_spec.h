// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"

// The job specification format (`apiVersion: gpufleet.io/v1`, `kind: Job`), in YAML or JSON, and
// its conversion to and from `gpufleet::Job`. The schema, field by field, is in docs/job-spec.md.
// Every function here is thread-safe (no shared state) and never throws.
namespace gpufleet::wire {

inline constexpr std::string_view kJobSpecApiVersion = "gpufleet.io/v1";
// Specs larger than this are refused before parsing.
inline constexpr size_t kMaxJobSpecBytes = size_t{1} << 20;

// Parses a job spec in YAML or, when the first non-blank character is '{', JSON; converts it to a
// Job (`Job::id` is `metadata.name`) and checks it with `Job::Validate(catalog)`.
// kInvalidArgument for everything wrong with the text, always naming the field path and the bad
// value, e.g. `spec.tasks[1].resources.gpus.migProfile: unknown profile "3g.45gb" for H100-80GB
// (valid: ...)`, most with a "(line L, column C)" suffix; JSON syntax errors come in JSON's own
// terms ("invalid JSON: parse error at line 2, column 10: ..."). Unknown fields, duplicate keys,
// more than one YAML document, more than 32 levels of nesting and more than 100,000 values after
// expanding YAML aliases are errors too. `metadata.labels` becomes `Job::labels`.
Result<Job> ParseJobSpec(std::string_view text, const GpuCatalog& catalog);

// The same for a spec already parsed as JSON, such as the `spec` member of a stored job document:
// the same checks and messages, without "(line L, column C)" (a parsed value has no positions).
// The scheduler reads every pending job's stored spec through this, without printing it back to
// text for ParseJobSpec.
Result<Job> JobSpecFromJson(const nlohmann::json& spec, const GpuCatalog& catalog);

// What one job may ask for, so that no submission can stop the scheduling of others: a job
// with more tasks than this is refused at submit (Kubernetes caps a Job's indexes at 100,000, but
// our placements are stored in the job's document).
inline constexpr int64_t kMaxTasksPerJob = 4096;
// A bound on what one task's placement adds to its job's stored document (node name, GPU
// assignments, phase and end), for the submit-time size check.
int64_t PlacementBytesBound(const TaskGroup& group);
// The submit-time limits a parsed job must also meet: at most kMaxTasksPerJob tasks, and its
// stored document (`document_bytes` as submitted) with every placement and the reasons and stop
// record of its life within `max_document_bytes` (the store's limit). kInvalidArgument naming the
// field and the figures, e.g. `spec.tasks: 20000 tasks in all, more than the limit of 4096`.
Status CheckSubmissionLimits(const Job& job, size_t document_bytes, size_t max_document_bytes);
// Whether the agent would have something to run for every task: a command, an image (whose
// entrypoint runs), or both. A submit-time check, as CheckSubmissionLimits: a stored job is read
// as it was. kInvalidArgument naming the task, e.g. `spec.tasks[1].command: task "eval" has
// neither a command nor an image; give it one or both`.
Status CheckTasksRunnable(const Job& job);

// The same schema back: ParseJobSpec(JobSpecToYaml(job)) gives `job` again for every Job field of
// a valid job whose queue is set (an empty queue parses back as "default"). Fields at their
// default value are left out, except `kind`, `priority` and `preemptible`.
std::string JobSpecToYaml(const Job& job);
nlohmann::json JobSpecToJson(const Job& job);

// The scalar formats of the schema, exposed for tests and for other front ends (CLI flags).
// Errors are kInvalidArgument with a message that quotes `text` but names no field.
//
// CPU in milli-CPU: "2" -> 2000, "0.5" -> 500, "500m" -> 500. Must be positive; at most three
// decimal places ("0.0001" is too precise).
Result<int64_t> ParseCpuQuantity(std::string_view text);
// Memory in MiB, rounded up: plain bytes, binary suffixes Ki Mi Gi Ti Pi and decimal suffixes
// k/K M G T P, with up to nine decimal places: "1Gi" -> 1024, "1G" -> 954, "100Ki" -> 1. Must be
// positive.
Result<int64_t> ParseMemoryQuantity(std::string_view text);
// A duration: integer seconds ("90") or integer amounts of h, m, s, ms, us, ns in any order
// ("2h", "1h30m", "1500ms"). Must not be negative.
Result<Duration> ParseSpecDuration(std::string_view text);

// Offset of the first byte of `text` that is not well-formed UTF-8 (overlong forms, surrogates
// and code points above U+10FFFF are not), or std::string_view::npos.
size_t InvalidUtf8Offset(std::string_view text);

// Names of the objects a spec refers to, checked by the same rules as the spec's fields:
// kInvalidArgument naming `field` and `text` otherwise. A team is a DNS label ("nlp"); a queue is
// DNS labels joined by '/' ("research/nlp"), like `metadata.queue`.
Status ValidateTeamName(std::string_view field, std::string_view text);
// A node is a DNS-1123 label too ("node-0007"), so that it can be named in paths and labels.
Status ValidateNodeName(std::string_view field, std::string_view text);
Status ValidateQueueName(std::string_view field, std::string_view text);

// Canonical forms: "2" or "500m"; "256Gi", "2Ti" or "100Mi"; "1h30m", "90s" -> "1m30s", "0s".
std::string FormatCpuQuantity(int64_t cpu_milli);
std::string FormatMemoryQuantity(int64_t memory_mib);
std::string FormatSpecDuration(Duration duration);

}  // namespace gpufleet::wire
