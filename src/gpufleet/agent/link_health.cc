// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/link_health.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <system_error>
#include <utility>

#include <fmt/core.h>

#include "gpufleet/agent/dcgm_metrics.h"
#include "gpufleet/os/files.h"

namespace gpufleet::agent {
namespace {

// sysfs `state` and `phys_state` values of a healthy port (include/rdma/ib_verbs.h).
constexpr int kPortActive = 4;
constexpr int kPhysLinkUp = 5;
// node_exporter's rate_bytes_per_second and speed_bytes: Gb/s and Mb/s as bytes per second.
constexpr double kBytesPerGigabit = 125'000'000;
constexpr int64_t kBytesPerMegabit = 125'000;

// The port counters exported, with node_exporter's names. port_{rcv,xmit}_data count 4-octet
// words (the InfiniBand spec's PortRcvData), hence the scale.
struct IbCounterMetric {
  const char* file;
  const char* metric;
  uint64_t scale;
  const char* help;
};
constexpr IbCounterMetric kIbCounters[] = {
    {"excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors_total", 1,
     "Number of times that OverrunErrors consecutive flow control update periods occurred, each "
     "having at least one overrun error."},
    {"link_downed", "link_downed_total", 1,
     "Number of times the link failed to recover from an error state and went down"},
    {"link_error_recovery", "link_error_recovery_total", 1,
     "Number of times the link successfully recovered from an error state"},
    {"local_link_integrity_errors", "local_link_integrity_errors_total", 1,
     "Number of times that the count of local physical errors exceeded the threshold specified by "
     "LocalPhyErrors."},
    {"port_rcv_constraint_errors", "port_constraint_errors_received_total", 1,
     "Number of packets received on the switch physical port that are discarded"},
    {"port_xmit_constraint_errors", "port_constraint_errors_transmitted_total", 1,
     "Number of packets not transmitted from the switch physical port"},
    {"port_rcv_data", "port_data_received_bytes_total", 4,
     "Number of data octets received on all links"},
    {"port_xmit_data", "port_data_transmitted_bytes_total", 4,
     "Number of data octets transmitted on all links"},
    {"port_xmit_discards", "port_discards_transmitted_total", 1,
     "Number of outbound packets discarded by the port because the port is down or congested"},
    {"port_rcv_errors", "port_errors_received_total", 1,
     "Number of packets containing an error that were received on this port"},
    {"port_rcv_packets", "port_packets_received_total", 1,
     "Number of packets received on all VLs by this port (including errors)"},
    {"port_xmit_packets", "port_packets_transmitted_total", 1,
     "Number of packets transmitted on all VLs from this port (including errors)"},
    {"port_xmit_wait", "port_transmit_wait_total", 1,
     "Number of ticks during which the port had data to transmit but no data was sent during the "
     "entire tick"},
    {"port_rcv_remote_physical_errors", "port_receive_remote_physical_errors_total", 1,
     "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port."},
    {"port_rcv_switch_relay_errors", "port_receive_switch_relay_errors_total", 1,
     "Number of packets that could not be forwarded by the switch."},
    {"symbol_error", "symbol_error_total", 1,
     "Number of minor link errors detected on one or more physical lanes."},
    {"VL15_dropped", "vl15_dropped_total", 1,
     "Number of incoming VL15 packets dropped due to resource limitations."},
};

// The interface statistics exported, with node_exporter's netdev names.
struct NetCounterMetric {
  const char* file;
  const char* metric;
  const char* help;
};
constexpr NetCounterMetric kNetCounters[] = {
    {"rx_bytes", "node_network_receive_bytes_total", "Network device statistic receive_bytes."},
    {"rx_dropped", "node_network_receive_drop_total", "Network device statistic receive_drop."},
    {"rx_errors", "node_network_receive_errs_total", "Network device statistic receive_errs."},
    {"rx_packets", "node_network_receive_packets_total",
     "Network device statistic receive_packets."},
    {"tx_bytes", "node_network_transmit_bytes_total", "Network device statistic transmit_bytes."},
    {"tx_dropped", "node_network_transmit_drop_total", "Network device statistic transmit_drop."},
    {"tx_errors", "node_network_transmit_errs_total", "Network device statistic transmit_errs."},
    {"tx_packets", "node_network_transmit_packets_total",
     "Network device statistic transmit_packets."},
};

std::string_view TrimLine(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n";
  const size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) {
    return {};
  }
  return text.substr(begin, text.find_last_not_of(kSpace) - begin + 1);
}

template <typename Number>
std::optional<Number> ParseNumber(std::string_view text) {
  Number value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

// The trimmed content of `path`; nullopt when it does not exist.
Result<std::optional<std::string>> ReadValue(const std::filesystem::path& path) {
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<std::string> content, os::ReadSmallFile(path.string()));
  if (!content.has_value()) {
    return std::optional<std::string>();
  }
  return std::optional<std::string>(std::string(TrimLine(*content)));
}

// The names in `dir`, sorted; none when it does not exist.
Result<std::vector<std::string>> ListDirectory(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  std::error_code error;
  if (!std::filesystem::exists(dir, error)) {
    return names;
  }
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    names.push_back(it->path().filename().string());
  }
  if (error) {
    return UnavailableError(
        fmt::format("links: cannot list {}: {}", dir.string(), error.message()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// counters/ or statistics/: every file holding an unsigned number. Files that hold none (some
// drivers leave a counter unsupported, reading as an error) are skipped, as node_exporter does.
Result<std::map<std::string, uint64_t>> ReadCounters(const std::filesystem::path& dir) {
  std::map<std::string, uint64_t> counters;
  GPUFLEET_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
  for (const std::string& name : names) {
    Result<std::optional<std::string>> value = ReadValue(dir / name);
    if (!value.ok() || !value->has_value()) {
      continue;
    }
    if (const std::optional<uint64_t> number = ParseNumber<uint64_t>(**value)) {
      counters[name] = *number;
    }
  }
  return counters;
}

Result<IbPortReading> ReadIbPort(const std::filesystem::path& dir, const std::string& device,
                                 int port) {
  IbPortReading reading;
  reading.device = device;
  reading.port = port;
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<std::string> state, ReadValue(dir / "state"));
  if (state.has_value()) {
    Result<std::pair<int, std::string>> parsed = ParseIbPortState((dir / "state").string(), *state);
    GPUFLEET_RETURN_IF_ERROR(parsed.status());
    std::tie(reading.state_id, reading.state) = std::move(parsed).value();
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<std::string> phys_state, ReadValue(dir / "phys_state"));
  if (phys_state.has_value()) {
    Result<std::pair<int, std::string>> parsed =
        ParseIbPortState((dir / "phys_state").string(), *phys_state);
    GPUFLEET_RETURN_IF_ERROR(parsed.status());
    std::tie(reading.phys_state_id, reading.phys_state) = std::move(parsed).value();
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<std::string> rate, ReadValue(dir / "rate"));
  if (rate.has_value()) {
    Result<std::pair<double, std::string>> parsed = ParseIbRate(*rate);
    if (!parsed.ok()) {
      return InvalidArgumentError(
          fmt::format("{}: {}", (dir / "rate").string(), parsed.status().message()));
    }
    std::tie(reading.rate_gbps, reading.rate_detail) = std::move(parsed).value();
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<std::string> link_layer, ReadValue(dir / "link_layer"));
  reading.link_layer = link_layer.value_or("");
  GPUFLEET_ASSIGN_OR_RETURN(reading.counters, ReadCounters(dir / "counters"));
  return reading;
}

Result<NetInterfaceReading> ReadNetInterface(const std::filesystem::path& dir,
                                             const std::string& name) {
  NetInterfaceReading reading;
  reading.name = name;
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<std::string> operstate, ReadValue(dir / "operstate"));
  reading.operstate = operstate.value_or("unknown");
  // Reading `speed` fails with EINVAL on an interface without a link: no speed, not an error.
  Result<std::optional<std::string>> speed = ReadValue(dir / "speed");
  if (speed.ok() && speed->has_value()) {
    const std::optional<int64_t> mbps = ParseNumber<int64_t>(**speed);
    if (mbps.has_value() && *mbps >= 0) {
      reading.speed_mbps = *mbps;
    }
  }
  GPUFLEET_ASSIGN_OR_RETURN(reading.statistics, ReadCounters(dir / "statistics"));
  return reading;
}

std::string PortName(const IbPortReading& port) {
  return fmt::format("{}/{}", port.device, port.port);
}

bool PortUp(const IbPortReading& port) {
  return port.state_id == kPortActive && port.phys_state_id == kPhysLinkUp;
}

// How much `name` grew from `before` to `after`; 0 when either lacks it or it went backwards.
uint64_t Growth(const std::map<std::string, uint64_t>& before,
                const std::map<std::string, uint64_t>& after, const std::string& name) {
  const auto old_value = before.find(name);
  const auto new_value = after.find(name);
  if (old_value == before.end() || new_value == after.end() ||
      new_value->second < old_value->second) {
    return 0;
  }
  return new_value->second - old_value->second;
}

void AppendHelp(std::string& out, std::string_view name, std::string_view type,
                std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// One counter: its header, then a line per (labels, value); nothing when it has no series (a
// metric without series is left out, as node_exporter does).
void AppendCounter(std::string& out, std::string_view name, std::string_view help,
                   const std::vector<std::pair<std::string, uint64_t>>& series) {
  if (series.empty()) {
    return;
  }
  AppendHelp(out, name, "counter", help);
  for (const auto& [labels, value] : series) {
    out += fmt::format("{}{{{}}} {}\n", name, labels, value);
  }
}

std::string PortLabels(const IbPortReading& port) {
  return fmt::format("device=\"{}\",port=\"{}\"", EscapeLabelValue(port.device), port.port);
}

std::string FormatGbps(double gbps) {
  return fmt::format("{:g}", gbps);
}

}  // namespace

Result<std::pair<int, std::string>> ParseIbPortState(std::string_view field,
                                                     std::string_view text) {
  const std::string_view trimmed = TrimLine(text);
  const size_t colon = trimmed.find(':');
  const std::optional<int> id =
      colon == std::string_view::npos ? std::nullopt : ParseNumber<int>(trimmed.substr(0, colon));
  if (!id.has_value()) {
    return InvalidArgumentError(
        fmt::format("{}: \"{}\" is not \"<number>: <name>\"", field, trimmed));
  }
  return std::make_pair(*id, std::string(TrimLine(trimmed.substr(colon + 1))));
}

Result<std::pair<double, std::string>> ParseIbRate(std::string_view text) {
  const std::string_view trimmed = TrimLine(text);
  const size_t unit = trimmed.find(" Gb/sec");
  std::optional<double> gbps;
  if (unit != std::string_view::npos) {
    gbps = ParseNumber<double>(trimmed.substr(0, unit));
  }
  if (!gbps.has_value() || *gbps < 0) {
    return InvalidArgumentError(
        fmt::format("rate \"{}\" is not \"<number> Gb/sec (<width> <speed>)\"", trimmed));
  }
  std::string_view detail = TrimLine(trimmed.substr(unit + std::string_view(" Gb/sec").size()));
  if (detail.size() >= 2 && detail.front() == '(' && detail.back() == ')') {
    detail = detail.substr(1, detail.size() - 2);
  }
  return std::make_pair(*gbps, std::string(detail));
}

Result<LinkReadings> ReadLinks(const std::string& sysfs_root) {
  LinkReadings readings;
  const std::filesystem::path infiniband = std::filesystem::path(sysfs_root) / "class/infiniband";
  GPUFLEET_ASSIGN_OR_RETURN(std::vector<std::string> devices, ListDirectory(infiniband));
  for (const std::string& device : devices) {
    const std::filesystem::path ports_dir = infiniband / device / "ports";
    GPUFLEET_ASSIGN_OR_RETURN(std::vector<std::string> ports, ListDirectory(ports_dir));
    std::vector<IbPortReading> device_ports;
    for (const std::string& port : ports) {
      const std::optional<int> number = ParseNumber<int>(port);
      if (!number.has_value()) {
        continue;
      }
      GPUFLEET_ASSIGN_OR_RETURN(IbPortReading reading,
                                ReadIbPort(ports_dir / port, device, *number));
      device_ports.push_back(std::move(reading));
    }
    // Numerically: port 10 after port 9.
    std::sort(device_ports.begin(), device_ports.end(),
              [](const IbPortReading& a, const IbPortReading& b) { return a.port < b.port; });
    for (IbPortReading& reading : device_ports) {
      readings.ports.push_back(std::move(reading));
    }
  }
  const std::filesystem::path net = std::filesystem::path(sysfs_root) / "class/net";
  GPUFLEET_ASSIGN_OR_RETURN(std::vector<std::string> interfaces, ListDirectory(net));
  for (const std::string& name : interfaces) {
    if (name == "lo" || !std::filesystem::is_directory(net / name)) {
      continue;  // the loopback; bonding_masters is a file among the interfaces
    }
    GPUFLEET_ASSIGN_OR_RETURN(NetInterfaceReading reading, ReadNetInterface(net / name, name));
    readings.interfaces.push_back(std::move(reading));
  }
  return readings;
}

std::vector<LinkFinding> EvaluateLinkState(const LinkReadings& current,
                                           const LinkHealthOptions& options) {
  std::map<std::string, double> best_rate;  // link layer -> best rate among active ports
  for (const IbPortReading& port : current.ports) {
    if (PortUp(port)) {
      best_rate[port.link_layer] = std::max(best_rate[port.link_layer], port.rate_gbps);
    }
  }
  std::vector<LinkFinding> findings;
  for (const IbPortReading& port : current.ports) {
    const std::string name = PortName(port);
    if (!PortUp(port)) {
      findings.push_back({name, "port_down",
                          fmt::format("{}: port {} ({}), not ACTIVE and LinkUp", name,
                                      port.state.empty() ? "state unknown" : port.state,
                                      port.phys_state.empty() ? "unknown" : port.phys_state)});
      continue;
    }
    const double expected =
        options.expected_rate_gbps > 0 ? options.expected_rate_gbps : best_rate[port.link_layer];
    if (port.rate_gbps < expected) {
      findings.push_back(
          {name, "rate",
           fmt::format("{}: rate {} Gb/sec ({}) below {} Gb/sec", name, FormatGbps(port.rate_gbps),
                       port.rate_detail, FormatGbps(expected))});
    }
  }
  return findings;
}

std::vector<LinkFinding> EvaluateLinkCounters(const LinkReadings& before, const LinkReadings& after,
                                              const LinkHealthOptions& options) {
  struct CounterRule {
    const char* counter;
    const char* rule;
    uint64_t bound;
  };
  const CounterRule port_rules[] = {
      {"link_downed", "link_downed", options.max_link_downed_increase},
      {"symbol_error", "symbol_error", options.max_symbol_error_increase},
      {"port_rcv_errors", "receive_errors", options.max_receive_error_increase},
  };
  std::vector<LinkFinding> findings;
  for (const IbPortReading& port : after.ports) {
    const auto old_port =
        std::find_if(before.ports.begin(), before.ports.end(), [&](const IbPortReading& candidate) {
          return candidate.device == port.device && candidate.port == port.port;
        });
    if (old_port == before.ports.end()) {
      continue;
    }
    for (const CounterRule& rule : port_rules) {
      const uint64_t growth = Growth(old_port->counters, port.counters, rule.counter);
      if (growth > rule.bound) {
        findings.push_back({PortName(port), rule.rule,
                            fmt::format("{}: {} grew by {} (more than {})", PortName(port),
                                        rule.counter, growth, rule.bound)});
      }
    }
  }
  for (const NetInterfaceReading& interface : after.interfaces) {
    const auto old_interface = std::find_if(
        before.interfaces.begin(), before.interfaces.end(),
        [&](const NetInterfaceReading& candidate) { return candidate.name == interface.name; });
    if (interface.operstate != "up" || old_interface == before.interfaces.end()) {
      continue;
    }
    for (const char* counter : {"rx_errors", "tx_errors"}) {
      const uint64_t growth = Growth(old_interface->statistics, interface.statistics, counter);
      if (growth > options.max_netdev_error_increase) {
        findings.push_back({interface.name, "netdev_errors",
                            fmt::format("{}: {} grew by {} (more than {})", interface.name, counter,
                                        growth, options.max_netdev_error_increase)});
      }
    }
  }
  return findings;
}

std::string RenderLinkMetrics(const LinkReadings& readings) {
  std::string out;
  if (!readings.ports.empty()) {
    AppendHelp(out, "node_infiniband_physical_state_id", "gauge",
               "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: "
               "disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)");
    for (const IbPortReading& port : readings.ports) {
      out += fmt::format("node_infiniband_physical_state_id{{{}}} {}\n", PortLabels(port),
                         port.phys_state_id);
    }
    AppendHelp(out, "node_infiniband_rate_bytes_per_second", "gauge",
               "Maximum signal transfer rate");
    for (const IbPortReading& port : readings.ports) {
      out += fmt::format("node_infiniband_rate_bytes_per_second{{{}}} {}\n", PortLabels(port),
                         static_cast<uint64_t>(port.rate_gbps * kBytesPerGigabit));
    }
    AppendHelp(out, "node_infiniband_state_id", "gauge",
               "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: "
               "active, 5: act defer)");
    for (const IbPortReading& port : readings.ports) {
      out += fmt::format("node_infiniband_state_id{{{}}} {}\n", PortLabels(port), port.state_id);
    }
    for (const IbCounterMetric& counter : kIbCounters) {
      std::vector<std::pair<std::string, uint64_t>> series;
      for (const IbPortReading& port : readings.ports) {
        if (const auto value = port.counters.find(counter.file); value != port.counters.end()) {
          series.emplace_back(PortLabels(port), value->second * counter.scale);
        }
      }
      AppendCounter(out, fmt::format("node_infiniband_{}", counter.metric), counter.help, series);
    }
  }
  if (readings.interfaces.empty()) {
    return out;
  }
  for (const NetCounterMetric& counter : kNetCounters) {
    std::vector<std::pair<std::string, uint64_t>> series;
    for (const NetInterfaceReading& interface : readings.interfaces) {
      if (const auto value = interface.statistics.find(counter.file);
          value != interface.statistics.end()) {
        series.emplace_back(fmt::format("device=\"{}\"", EscapeLabelValue(interface.name)),
                            value->second);
      }
    }
    AppendCounter(out, counter.metric, counter.help, series);
  }
  AppendHelp(out, "node_network_speed_bytes", "gauge", "Network device property: speed_bytes");
  for (const NetInterfaceReading& interface : readings.interfaces) {
    if (interface.speed_mbps.has_value()) {
      out +=
          fmt::format("node_network_speed_bytes{{device=\"{}\"}} {}\n",
                      EscapeLabelValue(interface.name), *interface.speed_mbps * kBytesPerMegabit);
    }
  }
  AppendHelp(out, "node_network_up", "gauge", "Value is 1 if operstate is 'up', 0 otherwise.");
  for (const NetInterfaceReading& interface : readings.interfaces) {
    out += fmt::format("node_network_up{{device=\"{}\"}} {}\n", EscapeLabelValue(interface.name),
                       interface.operstate == "up" ? 1 : 0);
  }
  return out;
}

LinkMonitor::LinkMonitor(Options options) : options_(std::move(options)) {}

Status LinkMonitor::SampleOnce() {
  Result<LinkReadings> readings = ReadLinks(options_.sysfs_root);
  const MonoTime now = options_.clock.Now();
  std::lock_guard<std::mutex> lock(mu_);
  if (!readings.ok()) {
    ++sample_errors_;
    return readings.status();
  }
  if (!window_start_.has_value()) {
    window_start_ = *readings;
    window_started_at_ = now;
  } else if (now - window_started_at_ >= options_.health.window) {
    counter_findings_ = EvaluateLinkCounters(*window_start_, *readings, options_.health);
    window_start_ = *readings;
    window_started_at_ = now;
  }
  findings_ = EvaluateLinkState(*readings, options_.health);
  findings_.insert(findings_.end(), counter_findings_.begin(), counter_findings_.end());
  latest_ = std::move(readings).value();
  return Status();
}

std::vector<LinkFinding> LinkMonitor::Findings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return findings_;
}

std::string LinkMonitor::RenderMetrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  if (latest_.has_value()) {
    out = RenderLinkMetrics(*latest_);
    AppendHelp(out, "gpufleet_node_link_health", "gauge",
               "Health verdict of the node's links: 0 healthy, 1 degraded (a port down, a rate "
               "below the best, errors growing).");
    out += fmt::format("gpufleet_node_link_health {}\n", findings_.empty() ? 0 : 1);
  }
  AppendHelp(out, "gpufleet_agent_link_sample_errors_total", "counter",
             "Link samples that failed because sysfs could not be read.");
  out += fmt::format("gpufleet_agent_link_sample_errors_total {}\n", sample_errors_);
  return out;
}

}  // namespace gpufleet::agent
