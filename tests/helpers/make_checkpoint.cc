// Writes a small committed checkpoint for the CLI test (tests/cli_test.sh).
// Usage: make_checkpoint DIR [zstd]. Contents: tensor "a" (F32 [2, 3], the first extent, at offset
// 4096), tensor "model.w" (BF16 [1024, 1024]), values step=7 and one of every other kind, metadata.
// With "zstd": saved with zstd compression, plus a mostly-zero tensor "zeros" (F32 [1024, 1024]).
#include <cstdio>
#include <string>

#include "testutil/testutil.h"

int main(int argc, char** argv) {
  using namespace savepoint;
  bool zstd = argc == 3 && std::string(argv[2]) == "zstd";
  if (argc != 2 && !zstd) return 2;
  State s;
  Tensor a = Tensor::Empty(DType::kF32, {2, 3}).value();
  Tensor w = Tensor::Empty(DType::kBF16, {1024, 1024}).value();
  savepoint::testing::FillPattern(a.view(), 1);
  savepoint::testing::FillPattern(w.view(), 2);
  Status st = s.Put("a", std::move(a));
  if (st.ok()) st = s.Put("model.w", std::move(w));
  if (st.ok()) st = s.PutValue("step", int64_t{7});
  if (st.ok()) st = s.PutValue("lr", 0.5);
  if (st.ok()) st = s.PutValue("flag", true);
  if (st.ok()) st = s.PutValue("name", "run-1");
  if (st.ok()) st = s.PutValue("rng", Bytes{{1, 2, 3}});
  if (st.ok()) st = s.PutValue("config", Value::FromJson(Json{{"layers", 2}}));
  s.metadata() = Json{{"purpose", "cli test"}};
  SaveOptions options;
  if (zstd) {
    options.compression.codec = Compression::Codec::kZstd;
    Tensor z = Tensor::Zeros(DType::kF32, {1024, 1024}).value();
    z.as<float>()[4242] = 1.0f;
    if (st.ok()) st = s.Put("zeros", std::move(z));
  }
  if (st.ok()) st = Save(s, argv[1], options);
  if (!st.ok()) {
    std::fprintf(stderr, "make_checkpoint: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
