// SPDX-License-Identifier: Apache-2.0
// libFuzzer entry point for the request bodies the server parses besides job specs (issue 33):
// the agent protocol (register, heartbeat, provenance, and the server's reply as the agent reads
// it), deployments, teams, queues and their patches, tokens and outcome reports, and the one JSON
// parse under them all. Every input goes to every parser: none may crash, hang, leak or overflow
// the stack (a body nested 100,000 deep once did), and what the agent protocol's parsers accept
// must come back the same through its writers. Built by CMake only with clang; see CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gpufleet/control/outcome_json.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/deployment_spec.h"
#include "gpufleet/wire/json_fields.h"

namespace {

// `parse` of what `write` made of a value `parse` accepted must give the same text again.
template <typename Parse, typename Write>
void CheckRoundTrip(std::string_view text, Parse parse, Write write) {
  const auto parsed = parse(text);
  if (!parsed.ok()) {
    return;
  }
  const std::string written = write(*parsed);
  const auto again = parse(written);
  if (!again.ok() || write(*again) != written) {
    std::fprintf(stderr, "round trip failed: %s\n--- written:\n%s\n",
                 again.status().ToString().c_str(), written.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace wire = gpufleet::wire;
  namespace control = gpufleet::control;
  static const gpufleet::GpuCatalog* const catalog =
      new gpufleet::GpuCatalog(gpufleet::GpuCatalog::Default());
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (const gpufleet::Result<wire::Json> json = wire::ParseJson(text); json.ok()) {
    // What was accepted is shallow enough to copy, compare and write out.
    const wire::Json copy = *json;
    if (copy != *json ||
        wire::ParseJson(copy.dump()).status().code() != gpufleet::StatusCode::kOk) {
      std::abort();
    }
  }
  CheckRoundTrip(text, wire::ParseRegisterRequest, wire::RegisterRequestToJson);
  CheckRoundTrip(text, wire::ParseHeartbeatRequest, wire::HeartbeatRequestToJson);
  CheckRoundTrip(text, wire::ParseAgentReply, wire::AgentReplyToJson);
  CheckRoundTrip(text, wire::ParseProvenanceReport, wire::ProvenanceReportToJson);
  if (const auto deployment = wire::ParseDeploymentSpec(text, *catalog); deployment.ok()) {
    (void)wire::DeploymentSpecToJson(*deployment).dump();
  }
  (void)control::ParseTeamRequest(text);
  (void)control::ParseQueueRequest(text, *catalog);
  (void)control::ParseQueuePatch(text, *catalog);
  (void)control::ParseTokenRequest(text);
  (void)control::ParseOutcomeReport(text);
  return 0;
}
