// savepoint_demo: saves and loads a generated ~1 GiB training state (a small transformer's
// weights, Adam moments, RNG state, step counters and metadata).
//
//   savepoint_demo save DIR [--mib N]   writes DIR/step-1000 and prints throughput
//   savepoint_demo load DIR [--mib N]   loads it back, checks every byte, prints throughput
//
// Issue #4 replaces this with a real training loop that is killed and resumed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "savepoint/savepoint.h"

namespace {

using namespace savepoint;

// xorshift fill: deterministic and fast, and not trivially compressible.
void Fill(const TensorView& t, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto* p = t.data();
  uint64_t n = t.nbytes();
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(i);
}

// A GPT-like state of about `mib` MiB: embedding (BF16), per-layer weights (F32) and their
// Adam moments, plus values and metadata.
Result<State> MakeState(uint64_t mib) {
  State s;
  const int64_t d = 1024;
  // ~26 MiB per layer (weights + two Adam moments) after a 16 MiB embedding.
  const int layers = static_cast<int>(std::max<uint64_t>(1, (mib > 16 ? mib - 16 : 0) / 26));
  uint64_t seed = 1;
  auto add = [&](const std::string& name, DType dt, Shape shape) -> Status {
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dt, std::move(shape)));
    Fill(t.view(), seed++);
    return s.Put(name, std::move(t));
  };
  SP_RETURN_IF_ERROR(add("model.embed.weight", DType::kBF16, {8192, d}));
  for (int l = 0; l < layers; ++l) {
    std::string p = "model.layers." + std::to_string(l);
    SP_RETURN_IF_ERROR(add(p + ".attn.qkv.weight", DType::kF32, {3 * d, d / 2}));
    SP_RETURN_IF_ERROR(add(p + ".mlp.fc.weight", DType::kBF16, {4 * d, d}));
    SP_RETURN_IF_ERROR(add(p + ".norm.weight", DType::kF32, {d}));
    SP_RETURN_IF_ERROR(add("optimizer.state." + p + ".exp_avg", DType::kF32, {3 * d, d / 2}));
    SP_RETURN_IF_ERROR(add("optimizer.state." + p + ".exp_avg_sq", DType::kF32, {3 * d, d / 2}));
  }
  SP_RETURN_IF_ERROR(s.PutValue("step", int64_t{1000}));
  SP_RETURN_IF_ERROR(s.PutValue("epoch", int64_t{3}));
  SP_RETURN_IF_ERROR(s.PutValue("optimizer.lr", 3e-4));
  SP_RETURN_IF_ERROR(s.PutValue("rng.cpu", Bytes{std::vector<uint8_t>(5056, 7)}));
  SP_RETURN_IF_ERROR(s.PutValue("data_loader.position", int64_t{128000}));
  s.metadata() = Json{{"model", "demo-transformer"}, {"layers", layers}, {"precision", "bf16+f32"}};
  return s;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Fail(const Status& s) {
  std::fprintf(stderr, "savepoint_demo: %s\n", s.ToString().c_str());
  return 1;
}

int Save(const std::string& dir, uint64_t mib) {
  Result<State> state = MakeState(mib);
  if (!state.ok()) return Fail(state.status());
  SaveStats stats;
  SaveOptions o;
  o.stats = &stats;
  o.overwrite = true;
  Status s = savepoint::Save(*state, dir + "/step-1000", o);
  if (!s.ok()) return Fail(s);
  std::printf("saved   %s/step-1000: %zu tensors, %.2f GiB in %.2f s = %.2f GB/s (%s)\n",
              dir.c_str(), state->num_tensors(), stats.bytes / 1073741824.0, stats.seconds,
              stats.throughput_gbps(), stats.direct_io ? "O_DIRECT" : "buffered");
  return 0;
}

int Load(const std::string& dir, uint64_t mib) {
  LoadStats stats;
  LoadOptions o;
  o.stats = &stats;
  auto t0 = std::chrono::steady_clock::now();
  Result<State> loaded = savepoint::Load(dir + "/step-1000", o);
  double secs = Seconds(t0);
  if (!loaded.ok()) return Fail(loaded.status());
  Result<State> expect = MakeState(mib);
  if (!expect.ok()) return Fail(expect.status());
  for (const auto& [name, e] : expect->entries()) {
    const State::Entry* got = loaded->Find(name);
    bool same = got != nullptr && got->is_tensor() == e.is_tensor() &&
                (e.is_tensor() ? std::memcmp(got->tensor().data(), e.tensor().data(),
                                             e.tensor().nbytes()) == 0
                               : got->value() == e.value());
    if (!same) return Fail(CorruptionError("loaded entry differs: " + name));
  }
  std::printf(
      "loaded  %s/step-1000: %.2f GiB in %.2f s = %.2f GB/s, CRC32C verified, "
      "all %zu entries identical to what was saved\n",
      dir.c_str(), stats.bytes / 1073741824.0, secs, stats.bytes / secs / 1e9, expect->size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: savepoint_demo save|load DIR [--mib N]\n");
    return 2;
  }
  uint64_t mib = 1024;
  if (argc == 5 && std::string(argv[3]) == "--mib") mib = std::strtoull(argv[4], nullptr, 10);
  std::string cmd = argv[1];
  if (cmd == "save") return Save(argv[2], mib);
  if (cmd == "load") return Load(argv[2], mib);
  std::fprintf(stderr, "savepoint_demo: unknown command %s\n", cmd.c_str());
  return 2;
}
