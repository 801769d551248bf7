// Child process for crash_test: saves checkpoints in a loop until it is killed.
//
// Usage: crash_saver ROOT FIRST_STEP
// For step = FIRST_STEP, FIRST_STEP+1, ...: saves RandomState(step) to ROOT/step-<step:08>, then
// deletes checkpoints more than 3 steps old, and every third step also overwrites ROOT/latest.
// The parent kills it with SIGKILL at a random moment and checks what is on disk.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "testutil/testutil.h"

int main(int argc, char** argv) {
  using namespace savepoint;
  if (argc != 3) {
    std::fprintf(stderr, "usage: crash_saver ROOT FIRST_STEP\n");
    return 2;
  }
  std::string root = argv[1];
  uint64_t step = std::strtoull(argv[2], nullptr, 10);
  for (;; ++step) {
    State s = savepoint::testing::RandomState(step, 8, 2 << 20);
    SaveOptions so;
    so.chunk_bytes = 64 << 10;
    Status st = Save(s, fmt::format("{}/step-{:08}", root, step), so);
    if (st.ok() && step % 3 == 0) {
      so.overwrite = true;
      st = Save(s, root + "/latest", so);
    }
    if (st.ok() && step >= 3) {
      std::string old = fmt::format("{}/step-{:08}", root, step - 3);
      if (DefaultFileSystem()->Exists(old)) st = DeleteCheckpoint(old);
    }
    if (!st.ok()) {
      std::fprintf(stderr, "crash_saver: %s\n", st.ToString().c_str());
      return 1;
    }
  }
}
