// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/coldstart_sim.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <ostream>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <nlohmann/json.hpp>

#include "gpufleet/core/random.h"
#include "gpufleet/sim/html_page.h"

namespace gpufleet::sim {
namespace {

constexpr double kGigabyte = 1e9;

// Gang sizes when none is fixed, and how often each is drawn: most gangs are small.
constexpr int kGangSizes[] = {1, 2, 4, 8, 16, 32, 64, 128};
constexpr double kGangSizeWeights[] = {30, 20, 15, 12, 9, 7, 4, 3};

// The share of an image in each layer, largest first (sums to 1).
constexpr double kLayerShares[] = {0.30, 0.22, 0.15, 0.12,  0.08,  0.05, 0.03,
                                   0.02, 0.01, 0.01, 0.005, 0.003, 0.002};

template <typename Weights>
size_t DrawWeighted(Random& random, const Weights& weights) {
  double total = 0;
  for (const double weight : weights) {
    total += weight;
  }
  double draw = random.UniformDouble() * total;
  size_t i = 0;
  for (const double weight : weights) {
    if (draw < weight) {
      return i;
    }
    draw -= weight;
    ++i;
  }
  return i - 1;
}

// What a gang asks for.
struct GangRequest {
  int nodes = 0;
  size_t image = 0;
};

// A node's layer cache: the layers it holds (image, layer) with their last use, LRU-evicted.
struct NodeCache {
  std::map<std::pair<size_t, size_t>, int64_t> last_use;
  int64_t bytes = 0;
};

class Fleet {
 public:
  Fleet(const ColdStartOptions& options, const std::vector<ColdStartImage>& images)
      : options_(options), images_(images), caches_(static_cast<size_t>(options.fleet_nodes)) {}

  bool Holds(int node, size_t image, size_t layer) const {
    return caches_[static_cast<size_t>(node)].last_use.contains({image, layer});
  }

  int64_t CachedBytes(int node, size_t image) const {
    int64_t bytes = 0;
    for (size_t layer = 0; layer < images_[image].layer_bytes.size(); ++layer) {
      bytes += Holds(node, image, layer) ? images_[image].layer_bytes[layer] : 0;
    }
    return bytes;
  }

  // After a pull: the node holds the whole image, used at `now`; older layers of other images go
  // until the cache fits (the image itself is never evicted for itself).
  void Store(int node, size_t image, int64_t now) {
    NodeCache& cache = caches_[static_cast<size_t>(node)];
    for (size_t layer = 0; layer < images_[image].layer_bytes.size(); ++layer) {
      const auto [it, added] = cache.last_use.insert_or_assign({image, layer}, now);
      if (added) {
        cache.bytes += images_[image].layer_bytes[layer];
      }
    }
    while (cache.bytes > options_.cache_bytes) {
      auto oldest = cache.last_use.end();
      for (auto it = cache.last_use.begin(); it != cache.last_use.end(); ++it) {
        if (it->first.first != image &&
            (oldest == cache.last_use.end() || it->second < oldest->second)) {
          oldest = it;
        }
      }
      if (oldest == cache.last_use.end()) {
        break;
      }
      cache.bytes -= images_[oldest->first.first].layer_bytes[oldest->first.second];
      cache.last_use.erase(oldest);
    }
  }

 private:
  const ColdStartOptions& options_;
  const std::vector<ColdStartImage>& images_;
  std::vector<NodeCache> caches_;
};

// One gang's pull, slot by slot (see the header).
class GangPull {
 public:
  GangPull(const ColdStartOptions& options, const ColdStartImage& image, size_t image_index,
           const Fleet& fleet, const std::vector<int>& gang, bool peer_to_peer)
      : options_(options), gang_(gang), peer_to_peer_(peer_to_peer) {
    for (size_t layer = 0; layer < image.layer_bytes.size(); ++layer) {
      for (int64_t offset = 0; offset < image.layer_bytes[layer]; offset += options.chunk_bytes) {
        chunks_.push_back(
            {layer, std::min(options.chunk_bytes, image.layer_bytes[layer] - offset)});
      }
    }
    holders_.resize(chunks_.size());
    // With peer-to-peer every node of the fleet that holds a layer serves it; registry pulls
    // never look for holders.
    for (int node = 0; peer_to_peer && node < options.fleet_nodes; ++node) {
      for (size_t chunk = 0; chunk < chunks_.size(); ++chunk) {
        if (fleet.Holds(node, image_index, chunks_[chunk].layer)) {
          holders_[chunk].push_back(node);
        }
      }
    }
    has_.assign(gang.size(), std::vector<char>(chunks_.size(), 0));
    missing_.assign(gang.size(), 0);
    for (size_t member = 0; member < gang.size(); ++member) {
      for (size_t chunk = 0; chunk < chunks_.size(); ++chunk) {
        has_[member][chunk] = fleet.Holds(gang[member], image_index, chunks_[chunk].layer);
        missing_[member] += has_[member][chunk] ? 0 : 1;
      }
    }
  }

  // Runs until every member holds the image; each member's ready time in seconds (0 for one
  // that held it already), and the registry's bytes.
  std::vector<double> Run() {
    const double slot_seconds =
        static_cast<double>(options_.chunk_bytes) * 8 / (options_.node_gbps * kGigabyte);
    const double registry_per_slot =
        static_cast<double>(options_.chunk_bytes) * options_.registry_gbps / options_.node_gbps;
    std::vector<int64_t> ready_slot(gang_.size(), 0);
    std::vector<int64_t> uploaded_in(static_cast<size_t>(options_.fleet_nodes), -1);
    double credit = 0;
    int64_t slot = 0;
    size_t needy = static_cast<size_t>(
        std::count_if(missing_.begin(), missing_.end(), [](int64_t m) { return m > 0; }));
    while (needy > 0) {
      credit += registry_per_slot;
      std::vector<std::pair<size_t, size_t>> received;  // (member, chunk), usable next slot
      std::vector<char> from_registry(chunks_.size(), 0);
      int64_t smallest_wanted = -1;  // from the registry, for lack of credit
      for (size_t turn = 0; turn < gang_.size(); ++turn) {
        const size_t member = (turn + static_cast<size_t>(slot)) % gang_.size();
        if (missing_[member] == 0) {
          continue;
        }
        if (peer_to_peer_) {
          if (const std::optional<size_t> chunk = FromPeer(member, slot, uploaded_in)) {
            received.emplace_back(member, *chunk);
            continue;
          }
        }
        const std::optional<size_t> chunk = RegistryChunk(member, from_registry);
        if (!chunk.has_value()) {
          continue;
        }
        const double bytes = static_cast<double>(chunks_[*chunk].bytes);
        if (credit >= bytes) {
          credit -= bytes;
          registry_bytes_ += chunks_[*chunk].bytes;
          from_registry[*chunk] = 1;
          received.emplace_back(member, *chunk);
        } else if (smallest_wanted < 0 || chunks_[*chunk].bytes < smallest_wanted) {
          smallest_wanted = chunks_[*chunk].bytes;
        }
      }
      ++slot;
      for (const auto& [member, chunk] : received) {
        if (has_[member][chunk]) {
          continue;
        }
        has_[member][chunk] = 1;
        holders_[chunk].push_back(gang_[member]);
        if (--missing_[member] == 0) {
          ready_slot[member] = slot;
          --needy;
        }
      }
      if (received.empty() && smallest_wanted > 0) {
        // Nothing moved: skip the slots in which the registry's credit still falls short.
        const double short_by = static_cast<double>(smallest_wanted) - credit;
        const auto idle = static_cast<int64_t>(std::ceil(short_by / registry_per_slot)) - 1;
        if (idle > 0) {
          slot += idle;
          credit += static_cast<double>(idle) * registry_per_slot;
        }
      }
    }
    std::vector<double> ready(gang_.size());
    for (size_t member = 0; member < gang_.size(); ++member) {
      ready[member] = static_cast<double>(ready_slot[member]) * slot_seconds;
    }
    return ready;
  }

  int64_t registry_bytes() const { return registry_bytes_; }

 private:
  struct Chunk {
    size_t layer = 0;
    int64_t bytes = 0;
  };

  // The member's rarest missing chunk that a node which has not uploaded in this slot holds;
  // that node uploads it.
  std::optional<size_t> FromPeer(size_t member, int64_t slot, std::vector<int64_t>& uploaded_in) {
    const size_t count = chunks_.size();
    // Among equally rare chunks members start at different places, so that they spread out.
    const size_t offset = member * 7919 % std::max<size_t>(count, 1);
    std::vector<char> saturated(count, 0);  // no holder left to upload it in this slot
    for (;;) {
      std::optional<size_t> best;
      for (size_t i = 0; i < count; ++i) {
        const size_t chunk = (i + offset) % count;
        if (!has_[member][chunk] && !holders_[chunk].empty() && !saturated[chunk] &&
            (!best.has_value() || holders_[chunk].size() < holders_[*best].size())) {
          best = chunk;
        }
      }
      if (!best.has_value()) {
        return std::nullopt;
      }
      const std::vector<int>& holders = holders_[*best];
      for (size_t i = 0; i < holders.size(); ++i) {
        const int peer = holders[(i + static_cast<size_t>(slot)) % holders.size()];
        if (peer != gang_[member] && uploaded_in[static_cast<size_t>(peer)] != slot) {
          uploaded_in[static_cast<size_t>(peer)] = slot;
          return best;
        }
      }
      saturated[*best] = 1;
    }
  }

  // The chunk the member asks the registry for: registry-only, its first missing chunk;
  // peer-to-peer, its first missing chunk that no node holds and no one fetches in this slot.
  std::optional<size_t> RegistryChunk(size_t member, const std::vector<char>& from_registry) {
    for (size_t chunk = 0; chunk < chunks_.size(); ++chunk) {
      if (has_[member][chunk]) {
        continue;
      }
      if (!peer_to_peer_ || (holders_[chunk].empty() && !from_registry[chunk])) {
        return chunk;
      }
    }
    return std::nullopt;
  }

  const ColdStartOptions& options_;
  const std::vector<int>& gang_;
  const bool peer_to_peer_;
  std::vector<Chunk> chunks_;
  std::vector<std::vector<int>> holders_;  // fleet nodes holding each chunk
  std::vector<std::vector<char>> has_;     // per member, per chunk
  std::vector<int64_t> missing_;           // per member
  int64_t registry_bytes_ = 0;
};

bool UsesLocality(ColdStartStrategy strategy) {
  return strategy == ColdStartStrategy::kRegistryLocality ||
         strategy == ColdStartStrategy::kPeerToPeerLocality;
}

bool UsesPeers(ColdStartStrategy strategy) {
  return strategy == ColdStartStrategy::kPeerToPeer ||
         strategy == ColdStartStrategy::kPeerToPeerLocality;
}

ColdStartStrategyResult RunStrategy(const ColdStartOptions& options,
                                    const std::vector<ColdStartImage>& images,
                                    const std::vector<GangRequest>& requests,
                                    ColdStartStrategy strategy) {
  ColdStartStrategyResult result;
  result.strategy = strategy;
  Fleet fleet(options, images);
  // Placement's own draws: the same for every strategy.
  Random random(options.seed ^ 0x9e3779b97f4a7c15ULL);
  std::vector<double> starts;
  for (size_t g = 0; g < requests.size(); ++g) {
    const GangRequest& request = requests[g];
    std::vector<int> nodes(static_cast<size_t>(options.fleet_nodes));
    std::iota(nodes.begin(), nodes.end(), 0);
    random.Shuffle(nodes);
    if (UsesLocality(strategy)) {
      std::vector<int64_t> cached(nodes.size());
      for (const int node : nodes) {
        cached[static_cast<size_t>(node)] = fleet.CachedBytes(node, request.image);
      }
      std::stable_sort(nodes.begin(), nodes.end(), [&](int a, int b) {
        return cached[static_cast<size_t>(a)] > cached[static_cast<size_t>(b)];
      });
    }
    nodes.resize(static_cast<size_t>(request.nodes));
    const ColdStartImage& image = images[request.image];
    GangPull pull(options, image, request.image, fleet, nodes, UsesPeers(strategy));
    ColdStartGang gang;
    gang.nodes = request.nodes;
    gang.image = image.name;
    for (const int node : nodes) {
      gang.nodes_already_holding += fleet.CachedBytes(node, request.image) == image.Bytes();
    }
    std::vector<double> ready = pull.Run();
    if (options.unpack_gbytes_per_second > 0) {
      const double unpack =
          static_cast<double>(image.Bytes()) / (options.unpack_gbytes_per_second * kGigabyte);
      for (size_t member = 0; member < nodes.size(); ++member) {
        if (fleet.CachedBytes(nodes[member], request.image) != image.Bytes()) {
          ready[member] += unpack;
        }
      }
    }
    gang.start_seconds = *std::max_element(ready.begin(), ready.end());
    gang.registry_bytes = pull.registry_bytes();
    for (const int node : nodes) {
      fleet.Store(node, request.image, static_cast<int64_t>(g));
    }
    result.registry_bytes += gang.registry_bytes;
    result.image_bytes_needed += image.Bytes();
    starts.push_back(gang.start_seconds);
    result.gangs.push_back(std::move(gang));
  }
  result.start_seconds = Summarize(std::move(starts));
  return result;
}

}  // namespace

std::string_view ColdStartStrategyName(ColdStartStrategy strategy) {
  switch (strategy) {
    case ColdStartStrategy::kRegistry:
      return "registry";
    case ColdStartStrategy::kRegistryLocality:
      return "registry+locality";
    case ColdStartStrategy::kPeerToPeer:
      return "p2p";
    case ColdStartStrategy::kPeerToPeerLocality:
      return "p2p+locality";
  }
  return "unknown";
}

int64_t ColdStartImage::Bytes() const {
  return std::accumulate(layer_bytes.begin(), layer_bytes.end(), int64_t{0});
}

ColdStartImage LayeredImage(std::string name, int64_t bytes, double weight) {
  ColdStartImage image{std::move(name), {}, weight};
  int64_t left = bytes;
  for (const double share : kLayerShares) {
    const int64_t layer = std::min<int64_t>(left, std::llround(share * static_cast<double>(bytes)));
    if (layer > 0) {
      image.layer_bytes.push_back(layer);
      left -= layer;
    }
  }
  if (left > 0) {
    image.layer_bytes.push_back(left);
  }
  return image;
}

std::vector<ColdStartImage> DefaultImageMix() {
  const auto gb = [](double value) { return std::llround(value * kGigabyte); };
  return {LayeredImage("nvcr.io/nvidia/pytorch", gb(20), 0.35),
          LayeredImage("nvcr.io/nvidia/nemo", gb(30), 0.15),
          LayeredImage("nvcr.io/nvidia/tensorflow", gb(15), 0.10),
          LayeredImage("vllm/vllm-openai", gb(10), 0.25),
          LayeredImage("team/custom-trainer", gb(5), 0.15)};
}

Status ValidateColdStartOptions(const ColdStartOptions& options) {
  if (options.fleet_nodes < 1 || options.fleet_nodes > 100000) {
    return InvalidArgumentError(
        fmt::format("fleet_nodes: {} (valid: 1 to 100000)", options.fleet_nodes));
  }
  if (options.gangs < 1 || options.gangs > 100000) {
    return InvalidArgumentError(fmt::format("gangs: {} (valid: 1 to 100000)", options.gangs));
  }
  if (options.gang_nodes < 0 || options.gang_nodes > options.fleet_nodes) {
    return InvalidArgumentError(
        fmt::format("gang_nodes: {} (valid: 0 to the {} nodes of the fleet)", options.gang_nodes,
                    options.fleet_nodes));
  }
  if (!(options.registry_gbps > 0) || !(options.node_gbps > 0)) {
    return InvalidArgumentError(fmt::format("registry_gbps {} and node_gbps {} must be positive",
                                            options.registry_gbps, options.node_gbps));
  }
  if (options.chunk_bytes < (int64_t{1} << 20)) {
    return InvalidArgumentError(
        fmt::format("chunk_bytes: {} (valid: at least 1 MiB)", options.chunk_bytes));
  }
  if (options.unpack_gbytes_per_second < 0) {
    return InvalidArgumentError(fmt::format("unpack_gbytes_per_second: {} (valid: 0 or more)",
                                            options.unpack_gbytes_per_second));
  }
  for (const ColdStartImage& image : options.images) {
    if (image.layer_bytes.empty() || image.Bytes() <= 0 || !(image.weight > 0)) {
      return InvalidArgumentError(
          fmt::format("image {}: needs layers of positive size and a positive weight", image.name));
    }
    if (image.Bytes() > options.cache_bytes) {
      return InvalidArgumentError(
          fmt::format("image {}: {} bytes, more than cache_bytes {}: no node could hold it",
                      image.name, image.Bytes(), options.cache_bytes));
    }
  }
  return Status::Ok();
}

Result<ColdStartResult> RunColdStartSim(ColdStartOptions options) {
  if (options.images.empty()) {
    options.images = DefaultImageMix();
  }
  GPUFLEET_RETURN_IF_ERROR(ValidateColdStartOptions(options));
  Random random(options.seed);
  std::vector<double> image_weights;
  for (const ColdStartImage& image : options.images) {
    image_weights.push_back(image.weight);
  }
  std::vector<GangRequest> requests;
  for (int g = 0; g < options.gangs; ++g) {
    GangRequest request;
    request.nodes = options.gang_nodes;
    if (request.nodes == 0) {
      request.nodes =
          std::min(kGangSizes[DrawWeighted(random, kGangSizeWeights)], options.fleet_nodes);
    }
    request.image = DrawWeighted(random, image_weights);
    requests.push_back(request);
  }
  ColdStartResult result;
  result.options = options;
  for (const ColdStartStrategy strategy : kColdStartStrategies) {
    result.strategies.push_back(RunStrategy(options, options.images, requests, strategy));
  }
  return result;
}

namespace {

// The run's setting in one sentence, for the summary and the report.
std::string Setting(const ColdStartOptions& o) {
  return fmt::format(
      "{} gang{} ({}) on {} nodes; registry {} Gb/s, node links {} Gb/s, {} MiB chunks, {:.0f} GB "
      "cache per node{}; seed {}",
      o.gangs, o.gangs == 1 ? "" : "s",
      o.gang_nodes == 0 ? "1 to 128 nodes" : fmt::format("{} nodes", o.gang_nodes), o.fleet_nodes,
      o.registry_gbps, o.node_gbps, o.chunk_bytes >> 20,
      static_cast<double>(o.cache_bytes) / kGigabyte,
      o.unpack_gbytes_per_second > 0
          ? fmt::format(", unpacking at {} GB/s", o.unpack_gbytes_per_second)
          : "",
      o.seed);
}

// Registry bytes over one copy of the image per gang.
double RegistryCopies(const ColdStartStrategyResult& s) {
  return s.image_bytes_needed > 0
             ? static_cast<double>(s.registry_bytes) / static_cast<double>(s.image_bytes_needed)
             : 0.0;
}

constexpr std::string_view kColumnsNote =
    "start: from placement until the gang's last node holds the image; x image: registry bytes "
    "over one copy of the image per gang";

}  // namespace

void PrintColdStartSummary(const ColdStartResult& result, std::ostream& out) {
  fmt::print(out, "coldstart: {}\n", Setting(result.options));
  fmt::print(out, "{:<18} {:>10} {:>10} {:>10} {:>10} {:>13} {:>9}\n", "strategy", "start p50",
             "p90", "p99", "mean", "registry GB", "x image");
  for (const ColdStartStrategyResult& s : result.strategies) {
    fmt::print(out, "{:<18} {:>9.1f}s {:>9.1f}s {:>9.1f}s {:>9.1f}s {:>13.1f} {:>9.2f}\n",
               ColdStartStrategyName(s.strategy), s.start_seconds.p50, s.start_seconds.p90,
               s.start_seconds.p99, s.start_seconds.mean,
               static_cast<double>(s.registry_bytes) / kGigabyte, RegistryCopies(s));
  }
  fmt::print(out, "({})\n", kColumnsNote);
}

Status WriteColdStartReport(const ColdStartResult& result, std::ostream& out) {
  std::string body =
      "<p class=\"note\">" + XmlEscape(Setting(result.options)) + ".</p>\n<h2>Summary</h2>\n";
  body +=
      "<table>\n<tr><th>strategy</th><th>start p50 (s)</th><th>p90</th><th>p99</th><th>mean</th>"
      "<th>registry GB</th><th>x image</th></tr>\n";
  for (const ColdStartStrategyResult& s : result.strategies) {
    fmt::format_to(std::back_inserter(body),
                   "<tr><td>{}</td><td class=\"num\">{:.1f}</td><td class=\"num\">{:.1f}</td>"
                   "<td class=\"num\">{:.1f}</td><td class=\"num\">{:.1f}</td>"
                   "<td class=\"num\">{:.1f}</td><td class=\"num\">{:.2f}</td></tr>\n",
                   XmlEscape(ColdStartStrategyName(s.strategy)), s.start_seconds.p50,
                   s.start_seconds.p90, s.start_seconds.p99, s.start_seconds.mean,
                   static_cast<double>(s.registry_bytes) / kGigabyte, RegistryCopies(s));
  }
  body += "</table>\n<p class=\"note\">" + XmlEscape(kColumnsNote) + ".</p>\n";

  ChartSpec start{.title = "Gang start time (CDF over gangs)",
                  .x_label = "seconds from placement until the last node holds the image",
                  .y_label = "share of gangs",
                  .step = true};
  ChartSpec served{.title = "Bytes the registry served, gang after gang",
                   .x_label = "gangs placed",
                   .y_label = "registry GB (cumulative)"};
  for (const ColdStartStrategyResult& s : result.strategies) {
    const std::string name(ColdStartStrategyName(s.strategy));
    std::vector<double> seconds;
    Series cumulative{.name = name, .x = {0}, .y = {0}};
    double total = 0;
    for (const ColdStartGang& gang : s.gangs) {
      seconds.push_back(gang.start_seconds);
      total += static_cast<double>(gang.registry_bytes) / kGigabyte;
      cumulative.x.push_back(static_cast<double>(cumulative.x.size()));
      cumulative.y.push_back(total);
    }
    start.series.push_back(CdfSeries(name, std::move(seconds)));
    served.series.push_back(std::move(cumulative));
  }
  body += "<h2>Start time</h2>\n" + FigureHtml(start);
  body += "<h2>Registry egress</h2>\n" + FigureHtml(served);
  return WriteHtmlPage("gpufleet sim coldstart", body, out);
}

void WriteColdStartJson(const ColdStartResult& result, std::ostream& out) {
  const ColdStartOptions& o = result.options;
  nlohmann::json json;
  json["options"] = {{"seed", o.seed},
                     {"fleet_nodes", o.fleet_nodes},
                     {"gangs", o.gangs},
                     {"gang_nodes", o.gang_nodes},
                     {"registry_gbps", o.registry_gbps},
                     {"node_gbps", o.node_gbps},
                     {"chunk_bytes", o.chunk_bytes},
                     {"cache_bytes", o.cache_bytes},
                     {"unpack_gbytes_per_second", o.unpack_gbytes_per_second}};
  for (const ColdStartImage& image : o.images) {
    json["options"]["images"].push_back(
        {{"name", image.name}, {"bytes", image.Bytes()}, {"weight", image.weight}});
  }
  for (const ColdStartStrategyResult& s : result.strategies) {
    nlohmann::json strategy = {{"strategy", ColdStartStrategyName(s.strategy)},
                               {"start_seconds",
                                {{"mean", s.start_seconds.mean},
                                 {"p50", s.start_seconds.p50},
                                 {"p90", s.start_seconds.p90},
                                 {"p99", s.start_seconds.p99}}},
                               {"registry_bytes", s.registry_bytes},
                               {"image_bytes_needed", s.image_bytes_needed}};
    for (const ColdStartGang& gang : s.gangs) {
      strategy["gangs"].push_back({{"nodes", gang.nodes},
                                   {"image", gang.image},
                                   {"start_seconds", gang.start_seconds},
                                   {"registry_bytes", gang.registry_bytes},
                                   {"nodes_already_holding", gang.nodes_already_holding}});
    }
    json["strategies"].push_back(std::move(strategy));
  }
  out << json.dump(2) << "\n";
}

}  // namespace gpufleet::sim
