// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

#include "gpufleet/core/status.h"

// A throwaway TLS identity for tests that serve HTTPS on loopback (gpufleet::api_testing).
namespace gpufleet::api_testing {

// Writes a fresh P-256 key and a self-signed certificate for the IP address 127.0.0.1 (subject
// CN and subjectAltName, valid from an hour ago for a day) as PEM files. The certificate is its
// own CA: a client that trusts `cert_path` verifies the server. kInternal when OpenSSL fails,
// kUnavailable when a file cannot be written.
Status WriteSelfSignedCert(const std::string& cert_path, const std::string& key_path);

}  // namespace gpufleet::api_testing
