// Generator of tests/data/v1_checkpoint/, a format version 1 checkpoint written by the last build
// that wrote only version 1 (git 2ab5b48). Kept for reference; not built. tests/packing_test.cc
// reads the checkpoint and checks every byte against V1FixtureByte.
//
//   c++ -std=c++20 -I<old tree>/include make_v1_checkpoint.cc -L<old build>/src -lsavepoint
//   ./a.out tests/data/v1_checkpoint
#include <cstdio>
#include <string>

#include "savepoint/savepoint.h"

using savepoint::DType;

// Byte `j` of the tensor called `name` (the same formula as in tests/packing_test.cc).
static std::byte V1FixtureByte(const std::string& name, size_t j) {
  return static_cast<std::byte>((j * 31 + name.size() * 17) & 0xff);
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  struct Spec {
    std::string name;
    DType dtype;
    savepoint::Shape shape;
  };
  const Spec specs[] = {
      {"model.weight", DType::kF32, {32, 32}},
      {"model.bias", DType::kF32, {32}},
      {"opt.state.0.step", DType::kF32, {}},
      {"opt.state.0.exp_avg", DType::kBF16, {3000}},
      {"ids", DType::kI64, {5}},
      {"empty", DType::kF16, {0, 4}},
      {"big", DType::kU8, {10000}},
  };
  savepoint::State state;
  for (const Spec& s : specs) {
    savepoint::Tensor t = savepoint::Tensor::Empty(s.dtype, s.shape).value();
    for (size_t j = 0; j < static_cast<size_t>(t.nbytes()); ++j)
      t.data()[j] = V1FixtureByte(s.name, j);
    if (!state.Put(s.name, std::move(t)).ok()) return 1;
  }
  if (!state.PutValue("step", int64_t{42}).ok() || !state.PutValue("lr", 0.25).ok()) return 1;
  state.metadata() = savepoint::Json{{"fixture", "v1"}};
  savepoint::SaveOptions o;
  o.chunk_bytes = 4096;
  savepoint::Status s = savepoint::Save(state, argv[1], o);
  std::printf("%s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
