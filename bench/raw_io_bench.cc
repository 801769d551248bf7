// raw_io_bench: the disk's ceiling for savepoint's I/O pattern, without savepoint.
//
//   raw_io_bench --file PATH --bytes N [--threads T] [--chunk-mb C] [--fallocate] [--crc]
//                [--buffered] [--uring [--depth D]]
//
// Writes N bytes of xorshift data to a new file the way Save writes a data file: T threads claim
// C-byte chunks in index order and pwrite them with O_DIRECT at their offsets, then one fdatasync.
// Then reads it back the way LoadInto does (T threads, pread with O_DIRECT into a preallocated,
// already-touched buffer) and compares every byte. Nothing else: no header, manifest, directory
// syncs or rename. With --crc each thread also takes the CRC32C (ISA-L) of each chunk before
// writing it and after reading it, as savepoint does. With --fallocate the file is preallocated
// (fallocate(2), mode 0) before the writes, as savepoint's writer does.
// With --uring each thread submits its chunks through its own io_uring instead of pwrite/pread,
// keeping up to D (default 4) of them in flight (a sliding window: a chunk is claimed, checksummed
// and submitted as soon as a slot frees), so T threads keep T x D requests queued instead of T;
// the names get a "-uring" suffix (raw-write-uring, raw-read-uring, ...).
//
// Prints, like save_load_bench:
//   raw-write  bytes=N seconds=S gbps=G user=U sys=Y
//   raw-read   bytes=N seconds=S gbps=G user=U sys=Y
// The file is removed at the end.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <isa-l/crc.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "timer.h"

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct Args {
  std::string file;
  uint64_t bytes = 0;
  int threads = 4;
  uint64_t chunk = 8 * kMiB;
  bool fallocate = false;
  bool crc = false;
  bool direct = true;
  bool uring = false;
  unsigned depth = 4;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "raw_io_bench: %s\n", what.c_str());
  std::exit(1);
}

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr,
               "raw_io_bench: %s\nusage: raw_io_bench --file PATH --bytes N [--threads T] "
               "[--chunk-mb C] [--fallocate] [--crc] [--buffered] [--uring [--depth D]]\n",
               error.c_str());
  std::exit(64);
}

// Parses "123", "4K", "8M", "2G" (binary units).
uint64_t ParseSize(const char* flag, const char* s) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s || *s == '-') Usage(std::string(flag) + ": not a size");
  int shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10;
  if (*end == 'M' || *end == 'm') shift = 20;
  if (*end == 'G' || *end == 'g') shift = 30;
  if (shift > 0) ++end;
  if (*end != '\0') Usage(std::string(flag) + ": not a size");
  return static_cast<uint64_t>(v) << shift;
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Usage(f + " needs a value");
      return argv[++i];
    };
    if (f == "--file") {
      a.file = next();
    } else if (f == "--bytes") {
      a.bytes = ParseSize("--bytes", next());
    } else if (f == "--threads") {
      a.threads = static_cast<int>(ParseSize("--threads", next()));
    } else if (f == "--chunk-mb") {
      a.chunk = ParseSize("--chunk-mb", next()) * kMiB;
    } else if (f == "--fallocate") {
      a.fallocate = true;
    } else if (f == "--crc") {
      a.crc = true;
    } else if (f == "--buffered") {
      a.direct = false;
    } else if (f == "--uring") {
      a.uring = true;
    } else if (f == "--depth") {
      a.depth = static_cast<unsigned>(ParseSize("--depth", next()));
    } else {
      Usage("unknown argument " + f);
    }
  }
  if (a.file.empty()) Usage("--file is required");
  if (a.threads < 1 || a.threads > 64) Usage("--threads must be in [1, 64]");
  if (a.chunk == 0 || a.chunk > 1024 * kMiB) Usage("--chunk-mb must be in [1, 1024]");
  if (a.depth < 1 || a.depth > 256) Usage("--depth must be in [1, 256]");
  if (a.bytes < a.chunk || a.bytes % 4096 != 0)
    Usage("--bytes must be a multiple of 4096, >= one chunk");
  return a;
}

// One line of results: bytes, wall seconds, GB/s and CPU seconds since `t` started.
void Print(const savepoint::bench::Timer& t, const char* name, uint64_t bytes) {
  const double secs = t.seconds();
  auto [user, sys] = t.cpu_seconds();
  std::printf("%-10s bytes=%llu seconds=%.4f gbps=%.3f user=%.3f sys=%.3f\n", name,
              static_cast<unsigned long long>(bytes), secs, static_cast<double>(bytes) / secs / 1e9,
              user, sys);
  std::fflush(stdout);
}

// Runs fn(chunk_index) on `threads` threads, chunks claimed in index order.
template <typename Fn>
void ParallelChunks(uint64_t n, int threads, Fn fn) {
  std::atomic<uint64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (uint64_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

// The --uring variant of ParallelChunks for one transfer direction: each of `threads` threads
// keeps up to `depth` chunks in flight on its own ring. before(i) runs before chunk i is
// submitted (the write-side CRC), after(i) once it completed (the read-side CRC).
template <typename Before, typename After>
void UringChunks(const Args& a, uint64_t n, bool write, int fd, std::byte* buf, Before before,
                 After after) {
  std::atomic<uint64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < a.threads; ++t) {
    pool.emplace_back([&] {
      io_uring ring;
      if (int e = io_uring_queue_init(a.depth, &ring, 0); e < 0)
        Die(std::string("io_uring_queue_init: ") + std::strerror(-e));
      unsigned in_flight = 0;
      bool more = true;
      while (more || in_flight > 0) {
        while (more && in_flight < a.depth) {
          const uint64_t i = next.fetch_add(1);
          if (i >= n) {
            more = false;
            break;
          }
          before(i);
          const uint64_t off = i * a.chunk;
          const unsigned len = static_cast<unsigned>(std::min(a.chunk, a.bytes - off));
          io_uring_sqe* sqe = io_uring_get_sqe(&ring);
          if (write) {
            io_uring_prep_write(sqe, fd, buf + off, len, off);
          } else {
            io_uring_prep_read(sqe, fd, buf + off, len, off);
          }
          io_uring_sqe_set_data64(sqe, i);
          ++in_flight;
        }
        if (in_flight == 0) break;
        io_uring_cqe* cqe = nullptr;
        const int e = io_uring_submit_and_wait(&ring, 1);
        if (e < 0 && e != -EINTR && e != -EAGAIN)
          Die(std::string("io_uring: ") + std::strerror(-e));
        while (io_uring_peek_cqe(&ring, &cqe) == 0) {
          const uint64_t i = io_uring_cqe_get_data64(cqe);
          const uint64_t len = std::min(a.chunk, a.bytes - i * a.chunk);
          if (cqe->res < 0 || static_cast<uint64_t>(cqe->res) != len) {
            Die(a.file + ": io_uring transfer of chunk " + std::to_string(i) + " returned " +
                (cqe->res < 0 ? std::strerror(-cqe->res) : std::to_string(cqe->res)));
          }
          io_uring_cqe_seen(&ring, cqe);
          --in_flight;
          after(i);
        }
      }
      io_uring_queue_exit(&ring);
    });
  }
  for (auto& th : pool) th.join();
}

std::byte* AllocTouched(uint64_t n) {
  void* p = std::aligned_alloc(4096, n);
  if (p == nullptr) Die("out of memory");
  std::memset(p, 0, n);
  return static_cast<std::byte*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  Args a = ParseArgs(argc, argv);
  const uint64_t n = (a.bytes + a.chunk - 1) / a.chunk;
  std::byte* src = AllocTouched(a.bytes);
  ParallelChunks(n, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                 [&](uint64_t i) {
                   uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
                   uint64_t end = std::min(a.bytes, (i + 1) * a.chunk);
                   for (uint64_t p = i * a.chunk; p + 8 <= end; p += 8) {
                     x ^= x << 13;
                     x ^= x >> 7;
                     x ^= x << 17;
                     std::memcpy(src + p, &x, 8);
                   }
                 });
  std::vector<uint32_t> crcs(n);
  std::atomic<uint32_t> sink{0};
  auto crc_of = [&](const std::byte* buf, uint64_t i) {
    uint64_t off = i * a.chunk;
    uint64_t len = std::min(a.chunk, a.bytes - off);
    return crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<std::byte*>(buf + off)),
                       static_cast<int>(len), 0);
  };
  auto write_crc = [&](uint64_t i) {
    if (a.crc) crcs[i] = crc_of(src, i);
  };
  auto io = [&](bool write, int fd, std::byte* buf, uint64_t i) {
    uint64_t off = i * a.chunk;
    uint64_t len = std::min(a.chunk, a.bytes - off);
    if (write) write_crc(i);
    for (uint64_t done = 0; done < len;) {
      ssize_t r = write ? ::pwrite(fd, buf + off + done, len - done, static_cast<off_t>(off + done))
                        : ::pread(fd, buf + off + done, len - done, static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        Die(std::string(write ? "pwrite " : "pread ") + a.file + ": " + std::strerror(errno));
      done += static_cast<uint64_t>(r);
    }
    if (!write && a.crc && crc_of(buf, i) != crcs[i]) sink.fetch_add(1);
  };
  const std::string suffix = a.uring ? "-uring" : "";
  int flags = a.direct ? O_DIRECT : 0;

  ::unlink(a.file.c_str());
  {
    savepoint::bench::Timer t;
    int fd = ::open(a.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | flags, 0644);
    if (fd < 0) Die("open " + a.file + ": " + std::strerror(errno));
    if (a.fallocate && ::fallocate(fd, 0, 0, static_cast<off_t>(a.bytes)) != 0) {
      Die("fallocate " + a.file + ": " + std::strerror(errno));
    }
    if (a.uring) {
      UringChunks(a, n, true, fd, src, write_crc, [](uint64_t) {});
    } else {
      ParallelChunks(n, a.threads, [&](uint64_t i) { io(true, fd, src, i); });
    }
    if (::fdatasync(fd) != 0 || ::close(fd) != 0)
      Die("sync " + a.file + ": " + std::strerror(errno));
    Print(t, ((a.fallocate ? "raw-write-falloc" : "raw-write") + suffix).c_str(), a.bytes);
  }
  std::byte* dst = AllocTouched(a.bytes);
  {
    int fd = ::open(a.file.c_str(), O_RDONLY | O_CLOEXEC | flags);
    if (fd < 0) Die("open " + a.file + ": " + std::strerror(errno));
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    savepoint::bench::Timer t;
    if (a.uring) {
      UringChunks(
          a, n, false, fd, dst, [](uint64_t) {},
          [&](uint64_t i) {
            if (a.crc && crc_of(dst, i) != crcs[i]) sink.fetch_add(1);
          });
    } else {
      ParallelChunks(n, a.threads, [&](uint64_t i) { io(false, fd, dst, i); });
    }
    Print(t, ("raw-read" + suffix).c_str(), a.bytes);
    ::close(fd);
  }
  ::unlink(a.file.c_str());
  if (sink.load() != 0 || std::memcmp(src, dst, a.bytes) != 0)
    Die("read back differs from what was written");
  std::free(src);
  std::free(dst);
  return 0;
}
