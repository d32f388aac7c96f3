// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

#include "gpufleet/core/status.h"

// Checks of the TLS files `gpufleet server --tls-cert/--tls-key` serves with, so that a wrong
// path or file fails at start-up with a message that says which file and why, rather than with
// cpp-httplib's bare "not valid".
namespace gpufleet::api {

// OK if `cert_file` holds a PEM certificate (chain) and `key_file` the PEM private key that
// matches it. Otherwise kInvalidArgument naming the file and OpenSSL's reason, e.g.
// `TLS certificate "/etc/x.pem": cannot read it: No such file or directory`.
Status CheckTlsFiles(const std::string& cert_file, const std::string& key_file);

}  // namespace gpufleet::api
