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

#include "gpufleet/wire/json_fields.h"

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

bool IsLowerHex(std::string_view text) {
  for (const char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return true;
}

// The kNodeCredentialsKind key of the credential whose hash is `hash`: NODE/ID.
std::string NodeCredentialKey(std::string_view node, std::string_view hash) {
  return fmt::format("{}/{}", node, hash.substr(0, kTokenIdChars));
}

// A token record; kInternal when it is not one of ours.
Result<TokenInfo> TokenInfoOf(const store::StoredObject& object) {
  const Json data = wire::ParseDocument(object.data);
  const std::string id = object.name.substr(0, kTokenIdChars);
  if (!data.is_object() || !data.contains("role") || !data["role"].is_string()) {
    return InternalError(fmt::format("tokens/{}: malformed record", id));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const control::Role role,
                            control::ParseRole(data["role"].get<std::string>()));
  TokenInfo info;
  info.id = id;
  info.role = role;
  if (data.contains("team") && data["team"].is_string()) {
    info.team = data["team"].get<std::string>();
  }
  if (data.contains("name") && data["name"].is_string()) {
    info.name = data["name"].get<std::string>();
  }
  if (data.contains("node") && data["node"].is_string()) {
    info.node = data["node"].get<std::string>();
  }
  return info;
}

}  // namespace

std::string Sha256Hex(std::string_view text) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  // EVP_Digest fails only when OpenSSL cannot allocate; an empty digest then matches no token.
  if (EVP_Digest(text.data(), text.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1) {
    return "";
  }
  return Hex(digest.data(), length);
}

std::string TokenId(std::string_view token) {
  return Sha256Hex(token).substr(0, kTokenIdChars);
}

Result<control::Principal> TokenAuthenticator::Authenticate(
    std::string_view authorization_header) const {
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
  if (std::optional<control::Principal> trusted = TrustedPrincipal(hash)) {
    return std::move(*trusted);
  }
  uint64_t revocations_before = 0;
  {
    std::lock_guard<std::mutex> lock(trust_mu_);
    revocations_before = revocations_;
  }
  Result<store::StoredObject> object = store_.Get(kTokensKind, hash);
  if (!object.ok()) {
    if (object.status().code() == StatusCode::kNotFound) {
      return Unauthenticated("unknown token");
    }
    return UnavailableError(fmt::format("token lookup: {}", object.status().message()));
  }
  GPUFLEET_ASSIGN_OR_RETURN(TokenInfo info, TokenInfoOf(*object));
  control::Principal principal;
  principal.role = info.role;
  principal.team = std::move(info.team);
  principal.name = std::move(info.name);
  principal.node = std::move(info.node);
  principal.token_id = hash.substr(0, kTokenIdChars);
  std::lock_guard<std::mutex> lock(trust_mu_);
  if (revocations_ == revocations_before) {
    if (trusted_.size() >= kMaxTrustedTokens) {
      trusted_.clear();
    }
    trusted_.insert_or_assign(hash, Trusted{principal, clock_.Now()});
  }
  return principal;
}

std::optional<control::Principal> TokenAuthenticator::TrustedPrincipal(
    const std::string& hash) const {
  std::lock_guard<std::mutex> lock(trust_mu_);
  const auto found = trusted_.find(hash);
  if (found == trusted_.end()) {
    return std::nullopt;
  }
  if (clock_.Now() - found->second.checked >= kTokenTrustTime) {
    trusted_.erase(found);
    return std::nullopt;
  }
  return found->second.principal;
}

Status TokenAuthenticator::StoreToken(std::string_view token, control::Role role,
                                      std::string_view team, std::string_view name,
                                      std::string_view node) {
  if (role == control::Role::kMember && team.empty()) {
    return InvalidArgumentError("team: a member token needs a team");
  }
  if (!node.empty() && role != control::Role::kAgent) {
    return InvalidArgumentError("node: only an agent token acts for a node");
  }
  if (name.empty()) {
    return InvalidArgumentError("name: must not be empty");
  }
  const std::string hash = Sha256Hex(token);
  if (hash.empty()) {
    return InternalError("sha-256 failed");
  }
  Json data = {{"role", control::RoleName(role)}, {"team", team}, {"name", name}};
  if (!node.empty()) {
    data["node"] = node;
  }
  store::WriteBatch batch;
  batch.Create(std::string(kTokensKind), hash, data.dump());
  if (!node.empty()) {
    batch.Create(std::string(kNodeCredentialsKind), NodeCredentialKey(node, hash), "{}");
  }
  batch.AppendEvent(std::string(kTokensKind), hash,
                    node.empty()
                        ? fmt::format("created {} token \"{}\"", control::RoleName(role), name)
                        : fmt::format("created agent token \"{}\" for node {}", name, node));
  return store_.Commit(batch);
}

Result<std::string> TokenAuthenticator::CreateToken(control::Role role, std::string_view team,
                                                    std::string_view name, std::string_view node) {
  std::array<unsigned char, kTokenBytes> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return UnavailableError("RAND_bytes failed: no entropy for a token");
  }
  std::string token = Hex(bytes.data(), bytes.size());
  GPUFLEET_RETURN_IF_ERROR(StoreToken(token, role, team, name, node));
  return token;
}

Status TokenAuthenticator::InstallToken(std::string_view token, control::Role role,
                                        std::string_view team, std::string_view name) {
  if (!IsTokenText(token)) {
    return InvalidArgumentError(
        fmt::format("token: must be {} to {} printable ASCII characters without spaces",
                    kMinTokenChars, kMaxTokenChars));
  }
  return StoreToken(token, role, team, name);
}

Status TokenAuthenticator::RevokeToken(std::string_view token) {
  return Revoke(Sha256Hex(token)).status();
}

Result<TokenInfo> TokenAuthenticator::RevokeTokenById(std::string_view id) {
  if (id.size() < kTokenIdChars || id.size() > 64 || !IsLowerHex(id)) {
    return InvalidArgumentError(fmt::format(
        "token id: \"{}\" (want the {} hex digits that `get tokens` shows)", id, kTokenIdChars));
  }
  return Revoke(id);
}

Result<TokenInfo> TokenAuthenticator::Revoke(std::string_view hash_prefix) {
  std::lock_guard<std::mutex> lock(revoke_mu_);
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> tokens,
                            store_.List(kTokensKind));
  const store::StoredObject* found = nullptr;
  int admins = 0;
  for (const store::StoredObject& object : tokens) {
    GPUFLEET_ASSIGN_OR_RETURN(const TokenInfo info, TokenInfoOf(object));
    admins += info.role == control::Role::kAdmin ? 1 : 0;
    if (!object.name.starts_with(hash_prefix)) {
      continue;
    }
    if (found != nullptr) {
      return InvalidArgumentError(fmt::format(
          "token id: \"{}\" matches more than one token; give more digits", hash_prefix));
    }
    found = &object;
  }
  if (found == nullptr) {
    return NotFoundError(
        fmt::format("token \"{}\" not found", hash_prefix.substr(0, kTokenIdChars)));
  }
  GPUFLEET_ASSIGN_OR_RETURN(TokenInfo info, TokenInfoOf(*found));
  if (info.role == control::Role::kAdmin && admins == 1) {
    return FailedPreconditionError(fmt::format(
        "token {} is the last admin token; create another admin token before revoking it",
        info.id));
  }
  store::WriteBatch batch;
  batch.Delete(std::string(kTokensKind), found->name, found->version);
  batch.AppendEvent(std::string(kTokensKind), found->name, "revoked");
  if (!info.node.empty()) {
    const std::string key = NodeCredentialKey(info.node, found->name);
    const Result<store::StoredObject> indexed = store_.Get(kNodeCredentialsKind, key);
    if (indexed.ok()) {
      batch.Delete(std::string(kNodeCredentialsKind), key, indexed->version);
    } else if (indexed.status().code() != StatusCode::kNotFound) {
      return indexed.status();
    }
  }
  const Status committed = store_.Commit(batch);
  {
    // Also after a commit of unknown outcome: the token may be gone.
    std::lock_guard<std::mutex> trust_lock(trust_mu_);
    ++revocations_;
    trusted_.erase(found->name);
  }
  GPUFLEET_RETURN_IF_ERROR(committed);
  return info;
}

Result<bool> TokenAuthenticator::NodeHasCredential(std::string_view node) const {
  GPUFLEET_ASSIGN_OR_RETURN(
      const std::vector<store::StoredObject> credentials,
      store_.ListWhere(kNodeCredentialsKind, {.name_prefix = fmt::format("{}/", node),
                                              .exclude_states = true,  // whatever their state
                                              .limit = 1}));
  return !credentials.empty();
}

Status TokenAuthenticator::IndexNodeCredentials(const std::vector<store::StoredObject>& tokens) {
  for (const store::StoredObject& object : tokens) {
    const Result<TokenInfo> info = TokenInfoOf(object);
    if (!info.ok() || info->node.empty()) {
      continue;
    }
    const std::string key = NodeCredentialKey(info->node, object.name);
    const Result<store::StoredObject> indexed = store_.Get(kNodeCredentialsKind, key);
    if (indexed.ok()) {
      continue;
    }
    if (indexed.status().code() != StatusCode::kNotFound) {
      return indexed.status();
    }
    const Status created =
        store_.Commit(store::WriteBatch().Create(std::string(kNodeCredentialsKind), key, "{}"));
    if (!created.ok() && created.code() != StatusCode::kAlreadyExists) {
      return created;
    }
  }
  return Status::Ok();
}

Result<std::vector<TokenInfo>> TokenAuthenticator::ListTokens() const {
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> tokens,
                            store_.List(kTokensKind));
  std::vector<TokenInfo> out;
  out.reserve(tokens.size());
  for (const store::StoredObject& object : tokens) {
    GPUFLEET_ASSIGN_OR_RETURN(TokenInfo info, TokenInfoOf(object));
    out.push_back(std::move(info));
  }
  return out;
}

Result<std::optional<std::string>> TokenAuthenticator::Bootstrap(
    const std::optional<std::string>& admin_token) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> tokens,
                            store_.List(kTokensKind));
  if (!tokens.empty()) {
    GPUFLEET_RETURN_IF_ERROR(IndexNodeCredentials(tokens));
    return std::optional<std::string>();
  }
  if (admin_token.has_value()) {
    GPUFLEET_RETURN_IF_ERROR(InstallToken(*admin_token, control::Role::kAdmin, "", "admin"));
    return std::optional<std::string>();
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::string token, CreateToken(control::Role::kAdmin, "", "admin"));
  return std::optional<std::string>(std::move(token));
}

}  // namespace gpufleet::api
