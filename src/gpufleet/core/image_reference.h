// SPDX-License-Identifier: Apache-2.0
// Container image references and pull policies, as job specs name them and the agent's container
// runner passes them to podman.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "gpufleet/core/status.h"

namespace gpufleet {

// How a node gets a task's image: pull it only when the node does not hold it (the default),
// pull it before every start, or never pull it (the node must hold it already).
enum class ImagePullPolicy { kIfNotPresent, kAlways, kNever };
// "IfNotPresent", "Always", "Never": the job spec's spelling.
const char* ImagePullPolicyName(ImagePullPolicy policy);
// The policy of that name; nullopt for any other text (names are case-sensitive).
std::optional<ImagePullPolicy> ImagePullPolicyFromName(std::string_view name);

// The longest reference accepted: a name of at most 255 characters (the distribution spec's
// bound), a tag of at most 128 and a digest.
inline constexpr size_t kMaxImageReferenceLength = 512;

// Checks an OCI image reference by the grammar of the distribution project's `reference`
// package: `[domain[:port]/]path[:tag][@digest]`, e.g. "nvcr.io/nvidia/pytorch:24.05-py3",
// "localhost/tiny:1", "127.0.0.1:15000/tiny@sha256:<64 hex digits>". Path components are
// lower-case letters and digits separated by '.', '_', '__' or runs of '-'; the first component
// is a domain when it holds a '.' or a ':' or is "localhost". kInvalidArgument saying what is
// wrong, without naming a field (callers add it); never accepts a reference that starts with
// '-', so a valid reference cannot be taken for a command-line flag.
Status ValidateImageReference(std::string_view reference);

// The longest digest accepted: "sha512:" and 128 hex digits.
inline constexpr size_t kMaxImageDigestLength = 135;

// Checks a content digest, "algorithm:hex" ("sha256:" and 64 lower-case hex digits for sha256),
// of at most kMaxImageDigestLength characters. kInvalidArgument saying what is wrong.
Status ValidateImageDigest(std::string_view digest);

// The fully qualified form of a valid reference, as container engines list the images they hold:
// Docker Hub's domain and "library/" for a short name, ":latest" for a name with neither tag nor
// digest ("busybox" -> "docker.io/library/busybox:latest"; "localhost/tiny:1" unchanged).
// REQUIRES: ValidateImageReference(reference) is OK.
std::string CanonicalImageReference(std::string_view reference);

// The digest a reference pins ("name@sha256:..."); empty when it pins none.
std::string_view ImageReferenceDigest(std::string_view reference);

}  // namespace gpufleet
