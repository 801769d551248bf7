// Batched I/O (WriteAtMany / ReadAtMany) of the POSIX file system with both backends, io_uring and
// pwrite/pread: identical files, short transfers, errors with their messages, many threads at
// once; and the backend selection (FileOptions::io_backend, SAVEPOINT_IO_BACKEND, detection).
#include "io/uring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "savepoint/filesystem.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using savepoint::testing::TempDir;

// The backends a batch can take on this machine: pwrite always, io_uring where it works.
std::vector<IoBackend> Backends() {
  std::vector<IoBackend> b = {IoBackend::kPwrite};
  if (ProbeUring().available) b.push_back(IoBackend::kUring);
  return b;
}

// 4 KiB-aligned heap memory (for O_DIRECT), filled from `seed`.
struct AlignedBuf {
  explicit AlignedBuf(size_t n, uint32_t seed = 0)
      : p(static_cast<std::byte*>(std::aligned_alloc(kDirectIOAlignment, n))), size(n) {
    std::mt19937 rng(seed);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(rng());
  }
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  std::span<std::byte> span(size_t off, size_t n) const { return {p + off, n}; }
  std::byte* p;
  size_t size;
};

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `n` ops covering [0, n * op_bytes) of `src`, in a shuffled order.
std::vector<WriteOp> ShuffledOps(const AlignedBuf& src, size_t n, size_t op_bytes, uint32_t seed) {
  std::vector<WriteOp> ops;
  for (size_t i = 0; i < n; ++i) ops.push_back({i * op_bytes, src.span(i * op_bytes, op_bytes)});
  std::shuffle(ops.begin(), ops.end(), std::mt19937(seed));
  return ops;
}

std::unique_ptr<WritableFile> OpenForWrite(const std::string& path, bool direct,
                                           IoBackend backend) {
  FileOptions o;
  o.direct_io = direct;
  o.io_backend = backend;
  Result<std::unique_ptr<WritableFile>> f = DefaultFileSystem()->NewWritableFile(path, o);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(f).value() : nullptr;
}

std::unique_ptr<RandomAccessFile> OpenForRead(const std::string& path, bool direct,
                                              IoBackend backend) {
  FileOptions o;
  o.direct_io = direct;
  o.io_backend = backend;
  Result<std::unique_ptr<RandomAccessFile>> f = DefaultFileSystem()->NewRandomAccessFile(path, o);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(f).value() : nullptr;
}

TEST(IoBackend, ParseNames) {
  EXPECT_EQ(*ParseIoBackend("auto"), IoBackend::kAuto);
  EXPECT_EQ(*ParseIoBackend("uring"), IoBackend::kUring);
  EXPECT_EQ(*ParseIoBackend("io_uring"), IoBackend::kUring);
  EXPECT_EQ(*ParseIoBackend("pwrite"), IoBackend::kPwrite);
  Result<IoBackend> bad = ParseIoBackend("aio");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "\"aio\""));
  EXPECT_STREQ(IoBackendName(IoBackend::kUring), "uring");
}

TEST(IoBackend, ResolutionOrder) {
  const IoBackend detected = ProbeUring().available ? IoBackend::kUring : IoBackend::kPwrite;
  if (!ProbeUring().available) {
    EXPECT_NE(ProbeUring().reason.find("io_uring_queue_init"), std::string::npos);
  }
  EXPECT_EQ(ResolveIoBackend(IoBackend::kAuto, nullptr), detected);
  EXPECT_EQ(ResolveIoBackend(IoBackend::kAuto, "auto"), detected);
  EXPECT_EQ(ResolveIoBackend(IoBackend::kAuto, "pwrite"), IoBackend::kPwrite);
  EXPECT_EQ(ResolveIoBackend(IoBackend::kAuto, "uring"), detected);  // falls back if unavailable
  EXPECT_EQ(ResolveIoBackend(IoBackend::kAuto, "bogus"), detected);  // ignored with a warning
  EXPECT_EQ(ResolveIoBackend(IoBackend::kPwrite, "uring"), IoBackend::kPwrite);  // option wins
  EXPECT_EQ(ResolveIoBackend(IoBackend::kUring, "pwrite"), detected);
}

TEST(IoBackend, OpenedFilesReportTheirBackend) {
  TempDir dir;
  for (IoBackend b : Backends()) {
    auto w = OpenForWrite(dir.Sub("f"), false, b);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->io_backend(), b);
    auto r = OpenForRead(dir.Sub("f"), false, b);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->io_backend(), b);
  }
}

// Writes 40 ops (more than the queue depth) in shuffled order with each backend, buffered and
// direct: every file must equal the source, and reading it back in one batch (with either
// backend) must give the source again.
TEST(UringBatch, BothBackendsWriteIdenticalFiles) {
  TempDir dir;
  constexpr size_t kOps = 40, kOpBytes = 3 * kDirectIOAlignment;
  const AlignedBuf src(kOps * kOpBytes, 7);
  const std::string want(reinterpret_cast<const char*>(src.p), src.size);
  for (bool direct : {false, true}) {
    for (IoBackend b : Backends()) {
      SCOPED_TRACE(std::string(IoBackendName(b)) + (direct ? " direct" : " buffered"));
      const std::string path = dir.Sub(std::string("f-") + IoBackendName(b));
      auto w = OpenForWrite(path, direct, b);
      ASSERT_NE(w, nullptr);
      const std::vector<WriteOp> ops = ShuffledOps(src, kOps, kOpBytes, 11);
      SP_ASSERT_OK(w->WriteAtMany(ops));
      SP_ASSERT_OK(w->WriteAtMany({}));  // an empty batch does nothing
      SP_ASSERT_OK(w->Sync());
      SP_ASSERT_OK(w->Close());
      EXPECT_TRUE(ReadWhole(path) == want);
      for (IoBackend rb : Backends()) {
        auto r = OpenForRead(path, direct, rb);
        ASSERT_NE(r, nullptr);
        AlignedBuf dst(src.size);
        std::vector<ReadOp> reads;
        for (const WriteOp& op : ops) reads.push_back({op.offset, dst.span(op.offset, kOpBytes)});
        SP_ASSERT_OK(r->ReadAtMany(reads));
        EXPECT_TRUE(std::equal(src.p, src.p + src.size, dst.p));
      }
    }
  }
}

// A read spanning end of file transfers the bytes before it (a short transfer that is resumed)
// and then fails with OutOfRange naming the file, the op and where the file ends.
TEST(UringBatch, ReadPastEndOfFileIsOutOfRange) {
  TempDir dir;
  const std::string path = dir.Sub("short");
  const AlignedBuf src(4 * kDirectIOAlignment, 3);
  {
    auto w = OpenForWrite(path, false, IoBackend::kPwrite);
    ASSERT_NE(w, nullptr);
    SP_ASSERT_OK(w->WriteAt(0, src.span(0, kDirectIOAlignment + 100)));
    SP_ASSERT_OK(w->Close());
  }
  for (bool direct : {false, true}) {
    for (IoBackend b : Backends()) {
      SCOPED_TRACE(std::string(IoBackendName(b)) + (direct ? " direct" : " buffered"));
      auto r = OpenForRead(path, direct, b);
      ASSERT_NE(r, nullptr);
      AlignedBuf dst(4 * kDirectIOAlignment);
      const std::vector<ReadOp> ops = {{0, dst.span(0, kDirectIOAlignment)},
                                       {kDirectIOAlignment, dst.span(kDirectIOAlignment, 8192)}};
      Status s = r->ReadAtMany(ops);
      EXPECT_THAT(s, StatusIs(StatusCode::kOutOfRange));
      EXPECT_EQ(s.message(), "read " + path +
                                 " at offset 4096 (8192 bytes): past end of file, which ends at "
                                 "byte 4196");
      EXPECT_TRUE(std::equal(src.p, src.p + kDirectIOAlignment + 100, dst.p));
    }
  }
}

// With RLIMIT_FSIZE below the end of a write, the kernel writes up to the limit (a short write,
// which the batch resumes) and then refuses the rest with EFBIG: the error names file and offset.
TEST(UringBatch, ShortWriteIsResumedThenErrorNamesOffset) {
  TempDir dir;
  const AlignedBuf src(64 * 1024, 5);
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old), 0);
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  for (IoBackend b : Backends()) {
    SCOPED_TRACE(IoBackendName(b));
    const std::string path = dir.Sub(std::string("fsize-") + IoBackendName(b));
    auto w = OpenForWrite(path, false, b);
    ASSERT_NE(w, nullptr);
    struct rlimit limit = saved;
    limit.rlim_cur = 10000;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
    const std::vector<WriteOp> ops = {{0, src.span(0, 8192)}, {8192, src.span(8192, 8192)}};
    Status s = w->WriteAtMany(ops);
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message(), "write " + path + " at offset 10000: File too large") << s.ToString();
    const std::string got = ReadWhole(path);
    ASSERT_EQ(got.size(), 10000u);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), reinterpret_cast<const char*>(src.p)));
  }
  ASSERT_EQ(::sigaction(SIGXFSZ, &old, nullptr), 0);
}

// Errors reported by completions carry errno's meaning, the file and the offset.
TEST(UringBatch, CompletionErrorsNameFileAndOffset) {
  if (!UringThreadAvailable()) {
    // Without io_uring the batch never reaches a ring; the pwrite path is covered above.
    EXPECT_FALSE(ProbeUring().reason.empty());
    return;
  }
  TempDir dir;
  const std::string path = dir.Sub("ro");
  ASSERT_TRUE(DefaultFileSystem()->WriteFileSynced(path, std::string(8192, 'x')).ok());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const AlignedBuf src(8192, 1);
  const std::vector<WriteOp> writes = {{0, src.span(0, 4096)}, {4096, src.span(4096, 4096)}};
  Status s = UringWriteMany(fd, path, writes);  // a read-only fd
  EXPECT_THAT(s, StatusIs(StatusCode::kIOError));
  EXPECT_TRUE(s.message() == "write " + path + " at offset 0: Bad file descriptor" ||
              s.message() == "write " + path + " at offset 4096: Bad file descriptor")
      << s.message();
  ::close(fd);
  AlignedBuf dst(4096);
  s = UringReadMany(fd, path, false, std::vector<ReadOp>{{0, dst.span(0, 4096)}});  // closed fd
  EXPECT_EQ(s.message(), "read " + path + " at offset 0: Bad file descriptor") << s.ToString();
  // The ring is still usable after errors.
  auto r = OpenForRead(path, false, IoBackend::kUring);
  ASSERT_NE(r, nullptr);
  SP_EXPECT_OK(r->ReadAtMany(std::vector<ReadOp>{{4096, dst.span(0, 4096)}}));
  EXPECT_EQ(static_cast<char>(dst.p[0]), 'x');
}

// A misaligned op in a direct batch is refused before anything is written.
TEST(UringBatch, DirectBatchChecksAlignmentFirst) {
  TempDir dir;
  const AlignedBuf src(3 * kDirectIOAlignment, 2);
  for (IoBackend b : Backends()) {
    const std::string path = dir.Sub(std::string("align-") + IoBackendName(b));
    auto w = OpenForWrite(path, true, b);
    ASSERT_NE(w, nullptr);
    if (!w->direct()) continue;  // a file system without O_DIRECT has no alignment rule
    const std::vector<WriteOp> ops = {{0, src.span(0, 4096)}, {4096, src.span(4096, 100)}};
    Status s = w->WriteAtMany(ops);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "op 1 of 2"));
    EXPECT_NE(s.message().find(path + " at offset 4096"), std::string::npos) << s.message();
    EXPECT_EQ(ReadWhole(path).size(), 0u);
  }
}

TEST(UringBatch, ClosedFileIsFailedPrecondition) {
  TempDir dir;
  const AlignedBuf src(4096, 2);
  for (IoBackend b : Backends()) {
    auto w = OpenForWrite(dir.Sub("closed"), false, b);
    ASSERT_NE(w, nullptr);
    SP_ASSERT_OK(w->Close());
    Status s = w->WriteAtMany(std::vector<WriteOp>{{0, src.span(0, 4096)}});
    EXPECT_THAT(s, StatusIs(StatusCode::kFailedPrecondition));
  }
}

// Many threads, each with its own ring, write disjoint parts of one file in batches and then read
// it back concurrently (run under TSan by scripts/test).
TEST(UringBatch, ManyThreadsConcurrently) {
  TempDir dir;
  constexpr int kThreads = 8;
  constexpr size_t kOpsPerThread = 12, kOpBytes = 2 * kDirectIOAlignment;
  constexpr size_t kBytes = kThreads * kOpsPerThread * kOpBytes;
  const AlignedBuf src(kBytes, 9);
  for (IoBackend b : Backends()) {
    SCOPED_TRACE(IoBackendName(b));
    const std::string path = dir.Sub(std::string("mt-") + IoBackendName(b));
    auto w = OpenForWrite(path, true, b);
    ASSERT_NE(w, nullptr);
    SP_ASSERT_OK(w->Preallocate(kBytes));
    AlignedBuf dst(kBytes);
    auto r = OpenForRead(path, true, b);
    ASSERT_NE(r, nullptr);
    std::vector<Status> results(2 * kThreads);
    auto run = [&](bool write) {
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t, write] {
          std::vector<WriteOp> wops;
          std::vector<ReadOp> rops;
          for (size_t i = 0; i < kOpsPerThread; ++i) {
            const size_t off = (i * kThreads + t) * kOpBytes;  // interleaved ranges
            wops.push_back({off, src.span(off, kOpBytes)});
            rops.push_back({off, dst.span(off, kOpBytes)});
          }
          results[t + (write ? 0 : kThreads)] = write ? w->WriteAtMany(wops) : r->ReadAtMany(rops);
        });
      }
      for (std::thread& th : threads) th.join();
    };
    run(true);
    SP_ASSERT_OK(w->Sync());
    run(false);
    for (const Status& s : results) SP_EXPECT_OK(s);
    EXPECT_TRUE(std::equal(src.p, src.p + kBytes, dst.p));
  }
}

// A child of fork() inherits the thread's ring (shared queues; a single-issuer ring refuses the
// child's submissions with EEXIST, seen as a flaky "File exists" from a forked trainer's save).
// The child must get a ring of its own: batches in the child and, afterwards, in the parent work.
TEST(UringBatch, ForkedChildGetsItsOwnRing) {
  TempDir dir;
  constexpr size_t kOps = 8, kOpBytes = kDirectIOAlignment;
  const AlignedBuf src(kOps * kOpBytes, 5);
  for (IoBackend b : Backends()) {
    SCOPED_TRACE(IoBackendName(b));
    auto write_and_check = [&](const std::string& path) -> bool {  // one batch each way
      auto w = OpenForWrite(path, true, b);
      if (w == nullptr || !w->WriteAtMany(ShuffledOps(src, kOps, kOpBytes, 3)).ok() ||
          !w->Sync().ok() || !w->Close().ok()) {
        return false;
      }
      auto r = OpenForRead(path, true, b);
      AlignedBuf dst(src.size);
      return r != nullptr && r->ReadAtMany({{ReadOp{0, dst.span(0, src.size)}}}).ok() &&
             std::equal(src.p, src.p + src.size, dst.p);
    };
    ASSERT_TRUE(write_and_check(dir.Sub("parent-before")));  // this thread's ring is open now
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(write_and_check(dir.Sub("child")) ? 0 : 1);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    EXPECT_TRUE(write_and_check(dir.Sub("parent-after")));
  }
}

}  // namespace
}  // namespace savepoint
