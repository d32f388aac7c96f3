// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"

// A network fabric: GPU nodes with NICs, switches in tiers (leaf, spine, core, ...), cables
// between them, and NVLink domains. `FabricSpec` is the description as written (YAML, a
// generator, a Slurm topology.conf), with name ranges; `Fabric` is the validated, expanded graph
// that the analysis, the ECMP simulation, the collective cost model and the scheduler read.
namespace gpufleet::fabric {

// Where an element of a spec came from, for error messages: "fabric.yaml:12: links[3].to: ...".
struct SourceRef {
  int line = 0;      // 1-based; 0 when generated
  std::string path;  // "links[3]"
};

// Nodes that share a shape. `names` is a hostlist ("dgx[001-127]").
struct NodeGroupSpec {
  std::string names;
  int gpus = 8;
  std::string gpu_model = "H100-80GB";
  int nics = 8;                     // NIC ports; NIC i serves rail i
  int64_t nic_speed_mbps = 400000;  // per NIC port
  // NVLink bandwidth per GPU and direction inside the node (H100 SXM: 450 GB/s).
  int64_t nvlink_mbps = 3600000;
  int64_t cpu_milli = 224000;
  int64_t memory_mib = 2048 * 1024;
  SourceRef source;
};

struct SwitchGroupSpec {
  std::string names;
  std::string tier;
  int ports = 64;
  int64_t port_speed_mbps = 400000;
  // Switches with the same group name form one domain for the scheduler (e.g. the rail leaves of
  // one scalable unit, "su1"); without one, a domain is named after its switches.
  std::string group;
  // Slurm's LinkSpeed, kept as written so that an imported topology.conf exports unchanged.
  std::string slurm_link_speed;
  SourceRef source;
};

//   mesh   every `from` to every `to`: node NICs listed in `nics` (all when empty), each to every
//          switch of `to`; switches, each pair `count` cables
//   rails  node NIC i to the i-th switch of `to` (rail-optimized); `to` lists one per NIC
//   zip    the i-th of `from` to the i-th of `to`
enum class LinkPattern { kMesh, kRails, kZip };
const char* LinkPatternName(LinkPattern pattern);

struct LinkSpec {
  std::string from;  // hostlist of nodes or switches
  std::string to;    // hostlist of switches
  LinkPattern pattern = LinkPattern::kMesh;
  std::vector<int> nics;   // node links only; empty: every NIC
  int count = 1;           // parallel cables per pair (switch links; one per NIC for nodes)
  int64_t speed_mbps = 0;  // 0: the NIC speed, or the lower switch's port speed
  SourceRef source;
};

// GPUs of several nodes joined by NVLink switches (GB200 NVL72: 18 trays, 72 GPUs).
struct NvlinkDomainSpec {
  std::string name;
  std::string nodes;                 // hostlist
  int64_t bandwidth_mbps = 7200000;  // per GPU and direction (GB200: 900 GB/s)
  SourceRef source;
};

struct FabricSpec {
  std::string name;
  std::string source_file;         // for messages; "" when generated
  std::vector<std::string> tiers;  // lowest (leaf) first
  std::vector<NodeGroupSpec> nodes;
  std::vector<SwitchGroupSpec> switches;
  std::vector<LinkSpec> links;
  std::vector<NvlinkDomainSpec> nvlink_domains;
  std::vector<int> slurm_block_sizes;  // from an imported block topology, kept for export
};

// "file:line: path" (or the parts that are known) for messages about `source`.
std::string Locate(const FabricSpec& spec, const SourceRef& source);

struct FabricNode {
  std::string name;
  int gpus = 0;
  std::string gpu_model;
  int nics = 0;
  int64_t nic_speed_mbps = 0;
  int64_t nvlink_mbps = 0;  // per GPU and direction within its NVLink domain
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int nvlink_domain = -1;       // index into nvlink_domains(); -1: the node alone
  std::vector<int> nic_switch;  // switch each NIC is cabled to; -1: not cabled
  std::vector<int> nic_link;    // link of each NIC; -1: not cabled
};

struct FabricSwitch {
  std::string name;
  int tier = 0;
  int ports = 0;
  int64_t port_speed_mbps = 0;
  std::string group;
  std::string slurm_link_speed;
  int used_ports = 0;
  int64_t down_mbps = 0;        // toward nodes and lower tiers
  int64_t up_mbps = 0;          // toward higher tiers
  std::vector<int> down_links;  // links whose upper end is this switch
  std::vector<int> up_links;    // links whose lower end is this switch
};

// `count` parallel cables between a lower end (a node's NIC, or a switch) and a switch of a
// higher tier.
struct FabricLink {
  int node = -1;  // >= 0: the lower end is this node's NIC `nic`
  int nic = -1;
  int lower_switch = -1;  // >= 0: the lower end is this switch
  int upper_switch = 0;
  int count = 1;
  int64_t speed_mbps = 0;  // per cable

  bool from_node() const { return node >= 0; }
};

struct NvlinkDomain {
  std::string name;
  std::vector<int> nodes;
  int64_t bandwidth_mbps = 0;
};

// The expanded, validated fabric. Immutable after Build; thread-compatible (concurrent reads are
// safe).
class Fabric {
 public:
  // Expands the name ranges and checks the description: unique names, known tiers, positive
  // speeds and counts, links that name existing nodes and switches, a link's ends in different
  // tiers (a link inside a tier would make a loop), no switch using more ports than it has, no NIC
  // cabled twice, a node in at most one NVLink domain. kInvalidArgument naming the file, line,
  // element and value.
  static Result<Fabric> Build(FabricSpec spec);

  const FabricSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name; }
  const std::vector<std::string>& tiers() const { return spec_.tiers; }
  const std::vector<FabricNode>& nodes() const { return nodes_; }
  const std::vector<FabricSwitch>& switches() const { return switches_; }
  const std::vector<FabricLink>& links() const { return links_; }
  const std::vector<NvlinkDomain>& nvlink_domains() const { return nvlink_domains_; }

  // Index by name, or -1.
  int FindNode(std::string_view name) const;
  int FindSwitch(std::string_view name) const;

  int TotalGpus() const { return total_gpus_; }
  int TierCount() const { return static_cast<int>(spec_.tiers.size()); }

  // Domains: the nodes that reach each other through switches of tier `tier` and below, e.g. the
  // nodes under one leaf, or under the eight rail leaves of one scalable unit. Above the highest
  // tier a node reaches, its domain stays the one it has. A node with no cable is a domain of its
  // own at every tier.
  int DomainOf(int tier, int node) const { return domain_of_[tier][node]; }
  int DomainCount(int tier) const { return static_cast<int>(domain_names_[tier].size()); }
  const std::string& DomainName(int tier, int domain) const { return domain_names_[tier][domain]; }
  int DomainGpus(int tier, int domain) const { return domain_gpus_[tier][domain]; }

  // The lowest tier whose domain holds every node of `nodes`; -1 when they are one node (or one
  // NVLink domain spanning nodes); TierCount() when no tier joins them.
  int CommonTier(const std::vector<int>& nodes) const;

  // GPUs of the NVLink domain of `node` (the node's own GPUs when it has no shared domain).
  int NvlinkDomainGpus(int node) const;

  // Down- over up-facing bandwidth of all switches of `tier`, at least 1 (0 up: 1). The factor by
  // which traffic leaving a domain of that tier slows down when every node sends.
  double TierOversubscription(int tier) const { return tier_oversubscription_[tier]; }

 private:
  Fabric() = default;
  Status Expand();
  void ComputeDomains();

  FabricSpec spec_;
  std::vector<FabricNode> nodes_;
  std::vector<FabricSwitch> switches_;
  std::vector<FabricLink> links_;
  std::vector<NvlinkDomain> nvlink_domains_;
  std::map<std::string, int, std::less<>> node_index_;
  std::map<std::string, int, std::less<>> switch_index_;
  std::vector<std::vector<int>> domain_of_;             // [tier][node]
  std::vector<std::vector<std::string>> domain_names_;  // [tier][domain]
  std::vector<std::vector<int>> domain_gpus_;           // [tier][domain]
  std::vector<double> tier_oversubscription_;
  int total_gpus_ = 0;
};

// The cluster the scheduler sees: one Node per fabric node with GPUs, `Topology` levels named
// after the tiers, outermost first ({"core", "spine", "leaf"}), plus "nvlink-domain" innermost
// when an NVLink domain spans nodes; each node's `topology` holds its domain per level, and its
// "rack" fault domain is its NVLink domain or leaf domain. kInvalidArgument naming the node for a
// GPU model the catalog does not know.
Result<Cluster> BuildCluster(const Fabric& fabric, const GpuCatalog& catalog);

}  // namespace gpufleet::fabric
