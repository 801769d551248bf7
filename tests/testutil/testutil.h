// Shared test fixtures: temporary directories, seeded random states, state comparison.
#ifndef SAVEPOINT_TESTS_TESTUTIL_TESTUTIL_H_
#define SAVEPOINT_TESTS_TESTUTIL_TESTUTIL_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <ostream>
#include <random>
#include <string>

#include "savepoint/savepoint.h"

namespace savepoint {

// How gtest prints a Status, a StatusCode or a Result in assertion messages (found by
// argument-dependent lookup).
inline void PrintTo(const Status& s, std::ostream* os) { *os << s.ToString(); }
inline void PrintTo(StatusCode code, std::ostream* os) { *os << StatusCodeName(code); }
template <typename T>
void PrintTo(const Result<T>& r, std::ostream* os) {
  *os << (r.ok() ? std::string("OK (a value)") : r.status().ToString());
}

}  // namespace savepoint

namespace savepoint::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(std::string_view name) const { return JoinPath(path_, name); }

 private:
  std::string path_;
};

// A seed for a randomised test: $SAVEPOINT_TEST_SEED if set, else random. Printed to stdout so a
// failure can be replayed.
uint64_t TestSeed(std::string_view test_name);

// Fills a tensor's bytes deterministically from `seed`.
void FillPattern(const TensorView& t, uint64_t seed);

// A state with `num_tensors` tensors of random dtypes/shapes (total about `approx_bytes`), a few
// values of every kind and some metadata, all derived from `seed`.
State RandomState(uint64_t seed, int num_tensors, uint64_t approx_bytes);

// What crash_saver saves as step `step` (and crash_test expects): RandomState(step, 8, 2 MiB),
// whose random bytes do not compress, plus a mostly-zero f32 tensor "opt.sparse" (1 MiB), which
// does.
State CrashState(uint64_t step);
// CrashState(step) without the tensors a MindSpore .ckpt file cannot hold (F8, C64, C128).
State CkptCrashState(uint64_t step);

// A file system over `base` (an in-memory one, typically) that behaves as an object store does
// where savepoint can tell: IsObjectStore is true and a file is created without its directory (a
// key prefix needs no creating). As S3FileSystem, listing a prefix that holds nothing is NotFound.
class MemObjectStore : public ForwardingFileSystem {
 public:
  explicit MemObjectStore(FileSystem* base) : ForwardingFileSystem(base) {}
  bool IsObjectStore(const std::string&) override { return true; }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override;
  // Compare-and-swap with a per-path counter as the version (the ETag of a real store).
  Result<VersionedFile> ReadVersioned(const std::string& path, uint64_t max_bytes) override;
  Result<std::string> WriteIfVersion(const std::string& path, std::string_view contents,
                                     const std::string& version) override;

 private:
  // The version of `path` now ("" if absent). Needs mu_.
  std::string VersionOf(const std::string& path);

  std::mutex mu_;
  std::map<std::string, uint64_t> versions_;
  uint64_t next_version_ = 1;
};

// Asserts that two states hold the same names, dtypes, shapes, bytes, values and metadata.
::testing::AssertionResult StatesEqual(const State& a, const State& b);

// The Status of a Status or of a Result<T>, for StatusIs.
inline Status StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const Result<T>& r) {
  return r.status();
}

// Matches a Status (or a Result's status) whose code is `code` and, in the two-argument form,
// whose message contains `substring`. On a mismatch gtest prints the whole status.
//   EXPECT_THAT(Load(path), StatusIs(StatusCode::kCorruption, "chunk 3"));
MATCHER_P(StatusIs, code, "") {
  const Status s = ::savepoint::testing::StatusOf(arg);
  *result_listener << "status " << s.ToString();
  return s.code() == code;
}
MATCHER_P2(StatusIs, code, substring, "") {
  const Status s = ::savepoint::testing::StatusOf(arg);
  *result_listener << "status " << s.ToString();
  return s.code() == code && s.message().find(substring) != std::string::npos;
}

}  // namespace savepoint::testing

#define SP_ASSERT_OK(expr)                                          \
  do {                                                              \
    ::savepoint::Status sp_s_ = (expr);                             \
    ASSERT_TRUE(sp_s_.ok()) << #expr << " -> " << sp_s_.ToString(); \
  } while (0)
#define SP_EXPECT_OK(expr)                                          \
  do {                                                              \
    ::savepoint::Status sp_s_ = (expr);                             \
    EXPECT_TRUE(sp_s_.ok()) << #expr << " -> " << sp_s_.ToString(); \
  } while (0)
// `lhs = value of expr` (a Result), or a fatal failure naming the error.
#define SP_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  SP_ASSERT_OK_AND_ASSIGN_IMPL_(SP_TEST_CONCAT_(sp_r_, __LINE__), lhs, expr)
#define SP_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)                  \
  auto tmp = (expr);                                                   \
  ASSERT_TRUE(tmp.ok()) << #expr << " -> " << tmp.status().ToString(); \
  lhs = std::move(*tmp)
#define SP_TEST_CONCAT_(a, b) SP_TEST_CONCAT2_(a, b)
#define SP_TEST_CONCAT2_(a, b) a##b

#endif  // SAVEPOINT_TESTS_TESTUTIL_TESTUTIL_H_
