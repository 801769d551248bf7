// Child process for sparse_crash_test: saves the sparse history of helpers/sparse_crash_model.h
// in a loop until it is killed.
//
// Usage: sparse_crash_saver ROOT FIRST_STEP delta|compact NOTIFY_FD
// For step = FIRST_STEP, FIRST_STEP+1, ...: writes ROOT/step-<step:08> holding the table after
// that step, as a full save, a delta on ROOT/step-<step-1> (its touched rows and deleted ids), or
// the compaction (CompactSparse) of the chain ending at ROOT/step-<step-1>, as KindOf says. After
// a full save or compaction (a new chain root), deletes every checkpoint older than the previous
// root, newest first, so no kept checkpoint ever loses its base. Writes "compact <step>" to
// NOTIFY_FD before a compaction and "commit <step>" after each step is committed. The parent kills
// it with SIGKILL and checks what is on disk.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "helpers/sparse_crash_model.h"
#include "savepoint/catalog.h"

namespace savepoint::testing::sparse_crash {
namespace {

void Notify(int fd, std::string_view what, uint64_t step) {
  const std::string line = fmt::format("{} {}\n", what, step);
  if (::write(fd, line.data(), line.size()) < 0) std::perror("sparse_crash_saver: notify");
}

// Deletes ROOT/step-<t> for every t < `before`, newest first.
Status DeleteOlder(const std::string& root, uint64_t before) {
  for (uint64_t t = before; t-- > 0;) {
    const std::string path = StepPath(root, t);
    if (DefaultFileSystem()->Exists(path)) SP_RETURN_IF_ERROR(DeleteCheckpoint(path));
  }
  return Status::OK();
}

Status SaveStep(const std::string& root, uint64_t step, Mode mode, const Ops& ops, const Ref& ref,
                int fd) {
  const std::string path = StepPath(root, step);
  SparseSaveOptions o;
  o.save.chunk_bytes = 64 << 10;
  State s;
  switch (KindOf(step, mode)) {
    case Kind::kFull:
      SP_RETURN_IF_ERROR(s.PutTable("emb", TableOf(ref, IdsOf(ref))));
      SP_RETURN_IF_ERROR(SaveSparse(s, path, o));
      break;
    case Kind::kDelta:
      SP_RETURN_IF_ERROR(s.PutTable("emb", TableOf(ref, ops.touched, ops.deleted)));
      o.base = StepPath(root, step - 1);
      SP_RETURN_IF_ERROR(SaveSparse(s, path, o));
      break;
    case Kind::kCompact:
      Notify(fd, "compact", step);
      SP_RETURN_IF_ERROR(CompactSparse(StepPath(root, step - 1), path, o));
      break;
  }
  Notify(fd, "commit", step);
  if (KindOf(step, mode) == Kind::kDelta || step == 0) return Status::OK();
  return DeleteOlder(root, RootOf(step - 1, mode));
}

}  // namespace
}  // namespace savepoint::testing::sparse_crash

int main(int argc, char** argv) {
  using namespace savepoint::testing::sparse_crash;
  const std::string mode_name = argc == 5 ? argv[3] : "";
  if (mode_name != "delta" && mode_name != "compact") {
    std::fprintf(stderr, "usage: sparse_crash_saver ROOT FIRST_STEP delta|compact NOTIFY_FD\n");
    return 2;
  }
  const std::string root = argv[1];
  const Mode mode = mode_name == "delta" ? Mode::kDelta : Mode::kCompact;
  const int fd = std::atoi(argv[4]);
  Replayer replay(mode);
  for (uint64_t step = std::strtoull(argv[2], nullptr, 10);; ++step) {
    Ref ref = step == 0 ? Ref{} : replay.At(step - 1);
    const Ops ops = OpsAt(step, mode, ref);
    Apply(ops, step, &ref);
    savepoint::Status st = SaveStep(root, step, mode, ops, ref, fd);
    if (!st.ok()) {
      std::fprintf(stderr, "sparse_crash_saver: step %llu: %s\n",
                   static_cast<unsigned long long>(step), st.ToString().c_str());
      return 1;
    }
  }
}
