// Helpers shared by the subcommands of the `savepoint` tool.
#include "common.h"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <exception>

namespace savepoint::cli {

int ExitCodeFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kCorruption:
    case StatusCode::kUnauthenticated:  // wrong key or modified encrypted data: fails to verify
      return kExitCorruption;
    case StatusCode::kNotFound:
      return kExitNotFound;
    case StatusCode::kUnimplemented:
      return kExitUnimplemented;
    default:
      return kExitError;
  }
}

void PrintError(std::string_view command, std::string_view message) {
  fmt::print(stderr, "savepoint: {}: {}\n", command, message);
  std::fflush(stderr);
}

int Fail(std::string_view command, const Status& status) {
  PrintError(command, status.ToString());
  return ExitCodeFor(status);
}

int RunGuarded(std::string_view command, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    PrintError(command, fmt::format("internal error: {}", e.what()));
  } catch (...) {
    PrintError(command, "internal error: unknown exception");
  }
  return kExitError;
}

std::string CompactJson(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void PrintJson(const Json& json) {
  fmt::print("{}\n", CompactJson(json));
  std::fflush(stdout);
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", v, kUnits[unit]);
}

std::string Abbreviate(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // a continuation byte
  return std::string(s.substr(0, n)) + "...";
}

std::string IsoTimeUtc(int64_t unix_ns) {
  int64_t secs = unix_ns / 1'000'000'000;
  if (unix_ns % 1'000'000'000 < 0) --secs;  // floor for times before 1970
  time_t t = static_cast<time_t>(secs);
  struct tm tm {};
  if (gmtime_r(&t, &tm) == nullptr) return fmt::format("@{}ns", unix_ns);
  char buf[64];
  size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return n == 0 ? fmt::format("@{}ns", unix_ns) : std::string(buf, n);
}

Table::Table(std::vector<std::string> header, std::vector<bool> right_align)
    : right_align_(std::move(right_align)) {
  rows_.push_back(std::move(header));
}

void Table::AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

std::string Table::FormatRow(const std::vector<std::string>& row,
                             const std::vector<size_t>& widths) const {
  std::string line;
  for (size_t i = 0; i < row.size(); ++i) {
    if (i > 0) line += "  ";
    bool last = i + 1 == row.size();
    bool right = i < right_align_.size() && right_align_[i];
    size_t pad = widths[i] - std::min(widths[i], row[i].size());
    if (right) line.append(pad, ' ');
    line += row[i];
    if (!right && !last) line.append(pad, ' ');
  }
  return line;
}

void Table::Print(std::FILE* out) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows_) fmt::print(out, "{}\n", FormatRow(row, widths));
}

}  // namespace savepoint::cli
