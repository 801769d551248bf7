#include "savepoint/status.h"

#include <cerrno>
#include <cstring>
#include <string>

namespace savepoint {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kAlreadyExists:
      return "already exists";
    case StatusCode::kCorruption:
      return "corruption";
    case StatusCode::kIOError:
      return "I/O error";
    case StatusCode::kNoSpace:
      return "no space";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kOutOfRange:
      return "out of range";
    case StatusCode::kPermissionDenied:
      return "permission denied";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kInternal:
      return "internal";
    case StatusCode::kDeadlineExceeded:
      return "deadline exceeded";
    case StatusCode::kUnauthenticated:
      return "unauthenticated";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status AlreadyExistsError(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
Status CorruptionError(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
Status NoSpaceError(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
Status UnimplementedError(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
Status FailedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
Status OutOfRangeError(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
Status PermissionDeniedError(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
Status ResourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
Status DeadlineExceededError(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
Status UnauthenticatedError(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }

static StatusCode CodeForErrno(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return StatusCode::kNoSpace;
    case ENOENT:
    case ENOTDIR:
      return StatusCode::kNotFound;
    case EEXIST:
    case ENOTEMPTY:
      return StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case EROFS:
      return StatusCode::kPermissionDenied;
    case EINVAL:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kIOError;
  }
}

Status ErrnoToStatus(int err, std::string_view context) {
  std::string msg(context);
  msg += ": ";
  msg += std::strerror(err);
  return Status(CodeForErrno(err), std::move(msg));
}

}  // namespace savepoint
