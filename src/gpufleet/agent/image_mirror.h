// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"

namespace gpufleet::agent {

// The request header a mirror sets when it asks a peer for a blob: the peer answers from its
// cache or from the registry, never from another peer, so a request never goes round the peers.
inline constexpr char kPeerHeader[] = "X-Gpufleet-Peer";

struct ImageMirrorOptions {
  // Where the mirror listens. Peers must reach it: on a real fleet the node's address (or
  // 0.0.0.0); the node's own podman reaches it on loopback either way.
  std::string host = "127.0.0.1";
  int port = 0;  // 0 picks a free port
  // HOST:PORT this mirror's peers reach it at, spelt as it is in every peer's `peers`; empty:
  // host:port. It takes part in the choice of which mirror fetches a blob from the registry.
  std::string self;
  // HOST:PORT of the peer mirrors (the node's leaf, its gang's nodes); may name `self`.
  std::vector<std::string> peers;
  // The registries mirrored ("HOST" or "HOST:PORT", e.g. "nvcr.io", "127.0.0.1:15000"); the
  // mirror fetches from no other. Required: at least one.
  std::vector<std::string> registries;
  // The registries of `registries` reached over plain HTTP (a registry on loopback); the others
  // over HTTPS.
  std::vector<std::string> insecure_registries;
  // Where blobs are kept (created if missing; its parent must exist). Required.
  std::string cache_dir;
  // The most bytes of blobs kept; the least recently served are removed first. A blob larger
  // than this is not mirrored (the mirror answers 404 and podman pulls it from the registry).
  int64_t cache_bytes = int64_t{64} << 30;
  // Connections held at once, and from one address: one more is answered 503 and closed at
  // once, never queued, and podman goes to the registry. Per address, so that no other host can
  // take the node's own podman's place; a connection costs a socket, not a thread.
  int max_connections = 512;
  int max_connections_per_client = 128;
  // Requests handled at once (worker threads: a blob fetch holds one until it is cached); the
  // others wait for a worker.
  int handler_threads = 32;
  // A client must send each request's whole header within this of connecting (or of the
  // previous answer), whether it sends nothing or one byte at a time: then it is cut off.
  std::chrono::milliseconds header_timeout{10'000};
  // Connecting to a peer: a dead peer costs this much before the mirror goes to the registry.
  std::chrono::milliseconds peer_connect_timeout{1'000};
  // Reading from a peer or the registry: a peer that stops sending is given up after this.
  std::chrono::milliseconds read_timeout{60'000};
};

// What a mirror has done since it started.
struct ImageMirrorStats {
  int64_t blob_requests = 0;      // blob GETs and HEADs answered 200
  int64_t cache_hits = 0;         // of those, answered from the cache at once
  int64_t registry_bytes = 0;     // blob bytes fetched from the registries
  int64_t peer_bytes = 0;         // blob bytes fetched from peers
  int64_t peer_failures = 0;      // peer fetches that failed (the registry served instead)
  int64_t digest_mismatches = 0;  // fetched bytes whose sha256 was not the digest (dropped)
  int64_t evictions = 0;          // blobs removed to stay within cache_bytes
  int64_t cached_bytes = 0;       // bytes in the cache now
};

// A read-only, pull-through OCI distribution endpoint for the node's podman and its peers (the
// way Spegel serves a node's containerd store): the agent writes a registries.conf (see
// RegistriesConf) that makes podman try this mirror before each mirrored registry, and podman
// goes to the registry itself when the mirror fails.
//
// Routes, all GET or HEAD, under `/v2/<key>/` where <key> names the registry (RegistryKey):
// - `GET /v2/`: 200, the API is there.
// - `/v2/<key>/<name>/manifests/<tag or digest>`: always from the registry (a tag is resolved
//   there and never taken from a peer), with podman's Accept header; the answer carries the
//   sha256 of the bytes as Docker-Content-Digest, and a manifest asked for by digest must have
//   that digest. At most 4 MiB. Peers are refused manifests (404): they fetch their own.
// - `/v2/<key>/<name>/blobs/<sha256 digest>`: from the cache, else (single flight: concurrent
//   requests for one digest fetch it once) from the peer chosen for that digest by rendezvous
//   hashing over `peers` and `self` (every mirror with the same peer list chooses the same one),
//   else from the registry: the chosen peer fetches from the registry and the others from it,
//   so a group of N peers fetches each blob from the registry once. A blob is written to a
//   temporary file, its sha256 checked against the digest, and only then kept and served; a
//   peer that fails (dead, cut off mid-blob, wrong bytes) is left for the registry. A blob the
//   mirror cannot have (over the cache's size, the registry's error) is a 307 redirect to the
//   registry's own URL for it: podman fetches blobs from where it got the manifest, so it must be
//   sent on. A request carrying kPeerHeader is answered from the cache or the registry only,
//   and with an error instead of a redirect.
// Anything else is 404 (or 405 for other methods). Only sha256 digests are served.
//
// Slow or idle clients cost a socket each, not a worker: the server is gpufleet::http's (header
// deadline, connection caps; blobs streamed from their files a chunk at a time).
//
// Thread-safe.
class ImageMirror {
 public:
  // Creates the cache (keeping the blobs a previous mirror left there, checked against their
  // digests as they are served), listens and serves. Errors: kInvalidArgument naming a bad
  // option, kUnavailable when it cannot listen.
  static Result<std::unique_ptr<ImageMirror>> Start(ImageMirrorOptions options);
  // Stops serving and waits for the requests being handled.
  ~ImageMirror();
  ImageMirror(const ImageMirror&) = delete;
  ImageMirror& operator=(const ImageMirror&) = delete;

  int port() const;
  // HOST:PORT of this mirror, as its peers know it.
  const std::string& self() const;
  ImageMirrorStats stats() const;

  // A registries.conf (containers-registries.conf(5)) whose every mirrored registry has this
  // mirror, on loopback, as its first mirror: podman, given it as CONTAINERS_REGISTRIES_CONF,
  // pulls through the mirror and falls back to the registry. Short names are not resolved
  // (no unqualified-search-registries): tasks name their images fully.
  std::string RegistriesConf() const;

  // The path component that names `registry` under /v2/: lower case, ':' as '_'
  // ("127.0.0.1:15000" -> "127.0.0.1_15000").
  static std::string RegistryKey(std::string_view registry);
  // Which of `candidates` (mirrors' HOST:PORT) fetches the blob of sha256 `hex` from the
  // registry for the group: the highest rendezvous score, FNV-1a of "CANDIDATE/HEX", so every
  // mirror with the same candidates chooses the same one, and a candidate that leaves moves only
  // its own blobs. REQUIRES: `candidates` is not empty.
  static std::string ChooseFetcher(const std::vector<std::string>& candidates,
                                   std::string_view hex);

  struct Impl;

 private:
  explicit ImageMirror(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufleet::agent
