// Helpers shared by the subcommands of the `savepoint` tool: exit codes, error reporting,
// human-readable formatting and plain-text tables.
#ifndef SAVEPOINT_TOOLS_COMMON_H_
#define SAVEPOINT_TOOLS_COMMON_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/status.h"
#include "savepoint/value.h"

namespace savepoint::cli {

// Process exit codes (stable; documented in docs/CLI.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,          // any error without a more specific code
  kExitCorruption = 2,     // StatusCode::kCorruption
  kExitNotFound = 3,       // StatusCode::kNotFound
  kExitUnimplemented = 4,  // StatusCode::kUnimplemented
  kExitUsage = 64,         // bad command line (unknown subcommand or option, missing argument)
};

// The exit code for a failed call; kExitOk for an OK status.
int ExitCodeFor(const Status& status);

// Prints "savepoint: <command>: <message>" to stderr.
void PrintError(std::string_view command, std::string_view message);

// Prints `status` (Status::ToString()) as PrintError does and returns ExitCodeFor(status).
int Fail(std::string_view command, const Status& status);

// Runs `body`, turning any exception that escapes it into an error message and kExitError.
int RunGuarded(std::string_view command, const std::function<int()>& body);

// Prints `json` compactly on one line to stdout. Invalid UTF-8 is replaced, never thrown on.
void PrintJson(const Json& json);

// `json` as compact one-line text (invalid UTF-8 replaced by U+FFFD).
std::string CompactJson(const Json& json);

// "0 B", "24 B", "1.5 KiB", "2.0 MiB", ... (binary units, one decimal above bytes).
std::string HumanBytes(uint64_t bytes);

// `s` cut to at most `max_bytes` bytes (at a UTF-8 character boundary) plus "...", or `s` itself
// when it is no longer.
std::string Abbreviate(std::string_view s, size_t max_bytes);

// "2024-11-22T03:22:01Z": nanoseconds since the Unix epoch as ISO-8601 UTC, whole seconds.
std::string IsoTimeUtc(int64_t unix_ns);

// A plain-text table: columns separated by two spaces, the last column not padded.
class Table {
 public:
  // `right_align[i]` right-aligns column i (numbers); missing entries mean left-aligned.
  explicit Table(std::vector<std::string> header, std::vector<bool> right_align = {});
  void AddRow(std::vector<std::string> row);
  void Print(std::FILE* out) const;

 private:
  std::string FormatRow(const std::vector<std::string>& row,
                        const std::vector<size_t>& widths) const;
  std::vector<std::vector<std::string>> rows_;  // rows_[0] is the header
  std::vector<bool> right_align_;
};

}  // namespace savepoint::cli

#endif  // SAVEPOINT_TOOLS_COMMON_H_
