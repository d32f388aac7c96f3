// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/image_reference.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace gpufleet {
namespace {

TEST(ImageReference, AcceptsTheReferencesOfRealRegistries) {
  // Names that start like a transport but are images of a registry.
  for (const char* reference : {"docker-archive", "library/dir:1", "directory/x:1"}) {
    EXPECT_TRUE(ValidateImageReference(reference).ok()) << reference;
  }
  for (const std::string& reference : std::vector<std::string>{
           {"busybox", "library/busybox:1.36", "nvcr.io/nvidia/pytorch:24.05-py3",
            "localhost/tiny:1", "127.0.0.1:15000/tiny:1",
            "registry.example.com:5000/team/a__b/c-d.e:v1_2",
            "ghcr.io/org/img@sha256:" + std::string(64, 'a'),
            "ghcr.io/org/img:tag@sha256:" + std::string(64, '0'), "Registry.Example.com/x"}}) {
    SCOPED_TRACE(reference);
    EXPECT_TRUE(ValidateImageReference(reference).ok())
        << ValidateImageReference(reference).ToString();
  }
}

TEST(ImageReference, RefusesMalformedReferencesSayingWhy) {
  struct Case {
    std::string reference;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty"},
           {"-rm", "name component \"-rm\""},
           {"--privileged", "name component"},
           {"Busybox", "name component \"Busybox\""},
           {"busybox:", "tag \"\""},
           {"busybox:-x", "tag \"-x\""},
           {"busybox:" + std::string(129, 'a'), "tag"},
           {"a//b", "name component \"\""},
           {"a/b/", "name component \"\""},
           {"a_-b", "name component"},
           {"reg.io:port/x", "registry \"reg.io:port\""},
           {"-reg.io/x", "registry"},
           {"x@sha256:abc", "digest \"sha256:abc\""},
           {"x@sha256:" + std::string(64, 'A'), "digest"},
           {"x@" + std::string(64, 'a'), "no ':'"},
           {"x y", "name component \"x y\""},
           {std::string(256, 'a'), "255"},
           {std::string(600, 'a'), "too long"},
           // Transports podman reads files or local stores through, not registry references.
           {"docker-archive:evil.tar", "\"docker-archive:\" is a transport"},
           {"oci-archive:/tmp/x.tar", "\"oci-archive:\" is a transport"},
           {"dir:x", "\"dir:\" is a transport"},
           {"containers-storage:busybox", "\"containers-storage:\" is a transport"},
           {"docker-daemon:busybox:latest", "\"docker-daemon:\" is a transport"},
           {"docker://busybox", "\"docker:\" is a transport"},
           {"oci:x", "\"oci:\" is a transport"},
           {"tarball:x", "\"tarball:\" is a transport"},
       }) {
    SCOPED_TRACE(c.reference);
    const Status status = ValidateImageReference(c.reference);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(c.why), std::string::npos) << status.ToString();
  }
}

TEST(ImageReference, CanonicalFormIsWhatContainerEnginesList) {
  const std::string digest = "sha256:" + std::string(64, 'a');
  EXPECT_EQ(CanonicalImageReference("busybox"), "docker.io/library/busybox:latest");
  EXPECT_EQ(CanonicalImageReference("nvidia/cuda:12.4"), "docker.io/nvidia/cuda:12.4");
  EXPECT_EQ(CanonicalImageReference("localhost/tiny:1"), "localhost/tiny:1");
  EXPECT_EQ(CanonicalImageReference("127.0.0.1:15000/tiny"), "127.0.0.1:15000/tiny:latest");
  EXPECT_EQ(CanonicalImageReference("nvcr.io/nvidia/pytorch@" + digest),
            "nvcr.io/nvidia/pytorch@" + digest);
  EXPECT_EQ(ImageReferenceDigest("nvcr.io/nvidia/pytorch:24.05-py3@" + digest), digest);
  EXPECT_EQ(ImageReferenceDigest("nvcr.io/nvidia/pytorch:24.05-py3"), "");
  EXPECT_TRUE(ValidateImageDigest(digest).ok());
  EXPECT_EQ(ValidateImageDigest("sha256:abc").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateImageDigest("sha999:" + std::string(1000, 'a')).message(),
            "a digest of 1007 characters is too long (at most 135)");
}

TEST(ImagePullPolicy, NamesRoundTripAndUnknownNamesAreRefused) {
  for (const ImagePullPolicy policy :
       {ImagePullPolicy::kIfNotPresent, ImagePullPolicy::kAlways, ImagePullPolicy::kNever}) {
    EXPECT_EQ(ImagePullPolicyFromName(ImagePullPolicyName(policy)), policy);
  }
  EXPECT_EQ(ImagePullPolicyFromName("always"), std::nullopt);
  EXPECT_EQ(ImagePullPolicyFromName(""), std::nullopt);
}

}  // namespace
}  // namespace gpufleet
