// Library logging (spdlog). savepoint logs at debug level which I/O path each file uses (O_DIRECT
// or buffered) and at warn level anything it recovered from. Default level: warn, or the value of
// the environment variable SAVEPOINT_LOG_LEVEL (trace, debug, info, warn, error, off) when set.
//
// Thread safety: SetLogLevel may be called at any time from any thread.
#ifndef SAVEPOINT_LOGGING_H_
#define SAVEPOINT_LOGGING_H_

#include <string_view>

#include "savepoint/export.h"
#include "savepoint/status.h"

namespace savepoint {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

SAVEPOINT_API void SetLogLevel(LogLevel level);
// Parses "trace", "debug", "info", "warn", "error" or "off".
SAVEPOINT_API Result<LogLevel> ParseLogLevel(std::string_view name);

}  // namespace savepoint

#endif  // SAVEPOINT_LOGGING_H_
