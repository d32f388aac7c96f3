// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/testing/self_signed_cert.h"

#include <cstdio>
#include <memory>

#include <fmt/core.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace gpufleet::api_testing {
namespace {

struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct CertFree {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct ExtensionFree {
  void operator()(X509_EXTENSION* extension) const { X509_EXTENSION_free(extension); }
};
struct FileClose {
  void operator()(FILE* file) const { std::fclose(file); }
};

constexpr long kOneHourSeconds = 3600;  // NOLINT(google-runtime-int): OpenSSL's type

Status AddExtension(X509* cert, int nid, const char* value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, cert, cert, nullptr, nullptr, 0);
  const std::unique_ptr<X509_EXTENSION, ExtensionFree> extension(
      X509V3_EXT_conf_nid(nullptr, &context, nid, value));
  if (extension == nullptr || X509_add_ext(cert, extension.get(), -1) != 1) {
    return InternalError(fmt::format("cannot add certificate extension {}", value));
  }
  return Status::Ok();
}

}  // namespace

Status WriteSelfSignedCert(const std::string& cert_path, const std::string& key_path) {
  const std::unique_ptr<EVP_PKEY, KeyFree> key(EVP_EC_gen("P-256"));
  const std::unique_ptr<X509, CertFree> cert(X509_new());
  if (key == nullptr || cert == nullptr) {
    return InternalError("cannot make a P-256 key or a certificate");
  }
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -kOneHourSeconds);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * kOneHourSeconds);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  GPUFLEET_RETURN_IF_ERROR(AddExtension(cert.get(), NID_subject_alt_name, "IP:127.0.0.1"));
  GPUFLEET_RETURN_IF_ERROR(AddExtension(cert.get(), NID_basic_constraints, "critical,CA:TRUE"));
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
    return InternalError("cannot sign the certificate");
  }
  const std::unique_ptr<FILE, FileClose> cert_file(std::fopen(cert_path.c_str(), "w"));
  const std::unique_ptr<FILE, FileClose> key_file(std::fopen(key_path.c_str(), "w"));
  if (cert_file == nullptr || key_file == nullptr) {
    return UnavailableError(fmt::format("cannot write {} or {}", cert_path, key_path));
  }
  if (PEM_write_X509(cert_file.get(), cert.get()) != 1 ||
      PEM_write_PrivateKey(key_file.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return UnavailableError(fmt::format("cannot write {} or {}", cert_path, key_path));
  }
  return Status::Ok();
}

}  // namespace gpufleet::api_testing
