// `savepoint verify FILE.safetensors`: a safetensors file has no checksums, so verifying it means
// validating its header as untrusted input (InspectSafetensors: lengths, dtypes, shapes, offsets
// tiling the data buffer up to the end of the file, ...) and reading every tensor byte back, in
// 8 MiB pieces on several threads. cmd_verify.cc hands a path that is a file over to this one and
// prints the report.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "savepoint/savepoint.h"

namespace savepoint::cli {
namespace {

constexpr uint64_t kPieceBytes = uint64_t{8} << 20;
constexpr auto kProgressInterval = std::chrono::milliseconds(100);

// The data buffer of one file, read piece by piece by several threads.
class DataReader {
 public:
  DataReader(const SafetensorsInfo& info, const RandomAccessFile& file)
      : info_(info),
        file_(file),
        bytes_(info.file_bytes - info.data_offset),
        pieces_((bytes_ + kPieceBytes - 1) / kPieceBytes) {}

  // Reads everything on `threads` threads, calling `progress` about every 100 ms from this thread
  // and with done == total at the end. Returns the first error (lowest piece).
  Status Run(int threads, const ProgressFn& progress) {
    threads = static_cast<int>(std::clamp<uint64_t>(pieces_, 1, threads));
    running_ = threads;
    std::vector<std::thread> workers;
    try {
      for (int i = 0; i < threads; ++i) workers.emplace_back([this] { Work(); });
    } catch (...) {  // no thread: stop those that started (RunGuarded reports the exception)
      failed_.store(true);
      for (std::thread& w : workers) w.join();
      throw;
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, kProgressInterval, [this] { return running_ == 0; })) {
        if (progress) progress(done_.load(), bytes_);
      }
    }
    for (std::thread& w : workers) w.join();
    if (error_.ok() && progress) progress(bytes_, bytes_);
    return error_;
  }

  uint64_t done() const { return done_.load(); }

 private:
  void Work() {
    std::vector<std::byte> buf(std::min(kPieceBytes, bytes_));
    for (uint64_t i = next_.fetch_add(1); i < pieces_ && !failed_.load(); i = next_.fetch_add(1)) {
      const uint64_t at = i * kPieceBytes, n = std::min(kPieceBytes, bytes_ - at);
      Status s = file_.ReadAt(info_.data_offset + at, {buf.data(), static_cast<size_t>(n)});
      if (!s.ok()) {
        Failed(i, Explain(at, n, s));
        break;
      }
      done_.fetch_add(n);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (--running_ == 0) cv_.notify_all();
  }

  void Failed(uint64_t piece, Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_.store(true);
    if (piece < error_piece_) {
      error_piece_ = piece;
      error_ = std::move(s);
    }
  }

  // The error of reading `n` bytes at data-buffer offset `at`, naming the file, the bytes and the
  // tensor they start in. A read past the end means that the file shrank after its header was
  // checked: corruption, as for a truncated checkpoint.
  Status Explain(uint64_t at, uint64_t n, const Status& s) const {
    std::string where = fmt::format("safetensors file {}: reading bytes [{}, {})", info_.path,
                                    info_.data_offset + at, info_.data_offset + at + n);
    for (const SafetensorsTensorInfo& t : info_.tensors) {
      if (t.begin <= at && at < t.end) where += fmt::format(" (from tensor {:?} on)", t.name);
    }
    if (s.code() == StatusCode::kOutOfRange) return CorruptionError(where + ": " + s.message());
    return s.WithContext(where);
  }

  const SafetensorsInfo& info_;
  const RandomAccessFile& file_;
  const uint64_t bytes_;   // of the data buffer: all tensor bytes
  const uint64_t pieces_;  // of kPieceBytes (the last one shorter)
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> done_{0};
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;                    // guarded by mu_
  Status error_;                       // guarded by mu_
  uint64_t error_piece_ = UINT64_MAX;  // guarded by mu_
};

// Opens the file and checks that it still has the size its header was checked against.
Result<std::unique_ptr<RandomAccessFile>> OpenChecked(const SafetensorsInfo& info) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                      DefaultFileSystem()->NewRandomAccessFile(info.path, FileOptions{}));
  if (file->size() != info.file_bytes) {
    return CorruptionError(
        fmt::format("safetensors file {}: changed size while being verified ({} "
                    "bytes, then {})",
                    info.path, info.file_bytes, file->size()));
  }
  return file;
}

}  // namespace

VerifyReport VerifySafetensorsFile(const std::string& path, int threads,
                                   const ProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  VerifyReport out;
  out.path = path;
  out.format = "safetensors";
  out.checksums = false;
  Result<SafetensorsInfo> info = InspectSafetensors(path);
  if (!info.ok()) {
    out.status = info.status();
    return out;
  }
  out.tensors = info->tensors.size();
  Result<std::unique_ptr<RandomAccessFile>> file = OpenChecked(*info);
  if (!file.ok()) {
    out.status = file.status();
  } else {
    DataReader reader(*info, **file);
    out.status = reader.Run(threads, progress);
    out.stats.bytes = out.stats.stored_bytes = reader.done();
  }
  out.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace savepoint::cli
