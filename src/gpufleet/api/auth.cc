// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/auth.h"

#include <array>
#include <cctype>
#include <cstdint>
#include <memory>

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <openssl/rand.h>

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;

constexpr size_t kTokenBytes = 32;
constexpr size_t kMinTokenChars = 16;
constexpr size_t kMaxTokenChars = 1024;

std::string Hex(const unsigned char* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(kDigits[data[i] >> 4]);
    out.push_back(kDigits[data[i] & 0x0f]);
  }
  return out;
}

bool IsTokenText(std::string_view token) {
  if (token.size() < kMinTokenChars || token.size() > kMaxTokenChars) {
    return false;
  }
  for (const char c : token) {
    if (c <= ' ' || c > '~') {
      return false;
    }
  }
  return true;
}

Status Unauthenticated(std::string message) {
  return Status(StatusCode::kUnauthenticated, std::move(message));
}

}  // namespace

const char* RoleName(Role role) {
  return role == Role::kAdmin ? "admin" : "member";
}

Result<Role> ParseRole(std::string_view text) {
  if (text == "admin") {
    return Role::kAdmin;
  }
  if (text == "member") {
    return Role::kMember;
  }
  return InvalidArgumentError(fmt::format("role: \"{}\" (must be admin or member)", text));
}

std::string Sha256Hex(std::string_view text) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  // EVP_Digest fails only when OpenSSL cannot allocate; an empty digest then matches no token.
  if (EVP_Digest(text.data(), text.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1) {
    return "";
  }
  return Hex(digest.data(), length);
}

Result<Principal> TokenAuthenticator::Authenticate(std::string_view authorization_header) const {
  if (authorization_header.empty()) {
    return Unauthenticated("missing Authorization header (want \"Bearer TOKEN\")");
  }
  constexpr std::string_view kScheme = "bearer ";
  bool scheme_ok = authorization_header.size() > kScheme.size();
  for (size_t i = 0; scheme_ok && i < kScheme.size(); ++i) {
    scheme_ok = std::tolower(static_cast<unsigned char>(authorization_header[i])) == kScheme[i];
  }
  if (!scheme_ok) {
    return Unauthenticated("malformed Authorization header (want \"Bearer TOKEN\")");
  }
  std::string_view token = authorization_header.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') {
    token.remove_prefix(1);
  }
  while (!token.empty() && token.back() == ' ') {
    token.remove_suffix(1);
  }
  if (!IsTokenText(token)) {
    return Unauthenticated("unknown token");
  }
  const std::string hash = Sha256Hex(token);
  if (hash.empty()) {
    return Unauthenticated("unknown token");
  }
  Result<store::StoredObject> object = store_.Get(kTokensKind, hash);
  if (!object.ok()) {
    if (object.status().code() == StatusCode::kNotFound) {
      return Unauthenticated("unknown token");
    }
    return UnavailableError(fmt::format("token lookup: {}", object.status().message()));
  }
  const Json data = Json::parse(object->data, nullptr, false);
  if (!data.is_object() || !data.contains("role") || !data["role"].is_string()) {
    return InternalError(fmt::format("tokens/{}: malformed record", hash.substr(0, 12)));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const Role role, ParseRole(data["role"].get<std::string>()));
  Principal principal;
  principal.role = role;
  if (data.contains("team") && data["team"].is_string()) {
    principal.team = data["team"].get<std::string>();
  }
  if (data.contains("name") && data["name"].is_string()) {
    principal.name = data["name"].get<std::string>();
  }
  return principal;
}

Status TokenAuthenticator::StoreToken(std::string_view token, Role role, std::string_view team,
                                      std::string_view name) {
  if (role == Role::kMember && team.empty()) {
    return InvalidArgumentError("team: a member token needs a team");
  }
  if (name.empty()) {
    return InvalidArgumentError("name: must not be empty");
  }
  const std::string hash = Sha256Hex(token);
  if (hash.empty()) {
    return InternalError("sha-256 failed");
  }
  Json data = {{"role", RoleName(role)}, {"team", team}, {"name", name}};
  store::WriteBatch batch;
  batch.Create(std::string(kTokensKind), hash, data.dump());
  batch.AppendEvent(std::string(kTokensKind), hash,
                    fmt::format("created {} token \"{}\"", RoleName(role), name));
  return store_.Commit(batch);
}

Result<std::string> TokenAuthenticator::CreateToken(Role role, std::string_view team,
                                                    std::string_view name) {
  std::array<unsigned char, kTokenBytes> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return UnavailableError("RAND_bytes failed: no entropy for a token");
  }
  std::string token = Hex(bytes.data(), bytes.size());
  GPUFLEET_RETURN_IF_ERROR(StoreToken(token, role, team, name));
  return token;
}

Status TokenAuthenticator::InstallToken(std::string_view token, Role role, std::string_view team,
                                        std::string_view name) {
  if (!IsTokenText(token)) {
    return InvalidArgumentError(
        fmt::format("token: must be {} to {} printable ASCII characters without spaces",
                    kMinTokenChars, kMaxTokenChars));
  }
  return StoreToken(token, role, team, name);
}

Status TokenAuthenticator::RevokeToken(std::string_view token) {
  const std::string hash = Sha256Hex(token);
  store::WriteBatch batch;
  batch.Delete(std::string(kTokensKind), hash);
  batch.AppendEvent(std::string(kTokensKind), hash, "revoked");
  Status status = store_.Commit(batch);
  if (status.code() == StatusCode::kNotFound) {
    return NotFoundError("unknown token");
  }
  return status;
}

Result<std::optional<std::string>> TokenAuthenticator::Bootstrap(
    const std::optional<std::string>& admin_token) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> tokens,
                            store_.List(kTokensKind));
  if (!tokens.empty()) {
    return std::optional<std::string>();
  }
  if (admin_token.has_value()) {
    GPUFLEET_RETURN_IF_ERROR(InstallToken(*admin_token, Role::kAdmin, "", "admin"));
    return std::optional<std::string>();
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::string token, CreateToken(Role::kAdmin, "", "admin"));
  return std::optional<std::string>(std::move(token));
}

}  // namespace gpufleet::api
