// Saves and loads one tensor through an installed savepoint.
#include <savepoint/savepoint.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  savepoint::State s;
  auto t = savepoint::Tensor::Zeros(savepoint::DType::kF32, {4, 4});
  if (!t.ok() || !s.Put("w", std::move(*t)).ok()) return 1;
  savepoint::Status st = savepoint::Save(s, argv[1]);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  auto back = savepoint::Load(argv[1]);
  if (!back.ok() || back->FindTensor("w") == nullptr) return 1;
  // An error message that quotes a name ("{:?}" inside the library) comes out whole: the
  // library's formatting binds to libfmt, never to the copies of it that libspdlog exports.
  savepoint::Status bad = savepoint::ValidateName("w\x01");
  if (bad.message().find("control character") == std::string::npos) {
    std::fprintf(stderr, "unexpected message: %s\n", bad.ToString().c_str());
    return 1;
  }
  std::printf("consumer OK with savepoint %s\n", savepoint::Version());
  return 0;
}
