// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/tls.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

#include <fmt/core.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

namespace gpufleet::api {
namespace {

// OpenSSL's reason for the last failure, and the thread's error queue emptied.
std::string TakeOpenSslError() {
  std::string reason;
  while (const unsigned long code =
             ERR_get_error()) {  // NOLINT(google-runtime-int): OpenSSL's type
    std::array<char, 256> text{};
    ERR_error_string_n(code, text.data(), text.size());
    reason = text.data();
  }
  return reason.empty() ? "unknown OpenSSL error" : reason;
}

Status Readable(const char* what, const std::string& path) {
  if (path.empty()) {
    return InvalidArgumentError(fmt::format("{}: no file given", what));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return InvalidArgumentError(
        fmt::format("{} \"{}\": cannot read it: {}", what, path,
                    std::strerror(errno)));  // NOLINT(concurrency-mt-unsafe)
  }
  return Status::Ok();
}

struct ContextFree {
  void operator()(SSL_CTX* context) const { SSL_CTX_free(context); }
};
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

// An encrypted key fails to load instead of prompting on the terminal for a passphrase.
int NoPassphrase(char* /*buffer*/, int /*size*/, int /*writing*/, void* /*user_data*/) {
  return 0;
}

}  // namespace

Status CheckTlsFiles(const std::string& cert_file, const std::string& key_file) {
  GPUFLEET_RETURN_IF_ERROR(Readable("TLS certificate", cert_file));
  GPUFLEET_RETURN_IF_ERROR(Readable("TLS key", key_file));
  ERR_clear_error();
  const std::unique_ptr<SSL_CTX, ContextFree> context(SSL_CTX_new(TLS_server_method()));
  if (context == nullptr) {
    return InternalError(fmt::format("TLS: cannot create a context: {}", TakeOpenSslError()));
  }
  SSL_CTX_set_default_passwd_cb(context.get(), NoPassphrase);
  if (SSL_CTX_use_certificate_chain_file(context.get(), cert_file.c_str()) != 1) {
    return InvalidArgumentError(fmt::format("TLS certificate \"{}\": not a PEM certificate: {}",
                                            cert_file, TakeOpenSslError()));
  }
  const std::unique_ptr<BIO, BioFree> key_bio(BIO_new_file(key_file.c_str(), "r"));
  const std::unique_ptr<EVP_PKEY, KeyFree> key(
      key_bio == nullptr ? nullptr
                         : PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassphrase, nullptr));
  if (key == nullptr) {
    return InvalidArgumentError(
        fmt::format("TLS key \"{}\": not a PEM private key: {}", key_file, TakeOpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey(context.get(), key.get()) != 1 ||
      SSL_CTX_check_private_key(context.get()) != 1) {
    return InvalidArgumentError(
        fmt::format("TLS key \"{}\" does not match the certificate \"{}\": {}", key_file, cert_file,
                    TakeOpenSslError()));
  }
  return Status::Ok();
}

}  // namespace gpufleet::api
