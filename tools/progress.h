// The progress line of long subcommands (verify, convert, merge): one line on stderr, rewritten in
// place ("\r"), e.g. "verify: 3.2 GiB / 10.0 GiB (32%)", ended with a newline. Shown only when
// stderr is a terminal and the output is not --json, and only once an operation is still running
// after its first progress report (the library's first report comes 100 ms in), so quick
// operations print nothing.
#ifndef SAVEPOINT_TOOLS_PROGRESS_H_
#define SAVEPOINT_TOOLS_PROGRESS_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "savepoint/checkpoint.h"

namespace savepoint::cli {

class ProgressLine {
 public:
  // `command` prefixes the line. Enabled when `json` is false and stderr is a terminal.
  ProgressLine(std::string_view command, bool json);
  ~ProgressLine() { End(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool enabled() const { return enabled_; }

  // A callback for a library option's `progress` field, drawing "<command>: <phase> done / total
  // (P%)" (`phase` may be empty); an empty function when disabled. It refers to this object.
  ProgressFn Phase(std::string phase);

  // Draws the line for `done` of `total` bytes. Thread-safe.
  void Update(std::string_view phase, uint64_t done, uint64_t total);

  // Ends a drawn line with a newline (call before printing anything else). Thread-safe.
  void End();

 private:
  std::mutex mu_;
  std::string command_;
  bool enabled_ = false;
  bool drawn_ = false;  // a line is on screen, not yet ended
  size_t width_ = 0;    // characters of the line on screen
};

}  // namespace savepoint::cli

#endif  // SAVEPOINT_TOOLS_PROGRESS_H_
