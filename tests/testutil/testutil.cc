#include "testutil/testutil.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

namespace savepoint::testing {
namespace {

// spdlog's registry is a function-local static inside libspdlog, which ThreadSanitizer does not
// instrument: its first use from two threads at once (two ranks of a test logging) looks like a
// race to TSan. Creating it here, before main() and any test thread, removes that false report.
[[maybe_unused]] const bool kSpdlogReady = (spdlog::default_logger_raw(), true);

}  // namespace

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = fmt::format("{}/savepoint-test-XXXXXX", base && *base ? base : "/tmp");
  char* p = ::mkdtemp(tmpl.data());
  if (p == nullptr) std::abort();
  path_ = p;
}

TempDir::~TempDir() { DefaultFileSystem()->RemoveAll(path_).IgnoreError(); }

uint64_t TestSeed(std::string_view test_name) {
  const char* env = std::getenv("SAVEPOINT_TEST_SEED");
  uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  std::cout << "[seed] " << test_name << ": SAVEPOINT_TEST_SEED=" << seed << std::endl;
  return seed;
}

void FillPattern(const TensorView& t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::byte* p = t.data();
  uint64_t n = t.nbytes();
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(rng());
}

State RandomState(uint64_t seed, int num_tensors, uint64_t approx_bytes) {
  std::mt19937_64 rng(seed);
  State s;
  auto dtypes = AllDTypes();
  uint64_t per = num_tensors > 0 ? approx_bytes / num_tensors : 0;
  for (int i = 0; i < num_tensors; ++i) {
    DType dt = dtypes[rng() % dtypes.size()];
    int64_t elems = static_cast<int64_t>(per / DTypeSize(dt)) + static_cast<int64_t>(rng() % 7);
    Shape shape;
    switch (rng() % 3) {
      case 0:
        shape = {elems};
        break;
      case 1:
        shape = {std::max<int64_t>(elems / 4, 0), 4};
        break;
      default:
        shape = {2, std::max<int64_t>(elems / 6, 0), 3};
        break;
    }
    Tensor t = Tensor::Empty(dt, shape).value();
    FillPattern(t.view(), rng());
    s.Put(fmt::format("model.layer{}.w{}", i, rng() % 1000), std::move(t)).IgnoreError();
  }
  s.PutValue("step", static_cast<int64_t>(seed % 100000)).IgnoreError();
  s.PutValue("lr", 0.001 * static_cast<double>(rng() % 100)).IgnoreError();
  s.PutValue("flag", (rng() & 1) == 1).IgnoreError();
  s.PutValue("note", fmt::format("seed {}", seed)).IgnoreError();
  s.PutValue("rng", Bytes{{1, 2, 3, static_cast<uint8_t>(rng())}}).IgnoreError();
  s.PutValue("config", Value::FromJson(Json{{"layers", num_tensors}, {"seed", seed}}))
      .IgnoreError();
  s.metadata() = Json{{"run", "test"}, {"seed", seed}};
  return s;
}

State CrashState(uint64_t step) {
  State s = RandomState(step, 8, 2 << 20);
  Tensor sparse = Tensor::Zeros(DType::kF32, {256 << 10}).value();
  auto* f = reinterpret_cast<float*>(sparse.data());
  for (int64_t i = static_cast<int64_t>(step % 97); i < sparse.shape()[0]; i += 97) {
    f[i] = static_cast<float>(step);
  }
  s.Put("opt.sparse", std::move(sparse)).IgnoreError();
  return s;
}

State CkptCrashState(uint64_t step) {
  State all = CrashState(step), out;
  for (const auto& [name, e] : all.entries()) {
    if (!e.is_tensor()) {
      out.PutValue(name, e.value()).IgnoreError();
      continue;
    }
    const DType d = e.tensor().dtype();
    if (d == DType::kF8E4M3 || d == DType::kF8E5M2 || d == DType::kC64 || d == DType::kC128) {
      continue;
    }
    out.Put(name, Tensor::CopyOf(e.tensor()).value()).IgnoreError();
  }
  return out;
}

::testing::AssertionResult StatesEqual(const State& a, const State& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  for (const auto& [name, ea] : a.entries()) {
    const State::Entry* eb = b.Find(name);
    if (eb == nullptr) return ::testing::AssertionFailure() << "missing " << name;
    if (ea.is_tensor() != eb->is_tensor())
      return ::testing::AssertionFailure() << "kind of " << name;
    if (!ea.is_tensor()) {
      if (!(ea.value() == eb->value())) return ::testing::AssertionFailure() << "value " << name;
      continue;
    }
    const TensorView& x = ea.tensor();
    const TensorView& y = eb->tensor();
    if (x.dtype() != y.dtype() || x.shape() != y.shape()) {
      return ::testing::AssertionFailure() << "dtype/shape of " << name;
    }
    if (x.nbytes() > 0 && std::memcmp(x.data(), y.data(), x.nbytes()) != 0) {
      return ::testing::AssertionFailure() << "bytes of " << name;
    }
  }
  if (a.metadata() != b.metadata()) return ::testing::AssertionFailure() << "metadata differs";
  return ::testing::AssertionSuccess();
}

Result<std::unique_ptr<WritableFile>> MemObjectStore::NewWritableFile(const std::string& path,
                                                                      const FileOptions& options) {
  SP_RETURN_IF_ERROR(base()->CreateDirs(Dirname(path)));
  return base()->NewWritableFile(path, options);
}

std::string MemObjectStore::VersionOf(const std::string& path) {
  if (!base()->Exists(path)) return "";
  auto it = versions_.find(path);
  return it == versions_.end() ? "\"unversioned\"" : fmt::format("\"{}\"", it->second);
}

Result<VersionedFile> MemObjectStore::ReadVersioned(const std::string& path, uint64_t max_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  SP_ASSIGN_OR_RETURN(std::string contents, base()->ReadFile(path, max_bytes));
  return VersionedFile{std::move(contents), VersionOf(path)};
}

Result<std::string> MemObjectStore::WriteIfVersion(const std::string& path,
                                                   std::string_view contents,
                                                   const std::string& version) {
  std::lock_guard<std::mutex> lock(mu_);
  if (VersionOf(path) != version) {
    return FailedPreconditionError(fmt::format("{} changed since it was read", path));
  }
  SP_RETURN_IF_ERROR(base()->CreateDirs(Dirname(path)));
  SP_RETURN_IF_ERROR(base()->WriteFileSynced(path, contents));
  versions_[path] = next_version_++;
  return VersionOf(path);
}

}  // namespace savepoint::testing
