// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"

// NIC and link health: the kernel's InfiniBand/RoCE port tree
// (/sys/class/infiniband/<dev>/ports/<n>/, Documentation/ABI/stable/sysfs-class-infiniband) and
// the netdev tree (/sys/class/net/<if>/, Documentation/ABI/testing/sysfs-class-net-statistics),
// exported under node_exporter's metric names (its infiniband and netclass/netdev collectors) so
// that fabric dashboards built on node_exporter read the agent unchanged, and judged by link
// rules: a port that is not up, a rate below the node's best, error counters growing.
namespace gpufleet::agent {

// One port of an RDMA device (an InfiniBand HCA or a RoCE NIC).
struct IbPortReading {
  std::string device;  // "mlx5_0"
  int port = 1;
  int state_id = 0;         // `state`: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER
  std::string state;        // "ACTIVE"
  int phys_state_id = 0;    // `phys_state`: 5 LinkUp, 2 Polling, 3 Disabled ...
  std::string phys_state;   // "LinkUp"
  double rate_gbps = 0;     // `rate` "400 Gb/sec (4X NDR)" -> 400; 0 when the port has none
  std::string rate_detail;  // "4X NDR": the width and speed the rate came from
  std::string link_layer;   // "InfiniBand" or "Ethernet" (RoCE); empty when the file is absent
  // counters/<name> -> value, for the counters the port has (names as the kernel spells them).
  std::map<std::string, uint64_t> counters;
};

// One network interface.
struct NetInterfaceReading {
  std::string name;                   // "eth0"
  std::string operstate;              // "up", "down", "unknown" ...
  std::optional<int64_t> speed_mbps;  // `speed`; absent when unreadable or negative (no link)
  // statistics/<name> -> value ("rx_errors", "tx_dropped" ...).
  std::map<std::string, uint64_t> statistics;
};

struct LinkReadings {
  std::vector<IbPortReading> ports;             // by device, then port
  std::vector<NetInterfaceReading> interfaces;  // by name; the loopback left out
};

// "4: ACTIVE" -> {4, "ACTIVE"}; the format of `state` and `phys_state`. kInvalidArgument naming
// `field` and the text otherwise.
Result<std::pair<int, std::string>> ParseIbPortState(std::string_view field, std::string_view text);

// "400 Gb/sec (4X NDR)" -> {400, "4X NDR"}; "2.5 Gb/sec (1X SDR)" -> {2.5, "1X SDR"}.
// kInvalidArgument naming the text otherwise.
Result<std::pair<double, std::string>> ParseIbRate(std::string_view text);

// Reads <sysfs_root>/class/infiniband and <sysfs_root>/class/net ("/sys" on a node; a fixture
// tree in tests). A missing class directory reads as no devices (a node without RDMA). A port
// file that cannot be parsed is an error naming its path and text.
Result<LinkReadings> ReadLinks(const std::string& sysfs_root);

// Bounds of the link rules. A counter that grows by more than its bound within one window is a
// finding; a counter that goes backwards (reset, driver reload) is taken as a new start.
struct LinkHealthOptions {
  // How long the counters grow before they are judged; their findings then stand for the next
  // window, so a heartbeat between two samples sees them.
  std::chrono::seconds window{300};
  // The rate every active port of a link layer should run at; 0: the best rate among the node's
  // active ports of that link layer (the node's ports are alike, so a slower one lost lanes or
  // speed).
  double expected_rate_gbps = 0;
  // A link that went down and came back is lost traffic for every rank across it.
  uint64_t max_link_downed_increase = 0;
  // Physical-layer errors, counted per symbol: a few now and then are normal; a steady stream
  // is a bad cable or transceiver.
  uint64_t max_symbol_error_increase = 10;
  uint64_t max_receive_error_increase = 10;  // port_rcv_errors
  // rx_errors and tx_errors of an interface that is up.
  uint64_t max_netdev_error_increase = 10;
};

// One reason the node's links are not simply healthy.
struct LinkFinding {
  std::string link;    // "mlx5_0/1" or "eth0"
  std::string rule;    // "port_down", "rate", "link_downed", "symbol_error", "receive_errors",
                       // "netdev_errors"
  std::string reason;  // for a person, e.g. "mlx5_0/1: rate 200 Gb/sec (2X NDR) below 400"

  friend bool operator==(const LinkFinding&, const LinkFinding&) = default;
};

// The state findings of `current`: an RDMA port that is not ACTIVE and LinkUp, and an active port
// whose rate is below the expected one.
std::vector<LinkFinding> EvaluateLinkState(const LinkReadings& current,
                                           const LinkHealthOptions& options = {});

// The counter findings from `before` to `after`: link_downed, symbol_error and port_rcv_errors
// of each RDMA port, rx_errors and tx_errors of each interface that is up in `after` (an unused
// interface is down by design). A port or interface missing from `before` is not judged.
std::vector<LinkFinding> EvaluateLinkCounters(const LinkReadings& before, const LinkReadings& after,
                                              const LinkHealthOptions& options = {});

// The node_exporter text for `readings`: node_infiniband_{state_id, physical_state_id,
// rate_bytes_per_second} and the error and traffic counters (labels device, port);
// node_network_{up, speed_bytes} and the interfaces' receive/transmit error and drop counters
// (label device). `hostname` is not a label: node_exporter's series carry the node as the
// scrape's instance.
std::string RenderLinkMetrics(const LinkReadings& readings);

// Reads the links at each sample, judges their state at once and their counters once a window,
// and serves the latest readings and findings. Thread-safe.
class LinkMonitor {
 public:
  struct Options {
    const Clock& clock;  // when a counter window ends
    std::string sysfs_root = "/sys";
    LinkHealthOptions health;
  };
  explicit LinkMonitor(Options options);

  // Reads and judges the links. On a read error the previous readings and findings stay and the
  // error is returned (and counted in gpufleet_agent_link_sample_errors_total).
  Status SampleOnce();

  // The findings of the latest sample; empty before the first.
  std::vector<LinkFinding> Findings() const;

  // node_exporter's link metrics, then gpufleet_node_link_health (0 healthy, 1 degraded) and the
  // sample errors; empty before the first good sample, apart from the error counter.
  std::string RenderMetrics() const;

 private:
  const Options options_;
  mutable std::mutex mu_;
  std::optional<LinkReadings> latest_;         // guarded by mu_
  std::optional<LinkReadings> window_start_;   // guarded by mu_
  MonoTime window_started_at_;                 // guarded by mu_
  std::vector<LinkFinding> counter_findings_;  // guarded by mu_, of the last whole window
  std::vector<LinkFinding> findings_;          // guarded by mu_
  int64_t sample_errors_ = 0;                  // guarded by mu_
};

}  // namespace gpufleet::agent
