// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace gpufleet {

// Canonical codes (abseil / google.rpc). The api module maps them to HTTP in one place.
enum class StatusCode {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

const char* StatusCodeName(StatusCode code);

// A cheap value type: OK, or a code with a message. Thread-compatible.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "NOT_FOUND: node 'n7'".
  std::string ToString() const;

  friend bool operator==(const Status&, const Status&) = default;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status InternalError(std::string message);
Status UnavailableError(std::string message);

// A T or a non-OK Status. Thread-compatible.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  // REQUIRES: !status.ok(); an OK status without a value is turned into kInternal.
  Result(Status status)  // NOLINT(google-explicit-constructor)
      : data_(status.ok() ? Status(StatusCode::kInternal, "result built from an ok status")
                          : std::move(status)) {}

  bool ok() const { return std::holds_alternative<T>(data_); }
  Status status() const { return ok() ? Status() : std::get<Status>(data_); }

  const T& value() const& { return std::get<T>(data_); }
  T& value() & { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace gpufleet

#define GPUFLEET_STATUS_CONCAT_INNER(a, b) a##b
#define GPUFLEET_STATUS_CONCAT(a, b) GPUFLEET_STATUS_CONCAT_INNER(a, b)

#define GPUFLEET_RETURN_IF_ERROR(expr)               \
  do {                                               \
    ::gpufleet::Status gpufleet_status_tmp = (expr); \
    if (!gpufleet_status_tmp.ok())                   \
      return gpufleet_status_tmp;                    \
  } while (false)

#define GPUFLEET_ASSIGN_OR_RETURN(lhs, expr) \
  GPUFLEET_ASSIGN_OR_RETURN_IMPL(GPUFLEET_STATUS_CONCAT(gpufleet_result_, __LINE__), lhs, expr)

#define GPUFLEET_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok())                                       \
    return tmp.status();                               \
  lhs = std::move(tmp).value()
