// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpufleet/control/principal.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"

// Bearer tokens of the REST API. A token is 32 random bytes written as 64 hex digits; the store
// keeps only its SHA-256 (object kind "tokens", name = the hex digest, data =
// {"role": "admin"|"member", "team": ..., "name": ...}), so a copy of the database gives no
// usable credential.
namespace gpufleet::api {

inline constexpr std::string_view kTokensKind = "tokens";
// The node credentials by node: one object "NODE/ID" (data "{}") per agent token that acts for
// NODE, written and deleted with the token, so that a join token's registration finds in one
// read whether the node already has a credential (an admin may make one before the node first
// registers).
inline constexpr std::string_view kNodeCredentialsKind = "node-credentials";

// The SHA-256 of `text` as 64 lower-case hex digits (OpenSSL EVP).
std::string Sha256Hex(std::string_view text);

// A token's public id: the first kTokenIdChars hex digits of its SHA-256, so that it names the
// token in listings and revocations without revealing it.
inline constexpr size_t kTokenIdChars = 12;
std::string TokenId(std::string_view token);

// What a listing shows of a token: never the secret.
struct TokenInfo {
  std::string id;
  control::Role role = control::Role::kMember;
  std::string team;
  std::string name;
  std::string node;  // a node credential's node
};

// How long a checked token is taken on trust without reading the store again. A revocation
// through this authenticator ends the trust at once; one made by another server on the same
// store (several servers, docs/ha.md) takes effect here within this time.
inline constexpr std::chrono::seconds kTokenTrustTime{1};

// Issues, checks and revokes tokens in a StateStore. Thread-safe: the store (which must outlive
// it) is thread-safe, and a mutex serialises revocations so that two of them cannot remove the
// last two admin tokens together.
class TokenAuthenticator {
 public:
  // `clock` (which must outlive it) times kTokenTrustTime.
  TokenAuthenticator(store::StateStore& store, const Clock& clock) : store_(store), clock_(clock) {}

  // Checks an `Authorization` header value, "Bearer TOKEN" (the scheme is case-insensitive).
  // kUnauthenticated when the header is missing, malformed or names an unknown token;
  // kUnavailable when the store fails.
  Result<control::Principal> Authenticate(std::string_view authorization_header) const;

  // Makes a fresh random token and stores its hash. kInvalidArgument for a member without a
  // team, an empty name, or a node for another role than agent. With `node`, an agent token is a
  // node credential: it acts for that node alone. Returns the token: it is never shown again.
  Result<std::string> CreateToken(control::Role role, std::string_view team, std::string_view name,
                                  std::string_view node = "");
  // Stores the hash of a token chosen by the operator (at least 16 characters, printable ASCII,
  // no spaces). kAlreadyExists if it is already installed.
  Status InstallToken(std::string_view token, control::Role role, std::string_view team,
                      std::string_view name);
  // Deletes a token. kNotFound if unknown; kFailedPrecondition if it is the last admin token.
  Status RevokeToken(std::string_view token);
  // Deletes the token whose id (TokenId; a longer prefix of the hash works too) is `id` and
  // returns what it was. kInvalidArgument unless `id` is kTokenIdChars to 64 lower-case hex
  // digits or when it matches more than one token; kNotFound if it matches none;
  // kFailedPrecondition if it is the last admin token (the API would be locked for good).
  Result<TokenInfo> RevokeTokenById(std::string_view id);
  // Every token, ordered by id.
  Result<std::vector<TokenInfo>> ListTokens() const;
  // Whether an agent token acts for `node` (a node credential). kUnavailable when the store
  // fails.
  Result<bool> NodeHasCredential(std::string_view node) const;

  // First start: when no token exists, installs `admin_token` (read from --admin-token-file) or,
  // when it is nullopt, creates a random admin token. Returns the token created this way (to be
  // printed once), or nullopt when tokens already existed or `admin_token` was installed. When
  // tokens existed, indexes the node credentials that an older version made without an entry of
  // kNodeCredentialsKind.
  Result<std::optional<std::string>> Bootstrap(const std::optional<std::string>& admin_token);

 private:
  Status IndexNodeCredentials(const std::vector<store::StoredObject>& tokens);
  Status StoreToken(std::string_view token, control::Role role, std::string_view team,
                    std::string_view name, std::string_view node = "");
  // Revokes the token stored under `hash_prefix` (a whole hash or an id).
  Result<TokenInfo> Revoke(std::string_view hash_prefix);

  // Tokens checked within kTokenTrustTime, by hash: reading the store on every request was 6 % of
  // the server's CPU at 1,000 submissions per second. At most kMaxTrustedTokens entries.
  struct Trusted {
    control::Principal principal;
    MonoTime checked;
  };
  static constexpr size_t kMaxTrustedTokens = 65536;
  std::optional<control::Principal> TrustedPrincipal(const std::string& hash) const;

  store::StateStore& store_;
  const Clock& clock_;
  std::mutex revoke_mu_;
  mutable std::mutex trust_mu_;
  mutable std::unordered_map<std::string, Trusted> trusted_;
  // Counts revocations, so that a check that read the store before one does not trust its
  // answer after it.
  uint64_t revocations_ = 0;
};

}  // namespace gpufleet::api
