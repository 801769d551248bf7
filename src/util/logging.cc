#include "savepoint/logging.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

namespace savepoint {
namespace {

spdlog::level::level_enum ToSpd(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::warn;
}

// Applies SAVEPOINT_LOG_LEVEL (or warn) when the library is loaded.
struct EnvLevel {
  EnvLevel() {
    const char* env = std::getenv("SAVEPOINT_LOG_LEVEL");
    Result<LogLevel> l = ParseLogLevel(env != nullptr ? env : "warn");
    SetLogLevel(l.ok() ? *l : LogLevel::kWarn);
  }
};
const EnvLevel kEnvLevel;

}  // namespace

void SetLogLevel(LogLevel level) { spdlog::set_level(ToSpd(level)); }

Result<LogLevel> ParseLogLevel(std::string_view name) {
  static constexpr std::pair<std::string_view, LogLevel> kNames[] = {
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}, {"off", LogLevel::kOff}};
  for (const auto& [n, l] : kNames) {
    if (n == name) return l;
  }
  return InvalidArgumentError("unknown log level \"" + std::string(name) +
                              "\" (trace, debug, info, warn, error, off)");
}

}  // namespace savepoint
