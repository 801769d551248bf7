// Status and Result<T>: how every public savepoint call reports failure.
//
// No exception crosses the public API. A call that can fail returns `Status` (no value) or
// `Result<T>` (a value or a non-OK Status). Both are [[nodiscard]]. Messages carry context:
// which checkpoint, which file, which tensor, which chunk, which byte offset.
//
// Thread safety: Status and Result are plain values; distinct objects may be used from distinct
// threads freely.
#ifndef SAVEPOINT_STATUS_H_
#define SAVEPOINT_STATUS_H_

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "savepoint/export.h"

namespace savepoint {

// Error categories. Stable: the CLI maps them to exit codes and Python to exception types.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,     // bad option, bad name, bad shape: the caller's fault
  kNotFound = 2,            // path or tensor does not exist
  kAlreadyExists = 3,       // target checkpoint exists and overwrite was not requested
  kCorruption = 4,          // on-disk data fails a checksum or a structural check
  kIOError = 5,             // the operating system reported an I/O failure (EIO, ...)
  kNoSpace = 6,             // ENOSPC / EDQUOT
  kUnimplemented = 7,       // feature or format version this build does not support
  kFailedPrecondition = 8,  // state does not allow the call (e.g. file already closed)
  kOutOfRange = 9,          // a read past the end of a file or buffer
  kPermissionDenied = 10,   // EACCES / EPERM / EROFS
  kResourceExhausted = 11,  // a size cap was exceeded
  kInternal = 12,           // a bug in savepoint
  kDeadlineExceeded = 13,   // a collective operation (Communicator) timed out
  kUnauthenticated = 14,    // encrypted data failed to decrypt: wrong key, or it was modified
};

// The highest StatusCode (codes read from the wire above it are treated as kInternal).
inline constexpr StatusCode kLastStatusCode = StatusCode::kUnauthenticated;

// Stable lower-case name of a code, e.g. "corruption".
SAVEPOINT_API std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] SAVEPOINT_API Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "corruption: <message>", or "ok".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>". OK stays OK.
  Status WithContext(std::string_view context) const;

  // Explicitly drops an error (documents intent at the call site).
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Factories, one per code.
SAVEPOINT_API Status InvalidArgumentError(std::string message);
SAVEPOINT_API Status NotFoundError(std::string message);
SAVEPOINT_API Status AlreadyExistsError(std::string message);
SAVEPOINT_API Status CorruptionError(std::string message);
SAVEPOINT_API Status IOError(std::string message);
SAVEPOINT_API Status NoSpaceError(std::string message);
SAVEPOINT_API Status UnimplementedError(std::string message);
SAVEPOINT_API Status FailedPreconditionError(std::string message);
SAVEPOINT_API Status OutOfRangeError(std::string message);
SAVEPOINT_API Status PermissionDeniedError(std::string message);
SAVEPOINT_API Status ResourceExhaustedError(std::string message);
SAVEPOINT_API Status InternalError(std::string message);
SAVEPOINT_API Status DeadlineExceededError(std::string message);
SAVEPOINT_API Status UnauthenticatedError(std::string message);

// Maps an errno value to a Status: "<context>: <strerror(err)>" with the matching code.
SAVEPOINT_API Status ErrnoToStatus(int err, std::string_view context);

// A value of type T or an error. Accessing the value of an error Result aborts.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from OK");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  // Moves the value out (by value, so `for (auto& x : f().value())` does not dangle).
  T value() && { return std::get<T>(std::move(v_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace savepoint

#define SP_STATUS_CONCAT_INNER_(a, b) a##b
#define SP_STATUS_CONCAT_(a, b) SP_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define SP_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::savepoint::Status sp_status_ = (expr); \
    if (!sp_status_.ok()) return sp_status_; \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its error from the enclosing function.
#define SP_ASSIGN_OR_RETURN(lhs, expr) \
  SP_ASSIGN_OR_RETURN_IMPL_(SP_STATUS_CONCAT_(sp_result_, __LINE__), lhs, expr)
#define SP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // SAVEPOINT_STATUS_H_
