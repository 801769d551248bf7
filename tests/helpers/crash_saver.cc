// Child process for crash_test: saves checkpoints in a loop until it is killed.
//
// Usage: crash_saver ROOT FIRST_STEP [async|async-zstd|ckpt]
// With "async", saves go through a Checkpointer (snapshot, then background persist) with a small
// staging pool, so kills land in the background phase too; "async-zstd" also compresses every
// chunk with zstd (chunks that shrink are stored compressed); "ckpt" writes MindSpore .ckpt files
// with a CRC trailer (ROOT/step-<step:08>.ckpt and ROOT/latest.ckpt).
// For step = FIRST_STEP, FIRST_STEP+1, ...: saves CrashState(step) to ROOT/step-<step:08>, then
// deletes checkpoints more than 3 steps old, and every third step also overwrites ROOT/latest.
// The parent kills it with SIGKILL at a random moment and checks what is on disk.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "savepoint/async.h"
#include "savepoint/mindspore.h"
#include "testutil/testutil.h"

int main(int argc, char** argv) {
  using namespace savepoint;
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: crash_saver ROOT FIRST_STEP [async|async-zstd|ckpt]\n");
    return 2;
  }
  const std::string mode = argc == 4 ? argv[3] : "";
  std::unique_ptr<Checkpointer> async;
  if (mode.starts_with("async")) {
    CheckpointerOptions o;
    o.staging_bytes = 1 << 20;
    o.slab_bytes = 64 << 10;
    async = Checkpointer::Create(o, {.io_threads = 2}).value();
  }
  auto save = [&](const State& s, const std::string& path, const SaveOptions& so) {
    if (mode == "ckpt") {
      return SaveMindSporeCheckpoint(s, path + ".ckpt",
                                     {.overwrite = so.overwrite, .crc_check = true});
    }
    if (!async) return Save(s, path, so);
    Result<SaveHandle> h = async->SaveAsync(s, path, so);
    return h.ok() ? h->Wait() : h.status();
  };
  std::string root = argv[1];
  uint64_t step = std::strtoull(argv[2], nullptr, 10);
  for (;; ++step) {
    State s = mode == "ckpt" ? savepoint::testing::CkptCrashState(step)
                             : savepoint::testing::CrashState(step);
    SaveOptions so;
    so.chunk_bytes = 64 << 10;
    if (mode == "async-zstd") {
      so.compression.codec = Compression::Codec::kZstd;
    }
    Status st = save(s, fmt::format("{}/step-{:08}", root, step), so);
    if (st.ok() && step % 3 == 0) {
      so.overwrite = true;
      st = save(s, root + "/latest", so);
    }
    if (st.ok() && step >= 3) {
      std::string old = fmt::format("{}/step-{:08}", root, step - 3);
      if (mode == "ckpt") {
        old += ".ckpt";
        if (DefaultFileSystem()->Exists(old)) st = DefaultFileSystem()->RemoveFile(old);
      } else if (DefaultFileSystem()->Exists(old)) {
        st = DeleteCheckpoint(old);
      }
    }
    if (!st.ok()) {
      std::fprintf(stderr, "crash_saver: %s\n", st.ToString().c_str());
      return 1;
    }
  }
}
