// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/image_reference.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace gpufleet {
namespace {

// The transports of containers/image (podman, skopeo) besides a registry's: "docker-archive:x.tar"
// is also a valid registry reference (the name "docker-archive", the tag "x.tar"), but podman
// reads it as a transport and opens a file on the node.
constexpr std::string_view kTransports[] = {
    "docker", "docker-archive", "docker-daemon",      "oci", "oci-archive",
    "dir",    "ostree",         "containers-storage", "sif", "tarball"};

constexpr size_t kMaxNameLength = 255;
constexpr size_t kMaxTagLength = 128;
constexpr size_t kSha256HexLength = 64;
constexpr size_t kMinDigestHexLength = 32;

bool IsLowerAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}
bool IsAlnum(char c) {
  return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z');
}
bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}
bool IsLowerHex(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f');
}

// [a-z0-9]+ runs joined by '.', '_', '__' or one or more '-'.
bool IsPathComponent(std::string_view s) {
  if (s.empty() || !IsLowerAlnum(s.front()) || !IsLowerAlnum(s.back())) {
    return false;
  }
  size_t i = 0;
  while (i < s.size()) {
    if (IsLowerAlnum(s[i])) {
      ++i;
      continue;
    }
    const size_t start = i;
    while (i < s.size() && !IsLowerAlnum(s[i])) {
      ++i;
    }
    const std::string_view separator = s.substr(start, i - start);
    const bool dashes =
        std::all_of(separator.begin(), separator.end(), [](char c) { return c == '-'; });
    if (separator != "." && separator != "_" && separator != "__" && !dashes) {
      return false;
    }
  }
  return true;
}

// A DNS name: [A-Za-z0-9] runs, '-' inside, components joined by '.'.
bool IsDomainName(std::string_view s) {
  while (true) {
    const size_t dot = s.find('.');
    const std::string_view label = s.substr(0, dot);
    if (label.empty() || !IsAlnum(label.front()) || !IsAlnum(label.back()) ||
        !std::all_of(label.begin(), label.end(), [](char c) { return IsAlnum(c) || c == '-'; })) {
      return false;
    }
    if (dot == std::string_view::npos) {
      return true;
    }
    s.remove_prefix(dot + 1);
  }
}

// host[:port]
bool IsDomain(std::string_view s) {
  const size_t colon = s.find(':');
  if (colon == std::string_view::npos) {
    return IsDomainName(s);
  }
  const std::string_view port = s.substr(colon + 1);
  return IsDomainName(s.substr(0, colon)) && !port.empty() && port.size() <= 5 &&
         std::all_of(port.begin(), port.end(), IsDigit);
}

bool IsTag(std::string_view s) {
  return !s.empty() && s.size() <= kMaxTagLength && (IsAlnum(s.front()) || s.front() == '_') &&
         std::all_of(s.begin(), s.end(),
                     [](char c) { return IsAlnum(c) || c == '_' || c == '.' || c == '-'; });
}

// algorithm:hex, e.g. "sha256:" and 64 lower-case hex digits.
Status CheckDigest(std::string_view s) {
  const size_t colon = s.find(':');
  if (colon == std::string_view::npos) {
    return InvalidArgumentError(fmt::format("digest \"{}\" has no ':' (expected sha256:HEX)", s));
  }
  const std::string_view algorithm = s.substr(0, colon);
  const std::string_view hex = s.substr(colon + 1);
  const bool algorithm_ok =
      !algorithm.empty() && IsLowerAlnum(algorithm.front()) && IsLowerAlnum(algorithm.back()) &&
      std::all_of(algorithm.begin(), algorithm.end(), [](char c) {
        return IsLowerAlnum(c) || c == '+' || c == '.' || c == '_' || c == '-';
      });
  if (!algorithm_ok) {
    return InvalidArgumentError(fmt::format("digest algorithm \"{}\" is not valid", algorithm));
  }
  if (!std::all_of(hex.begin(), hex.end(), IsLowerHex) ||
      (algorithm == "sha256" ? hex.size() != kSha256HexLength : hex.size() < kMinDigestHexLength)) {
    return InvalidArgumentError(
        fmt::format("digest \"{}\" is not valid (sha256 takes 64 lower-case hex digits)", s));
  }
  return Status::Ok();
}

}  // namespace

const char* ImagePullPolicyName(ImagePullPolicy policy) {
  switch (policy) {
    case ImagePullPolicy::kIfNotPresent:
      return "IfNotPresent";
    case ImagePullPolicy::kAlways:
      return "Always";
    case ImagePullPolicy::kNever:
      return "Never";
  }
  return "unknown";
}

std::optional<ImagePullPolicy> ImagePullPolicyFromName(std::string_view name) {
  for (const ImagePullPolicy policy :
       {ImagePullPolicy::kIfNotPresent, ImagePullPolicy::kAlways, ImagePullPolicy::kNever}) {
    if (name == ImagePullPolicyName(policy)) {
      return policy;
    }
  }
  return std::nullopt;
}

Status ValidateImageReference(std::string_view reference) {
  if (reference.empty()) {
    return InvalidArgumentError("an image reference cannot be empty");
  }
  if (reference.size() > kMaxImageReferenceLength) {
    return InvalidArgumentError(
        fmt::format("an image reference of {} characters is too long (at most {})",
                    reference.size(), kMaxImageReferenceLength));
  }
  for (const std::string_view transport : kTransports) {
    if (reference.size() > transport.size() && reference.starts_with(transport) &&
        reference[transport.size()] == ':') {
      return InvalidArgumentError(
          fmt::format("\"{}:\" is a transport, not a registry (give a registry reference such as "
                      "\"registry.example.com/team/image:tag\")",
                      transport));
    }
  }
  std::string_view rest = reference;
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    GPUFLEET_RETURN_IF_ERROR(CheckDigest(rest.substr(at + 1)));
    rest = rest.substr(0, at);
  }
  // A tag follows the last ':' after the last '/' (a ':' before it is a registry's port).
  const size_t last_slash = rest.rfind('/');
  const size_t tag_colon = rest.find(':', last_slash == std::string_view::npos ? 0 : last_slash);
  if (tag_colon != std::string_view::npos) {
    const std::string_view tag = rest.substr(tag_colon + 1);
    if (!IsTag(tag)) {
      return InvalidArgumentError(fmt::format(
          "tag \"{}\" is not valid (letters, digits, '_', '.' and '-', not starting with '.' or "
          "'-', at most {} characters)",
          tag, kMaxTagLength));
    }
    rest = rest.substr(0, tag_colon);
  }
  if (rest.size() > kMaxNameLength) {
    return InvalidArgumentError(
        fmt::format("the name is {} characters long (at most {})", rest.size(), kMaxNameLength));
  }
  std::string_view path = rest;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view first = rest.substr(0, slash);
    if (first.find_first_of(".:") != std::string_view::npos || first == "localhost") {
      if (!IsDomain(first)) {
        return InvalidArgumentError(
            fmt::format("registry \"{}\" is not a valid host name with an optional port", first));
      }
      path = rest.substr(slash + 1);
    }
  }
  while (true) {
    const size_t slash = path.find('/');
    const std::string_view component = path.substr(0, slash);
    if (!IsPathComponent(component)) {
      return InvalidArgumentError(fmt::format(
          "name component \"{}\" is not valid (lower-case letters and digits, separated by "
          "'.', '_', '__' or '-')",
          component));
    }
    if (slash == std::string_view::npos) {
      return Status::Ok();
    }
    path.remove_prefix(slash + 1);
  }
}

Status ValidateImageDigest(std::string_view digest) {
  if (digest.size() > kMaxImageDigestLength) {
    return InvalidArgumentError(fmt::format("a digest of {} characters is too long (at most {})",
                                            digest.size(), kMaxImageDigestLength));
  }
  return CheckDigest(digest);
}

std::string CanonicalImageReference(std::string_view reference) {
  std::string_view digest;
  std::string_view rest = reference;
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    digest = rest.substr(at);
    rest = rest.substr(0, at);
  }
  const size_t last_slash = rest.rfind('/');
  const size_t tag_colon = rest.find(':', last_slash == std::string_view::npos ? 0 : last_slash);
  std::string_view tag;
  if (tag_colon != std::string_view::npos) {
    tag = rest.substr(tag_colon);
    rest = rest.substr(0, tag_colon);
  }
  std::string out;
  const size_t slash = rest.find('/');
  const std::string_view first = rest.substr(0, slash);
  if (slash != std::string_view::npos &&
      (first.find_first_of(".:") != std::string_view::npos || first == "localhost")) {
    out = std::string(rest);
  } else {
    out = fmt::format("docker.io/{}{}", slash == std::string_view::npos ? "library/" : "", rest);
  }
  if (!tag.empty()) {
    out += tag;
  } else if (digest.empty()) {
    out += ":latest";
  }
  out += digest;
  return out;
}

std::string_view ImageReferenceDigest(std::string_view reference) {
  const size_t at = reference.find('@');
  return at == std::string_view::npos ? std::string_view() : reference.substr(at + 1);
}

}  // namespace gpufleet
