// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"

// The durable state of the control plane: a versioned document store in the spirit of etcd and
// the Kubernetes API server. Writers use optimistic concurrency (compare-and-set on a per-object
// version, conflicts are kAborted and retried), as Omega argued.
namespace gpufleet::store {

// Kinds and names: non-empty, valid UTF-8 without control characters, at most this many bytes.
inline constexpr size_t kMaxKeyBytes = 253;
// Object data and event text: at most 1 MiB.
inline constexpr size_t kMaxDataBytes = size_t{1} << 20;

// One document. `data` is JSON text to callers and opaque bytes to the store.
struct StoredObject {
  std::string kind;
  std::string name;
  std::string data;
  // Per object, 1 on create and bumped by each update; a deleted and re-created object starts
  // again at 1 (its `revision` tells the incarnations apart).
  int64_t version = 0;
  // Store-wide revision of the commit that last wrote this object.
  int64_t revision = 0;

  friend bool operator==(const StoredObject&, const StoredObject&) = default;
};

// One entry of an object's append-only event log.
struct StoredEvent {
  // Revision of the commit that appended it (events of one commit share it).
  int64_t revision = 0;
  std::string text;

  friend bool operator==(const StoredEvent&, const StoredEvent&) = default;
};

// The state index: every object is indexed by the value of the string member "state" at the top
// level of its data, read by TopLevelString (core/json_scan.h) on every write; "" when the data
// has none the store can read (not a JSON object, no such member, not a string, an escape
// sequence in it) or one that is not a valid key (ValidateKey: empty, over kMaxKeyBytes, bad
// UTF-8, a control character). A malformed document is indexed under "" and is otherwise stored
// and listed like any other. ListWhere reads the index.
std::string IndexedState(std::string_view data);

// Which objects of a kind ListWhere returns, sorted by name.
struct ListFilter {
  // Only names that start with this (bytewise).
  std::string name_prefix;
  // Only objects whose indexed state is one of these; with `exclude_states`, only those whose
  // indexed state is none of these (objects indexed under "" included unless "" is listed).
  // Listing the states an object must not have is how a caller that must not miss an object
  // (a job that is not finished) asks: an unreadable state then counts as "not finished".
  std::vector<std::string> states;
  bool exclude_states = false;
  // Paging: only names after this one (the last name of the previous page; "" for the first).
  std::string start_after;
  // At most this many objects (0: no limit).
  size_t limit = 0;
};

enum class WriteOpType { kCreate, kUpdate, kDelete, kAppendEvent, kDeleteEvents };

// "create", "update", "delete", "append-event", "delete-events".
const char* WriteOpTypeName(WriteOpType type);

struct WriteOp {
  WriteOpType type = WriteOpType::kCreate;
  std::string kind;
  std::string name;
  // Object data (create, update) or event text (append-event).
  std::string data;
  // Update: the version the object must be at (> 0). Delete: the same, or 0 for unconditional.
  int64_t expected_version = 0;
};

// An ordered list of operations that StateStore::Commit applies all or nothing. Operations see
// the effects of the earlier ones of the same batch (create then update in one batch works).
// Thread-compatible.
class WriteBatch {
 public:
  // Fails with kAlreadyExists if the object exists.
  WriteBatch& Create(std::string kind, std::string name, std::string data);
  // Fails with kNotFound if the object is absent, kAborted if it is not at `expected_version`.
  WriteBatch& Update(std::string kind, std::string name, std::string data,
                     int64_t expected_version);
  // Fails with kNotFound if the object is absent, kAborted if `expected_version` is not 0 and
  // the object is not at it. The object's event log is kept.
  WriteBatch& Delete(std::string kind, std::string name, int64_t expected_version = 0);
  // Appends `text` to the event log of kind/name. The object need not exist: a log outlives the
  // object it describes (and is continued if the object is created again).
  WriteBatch& AppendEvent(std::string kind, std::string name, std::string text);
  // Removes the whole event log of kind/name (events appended earlier in the same batch too);
  // nothing to remove is not an error. Garbage collection of finished objects uses it.
  WriteBatch& DeleteEvents(std::string kind, std::string name);
  // Adds the operations of `other` after these (several writes in one durable commit).
  WriteBatch& Append(const WriteBatch& other);

  const std::vector<WriteOp>& ops() const { return ops_; }
  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }

 private:
  std::vector<WriteOp> ops_;
};

// Told of every successful, non-empty commit, after it is durable and before Commit returns, on
// the committing thread. Must be quick and must not call back into the store.
class CommitObserver {
 public:
  virtual ~CommitObserver() = default;
  virtual void Committed(const WriteBatch& batch) = 0;
  // Told, in the same way, of every valid batch the backend failed to commit: its outcome may be
  // unknown (PostgreSQL's COMMIT sent and its answer lost), so an observer that mirrors the store
  // reads the batch's objects again rather than trust either outcome.
  virtual void CommitFailed(const WriteBatch&) {}
};

// The store interface. Implementations are thread-safe: any method may be called from any
// thread at any time; each call is atomic and sees every commit that returned before it began.
//
// Revisions: a store-wide counter, 0 when empty, bumped by one per non-empty successful commit;
// every object and event written by that commit carries the new value. An empty batch commits
// trivially without a new revision.
//
// The public methods validate their arguments (kInvalidArgument naming the field and the value:
// kinds and names non-empty, at most kMaxKeyBytes, valid UTF-8, no control characters; data and
// event text at most kMaxDataBytes) and then call the Do* methods that backends implement.
class StateStore {
 public:
  virtual ~StateStore() = default;

  // kNotFound if kind/name does not exist.
  Result<StoredObject> Get(std::string_view kind, std::string_view name);
  // The objects of `kind` named in `names` that exist, sorted by name (a missing one is left
  // out), each as Get reads it: a reader of many changed objects makes one call (on PostgreSQL
  // one round trip) instead of one Get each. kInvalidArgument for a name that is not a valid key.
  Result<std::vector<StoredObject>> GetMany(std::string_view kind,
                                            const std::vector<std::string>& names);
  // Objects of `kind` whose name starts with `name_prefix` (bytewise), sorted by name.
  Result<std::vector<StoredObject>> List(std::string_view kind, std::string_view name_prefix = "");
  // Objects of `kind` that `filter` selects, sorted by name, read through the state index: the
  // cost grows with the objects returned (and the number of distinct states of the kind), not
  // with the objects of other states. kInvalidArgument for a prefix, start or state that is not
  // a valid key ("" allowed as a state: no readable state).
  Result<std::vector<StoredObject>> ListWhere(std::string_view kind, const ListFilter& filter);
  // Applies `batch` atomically: either every operation takes effect or none does, and the error
  // names the failing operation ("... (batch op 2 of 3: update)"). Once OK is returned the batch
  // is durable as far as the backend is (SQLite: fsynced; PostgreSQL: synchronous_commit on).
  Status Commit(const WriteBatch& batch);
  // The revision of the last successful commit (0 for an empty store).
  Result<int64_t> Revision();
  // The event log of kind/name, oldest first; empty if none was ever appended.
  Result<std::vector<StoredEvent>> Events(std::string_view kind, std::string_view name);

  // Starts and stops telling `observer` of commits (the server keeps its in-memory view of jobs
  // and nodes up to date this way). REQUIRES: an observer is removed before it is destroyed.
  void AddObserver(CommitObserver* observer);
  void RemoveObserver(CommitObserver* observer);

 protected:
  // Called with validated arguments only.
  virtual Result<StoredObject> DoGet(std::string_view kind, std::string_view name) = 0;
  // `names` sorted, without repeats. By default one DoGet per name.
  virtual Result<std::vector<StoredObject>> DoGetMany(std::string_view kind,
                                                      const std::vector<std::string>& names);
  virtual Result<std::vector<StoredObject>> DoList(std::string_view kind,
                                                   std::string_view name_prefix) = 0;
  virtual Result<std::vector<StoredObject>> DoListWhere(std::string_view kind,
                                                        const ListFilter& filter) = 0;
  // Called with a validated, non-empty batch.
  virtual Status DoCommit(const WriteBatch& batch) = 0;
  virtual Result<int64_t> DoRevision() = 0;
  virtual Result<std::vector<StoredEvent>> DoEvents(std::string_view kind,
                                                    std::string_view name) = 0;

 private:
  std::mutex observers_mu_;
  std::vector<CommitObserver*> observers_;  // guarded by observers_mu_
};

// A StateStore that passes every call to `inner` (which must outlive it): the base of decorators
// that change one or two calls (a simulated server's fenced view, the tests' fault injectors).
// Observers of the decorator see the commits made through it only.
class ForwardingStateStore : public StateStore {
 public:
  explicit ForwardingStateStore(StateStore& inner) : inner_(inner) {}

 protected:
  StateStore& inner() { return inner_; }
  Result<StoredObject> DoGet(std::string_view kind, std::string_view name) override;
  Result<std::vector<StoredObject>> DoGetMany(std::string_view kind,
                                              const std::vector<std::string>& names) override;
  Result<std::vector<StoredObject>> DoList(std::string_view kind,
                                           std::string_view name_prefix) override;
  Result<std::vector<StoredObject>> DoListWhere(std::string_view kind,
                                                const ListFilter& filter) override;
  Status DoCommit(const WriteBatch& batch) override;
  Result<int64_t> DoRevision() override;
  Result<std::vector<StoredEvent>> DoEvents(std::string_view kind, std::string_view name) override;

 private:
  StateStore& inner_;
};

// Validation and messages shared by the backends.

// OK if `value` is a valid kind or name; otherwise kInvalidArgument naming `field` and `value`.
Status ValidateKey(std::string_view field, std::string_view value);
// Validates every operation of `batch`; the error names the operation.
Status ValidateBatch(const WriteBatch& batch);
// ListWhere for backends that keep the index in a table sorted by (kind, state, name). Reads,
// all within one consistent snapshot that the caller holds: `distinct_states` returns every
// non-empty indexed state of the kind (only called with `exclude_states`; "" is always looked at),
// `list_state` the objects of one state whose names start with `filter.name_prefix`, come after
// `filter.start_after`, sorted, at most `filter.limit` of them (0: all). Merges them by name and
// cuts to the limit.
Result<std::vector<StoredObject>> ListWhereByState(
    const ListFilter& filter,
    const std::function<Result<std::vector<std::string>>()>& distinct_states,
    const std::function<Result<std::vector<StoredObject>>(const std::string& state)>& list_state);
// Whether `name` passes `filter` apart from the state and the limit: the prefix and the start.
bool InListRange(const ListFilter& filter, std::string_view name);
// Appends " (batch op <index+1> of <size>: <type>)" to the message of a failed operation.
Status AnnotateOpError(const Status& status, size_t index, size_t size, const WriteOp& op);
// kAborted "version conflict: kind/name is at version N, expected M".
Status VersionConflictError(std::string_view kind, std::string_view name, int64_t actual,
                            int64_t expected);
// kNotFound "kind/name not found".
Status ObjectNotFoundError(std::string_view kind, std::string_view name);
// kAlreadyExists "kind/name already exists".
Status ObjectExistsError(std::string_view kind, std::string_view name);

}  // namespace gpufleet::store
