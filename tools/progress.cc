// ProgressLine (progress.h).
#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common.h"

namespace savepoint::cli {

ProgressLine::ProgressLine(std::string_view command, bool json)
    : command_(command), enabled_(!json && isatty(STDERR_FILENO) == 1) {}

ProgressFn ProgressLine::Phase(std::string phase) {
  if (!enabled_) return {};
  return [this, phase = std::move(phase)](uint64_t done, uint64_t total) {
    Update(phase, done, total);
  };
}

void ProgressLine::Update(std::string_view phase, uint64_t done, uint64_t total) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  // The first report of an operation that is already over draws nothing: it was quick.
  if (!drawn_ && done >= total) return;
  const int percent = total > 0 ? static_cast<int>(std::min(done, total) * 100 / total) : 100;
  std::string line = fmt::format("{}: {}{}{} / {} ({}%)", command_, phase, phase.empty() ? "" : " ",
                                 HumanBytes(done), HumanBytes(total), percent);
  const size_t width = line.size();
  if (width < width_) line.append(width_ - width, ' ');  // erase the rest of a longer line
  fmt::print(stderr, "\r{}", line);
  std::fflush(stderr);
  drawn_ = true;
  width_ = width;
}

void ProgressLine::End() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!drawn_) return;
  fmt::print(stderr, "\n");
  std::fflush(stderr);
  drawn_ = false;
  width_ = 0;
}

}  // namespace savepoint::cli
