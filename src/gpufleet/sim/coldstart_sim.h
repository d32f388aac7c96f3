// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim coldstart`: how long a gang waits for its container image, and how many bytes the
// registry serves, when each node pulls from the registry, when nodes fetch layers from their
// peers (as Spegel, Dragonfly or Kraken do), and when placement prefers nodes that hold the image.
//
// The model (docs/containers.md, "Cold start in the simulator"). A fleet of identical nodes, each
// with a layer cache of bounded size (least recently used layers evicted). Gangs arrive one after
// another; each asks for a number of nodes and one image (drawn from an image mix, or fixed), and
// starts once every one of its nodes holds every layer of the image. Layers are cut into chunks;
// time advances in slots, a slot being the time one chunk takes over a node's link. In a slot a
// node downloads at most one chunk and uploads at most one, and the registry sends as many bytes
// as its egress bandwidth allows (credit carried over between slots). Registry-only: every chunk
// a node lacks comes from the registry, served to the needy nodes in turn. Peer-to-peer: a node
// takes its rarest missing chunk from any node of the fleet that holds it and has not uploaded in
// this slot; a chunk no node holds comes from the registry once. Gangs do not overlap in time, so
// a pull has the registry and the links to itself; a transfer of a chunk smaller than the chunk
// size still takes a whole slot (both make start times a little long, for every strategy alike).
// Unpacking the layers is modelled only when a rate is given: it adds the image's size over that
// rate to every node that fetched anything.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/sim/replay.h"

namespace gpufleet::sim {

// How layers reach a gang's nodes, and where the gang is placed.
enum class ColdStartStrategy {
  kRegistry,          // every node pulls from the registry; placement ignores images
  kRegistryLocality,  // registry pulls; placement prefers nodes holding the image
  kPeerToPeer,        // layers from peers when any holds them; placement ignores images
  kPeerToPeerLocality,
};
std::string_view ColdStartStrategyName(ColdStartStrategy strategy);
inline constexpr ColdStartStrategy kColdStartStrategies[] = {
    ColdStartStrategy::kRegistry, ColdStartStrategy::kRegistryLocality,
    ColdStartStrategy::kPeerToPeer, ColdStartStrategy::kPeerToPeerLocality};

// One image: its name and its layers' sizes in bytes.
struct ColdStartImage {
  std::string name;
  std::vector<int64_t> layer_bytes;
  double weight = 1;  // share of the gangs that use it
  int64_t Bytes() const;
};

// An image of `bytes` cut into layers the way framework images are: a few large layers (CUDA,
// cuDNN, the framework) and many small ones.
ColdStartImage LayeredImage(std::string name, int64_t bytes, double weight = 1);

// A mix modelled on NGC images (PyTorch about 20 GB, NeMo larger, inference images smaller): a
// few large layers (CUDA, cuDNN, the framework) and many small ones.
std::vector<ColdStartImage> DefaultImageMix();

struct ColdStartOptions {
  uint64_t seed = 1;
  int fleet_nodes = 512;
  int gangs = 50;
  // 0: drawn per gang from 1, 2, 4, ... 128 nodes, small gangs more likely.
  int gang_nodes = 0;
  // Empty: DefaultImageMix().
  std::vector<ColdStartImage> images;
  double registry_gbps = 25;  // registry egress, gigabits per second
  double node_gbps = 100;     // each node's link, each way
  int64_t chunk_bytes = int64_t{64} << 20;
  int64_t cache_bytes = int64_t{200} * 1000 * 1000 * 1000;  // per node
  double unpack_gbytes_per_second = 0;                      // 0: unpacking not modelled
};
// kInvalidArgument naming the field when an option is out of range.
Status ValidateColdStartOptions(const ColdStartOptions& options);

struct ColdStartGang {
  int nodes = 0;
  std::string image;
  double start_seconds = 0;    // from placement until its last node holds the image
  int64_t registry_bytes = 0;  // served by the registry for this gang
  int nodes_already_holding = 0;
};

struct ColdStartStrategyResult {
  ColdStartStrategy strategy = ColdStartStrategy::kRegistry;
  std::vector<ColdStartGang> gangs;
  Distribution start_seconds;
  int64_t registry_bytes = 0;
  int64_t image_bytes_needed = 0;  // of the gangs, the image's size once per gang
};

struct ColdStartResult {
  ColdStartOptions options;
  std::vector<ColdStartStrategyResult> strategies;  // in kColdStartStrategies order
};

// Runs every strategy on the same gangs (same seed, same draws). Same options, same result.
Result<ColdStartResult> RunColdStartSim(ColdStartOptions options);

void PrintColdStartSummary(const ColdStartResult& result, std::ostream& out);
void WriteColdStartJson(const ColdStartResult& result, std::ostream& out);
// A self-contained HTML report: the summary table, each strategy's CDF of gang start times and
// the registry's bytes served gang after gang. kUnavailable when `out` fails.
Status WriteColdStartReport(const ColdStartResult& result, std::ostream& out);

}  // namespace gpufleet::sim
