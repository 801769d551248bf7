// io::DurableCommit under power loss: a crash after every file-system call of a commit, then the
// loss of everything not synced, then GarbageCollect. The target is always either as it was or
// wholly the new one; a commit that returned OK survives, new parent directories included; and
// only the target's name is left visible. Files and directories, new and overwritten.
#include "io/commit.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>

#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "savepoint/catalog.h"
#include "testutil/testutil.h"

namespace savepoint::io {
namespace {

using ::savepoint::testing::StatusIs;

using Kind = DurableCommit::Kind;

constexpr char kOld[] = "old contents";
constexpr char kNew[] = "new contents, longer than the old";

// Commits kNew at `path` (as a file, or as a directory holding one file "f", the one entry the
// writer owns) through `fs`.
Status CommitNew(FileSystem* fs, const std::string& path, Kind kind, bool overwrite) {
  CommitOptions o;
  o.overwrite = overwrite;
  o.owns = [](std::string_view name) { return name == "f"; };
  SP_ASSIGN_OR_RETURN(DurableCommit c, DurableCommit::Begin(fs, path, kind, o));
  const std::string file = kind == Kind::kFile ? c.tmp() : JoinPath(c.tmp(), "f");
  Status s = fs->WriteFileSynced(file, kNew);
  if (s.ok()) s = c.Commit();
  if (!s.ok()) c.Abandon();
  return s;
}

// What is at `path`: its contents ("" when absent).
std::string Contents(MemFileSystem& fs, const std::string& path, Kind kind) {
  Result<std::string> r = fs.ReadFile(kind == Kind::kFile ? path : JoinPath(path, "f"), 1 << 20);
  return r.ok() ? *r : std::string();
}

struct Case {
  Kind kind;
  bool overwrite;
  std::string path;        // under /root; new parents are created when they are missing
  bool empty_dir = false;  // an empty directory stands at the path (a fine target)
};

void Sweep(const Case& c) {
  auto make = [&](MemFileSystem& mem) {
    ASSERT_TRUE(CreateDirsDurably(&mem, "/root").ok());
    if (c.empty_dir) {
      ASSERT_TRUE(CreateDirsDurably(&mem, c.path).ok());
    }
    if (!c.overwrite) return;
    ASSERT_TRUE(CommitNew(&mem, c.path, c.kind, false).ok());
    const std::string file = c.kind == Kind::kFile ? c.path : JoinPath(c.path, "f");
    ASSERT_TRUE(mem.RemoveFile(file).ok());
    ASSERT_TRUE(mem.WriteFileSynced(file, kOld).ok());
  };
  uint64_t total = 0;
  {
    MemFileSystem mem;
    make(mem);
    FaultInjectionFileSystem fault(&mem);
    ASSERT_TRUE(CommitNew(&fault, c.path, c.kind, c.overwrite).ok());
    total = fault.mutation_count();
  }
  for (uint64_t k = 0; k <= total; ++k) {
    SCOPED_TRACE(fmt::format("{} {}{}: crash after {} of {} mutations", c.path,
                             c.kind == Kind::kFile ? "file" : "directory",
                             c.overwrite ? " overwrite" : "", k, total));
    MemFileSystem mem;
    make(mem);
    FaultInjectionFileSystem fault(&mem);
    fault.CrashAfter(k);
    Status s = CommitNew(&fault, c.path, c.kind, c.overwrite);
    mem.SimulatePowerLoss();
    GcOptions gc;
    gc.fs = &mem;
    ASSERT_TRUE(GarbageCollect(Dirname(c.path), gc).ok() || !mem.Exists(Dirname(c.path)));
    const std::string now = Contents(mem, c.path, c.kind);
    EXPECT_TRUE(now == kNew || now == (c.overwrite ? kOld : "")) << now;
    if (s.ok()) {
      EXPECT_EQ(now, kNew) << "a commit that returned OK was lost";
    }
    if (mem.Exists(Dirname(c.path))) {
      for (const FileInfo& e : mem.ListDir(Dirname(c.path)).value()) {
        EXPECT_EQ(e.name, Basename(c.path)) << "debris left visible";
      }
    }
  }
}

TEST(DurableCommit, PowerLossNewFile) { Sweep({Kind::kFile, false, "/root/a"}); }
TEST(DurableCommit, PowerLossOverwrittenFile) { Sweep({Kind::kFile, true, "/root/a"}); }
TEST(DurableCommit, PowerLossNewDirectory) { Sweep({Kind::kDirectory, false, "/root/d"}); }
TEST(DurableCommit, PowerLossOverwrittenDirectory) { Sweep({Kind::kDirectory, true, "/root/d"}); }
// New parent directories are synced into their parents before the commit counts as done.
TEST(DurableCommit, PowerLossUnderNewParents) {
  Sweep({Kind::kDirectory, false, "/root/x/y/d"});
  Sweep({Kind::kFile, false, "/root/x/y/a"});
}

// An empty directory at the target is replaced, overwrite or not; a crash leaves it, nothing, or
// the new directory.
TEST(DurableCommit, PowerLossOverAnEmptyDirectory) {
  Sweep({Kind::kDirectory, false, "/root/d", true});
}

TEST(DurableCommit, OverwriteNeverRemovesWhatTheWriterDidNotWrite) {
  MemFileSystem mem;
  ASSERT_TRUE(CommitNew(&mem, "/d", Kind::kDirectory, false).ok());
  SP_ASSERT_OK(mem.WriteFileSynced("/d/keep.txt", "mine"));
  EXPECT_THAT(CommitNew(&mem, "/d", Kind::kDirectory, true),
              StatusIs(StatusCode::kFailedPrecondition,
                       "holds 1 entry savepoint did not write "
                       "(\"keep.txt\")"));
  EXPECT_EQ(mem.ReadFile("/d/keep.txt", 100).value(), "mine");
  EXPECT_EQ(Contents(mem, "/d", Kind::kDirectory), kNew) << "the old checkpoint stays";
  // A directory that is not the writer's at all, and a file where a directory goes (and back).
  SP_ASSERT_OK(CreateDirsDurably(&mem, "/notes"));
  SP_ASSERT_OK(mem.WriteFileSynced("/notes/a.txt", "a"));
  SP_ASSERT_OK(mem.WriteFileSynced("/notes/b.txt", "b"));
  EXPECT_THAT(CommitNew(&mem, "/notes", Kind::kDirectory, true),
              StatusIs(StatusCode::kFailedPrecondition, "holds 2 entries"));
  SP_ASSERT_OK(mem.WriteFileSynced("/file", "a file"));
  EXPECT_THAT(CommitNew(&mem, "/file", Kind::kDirectory, true),
              StatusIs(StatusCode::kFailedPrecondition, "/file is a file, not the directory"));
  EXPECT_THAT(CommitNew(&mem, "/notes", Kind::kFile, true),
              StatusIs(StatusCode::kFailedPrecondition, "/notes is a directory, not the file"));
  EXPECT_EQ(mem.ReadFile("/file", 100).value(), "a file");
  EXPECT_EQ(mem.ListDir("/notes").value().size(), 2u);
  for (const FileInfo& e : mem.ListDir("/").value()) {
    EXPECT_NE(e.name[0], '.') << "no debris of the refused commits: " << e.name;
  }
}

TEST(DurableCommit, RefusesAnExistingTargetUnlessOverwriting) {
  MemFileSystem mem;
  ASSERT_TRUE(CommitNew(&mem, "/a", Kind::kFile, false).ok());
  Status s = CommitNew(&mem, "/a", Kind::kFile, false);
  EXPECT_THAT(s, StatusIs(StatusCode::kAlreadyExists, "/a"));
  CommitOptions no_parents;
  no_parents.create_parents = false;
  EXPECT_EQ(DurableCommit::Begin(&mem, "/missing/d", Kind::kDirectory, no_parents).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(mem.ListDir("/").value().size(), 1u);  // no debris of the refused commits
}

TEST(WriteFileDurably, WritesWholeRefusesOrReplaces) {
  MemFileSystem mem;
  SP_ASSERT_OK(WriteFileDurably(&mem, "/dir/list", "a\n", false));  // parents created
  EXPECT_EQ(mem.ReadFile("/dir/list", 100).value(), "a\n");
  EXPECT_THAT(WriteFileDurably(&mem, "/dir/list", "b\n", false),
              StatusIs(StatusCode::kAlreadyExists));
  SP_ASSERT_OK(WriteFileDurably(&mem, "/dir/list", "a\nb\n", true));
  EXPECT_EQ(mem.ReadFile("/dir/list", 100).value(), "a\nb\n");
  EXPECT_EQ(mem.ListDir("/dir").value().size(), 1u) << "no temporary left";
  FaultInjectionFileSystem faulty(&mem);
  faulty.FailNth(FaultInjectionFileSystem::Op::kWrite, 1, ENOSPC);  // the temporary's write
  EXPECT_THAT(WriteFileDurably(&faulty, "/dir/list", "c\n", true), StatusIs(StatusCode::kNoSpace));
  EXPECT_EQ(mem.ReadFile("/dir/list", 100).value(), "a\nb\n") << "the old contents stay";
  EXPECT_EQ(mem.ListDir("/dir").value().size(), 1u) << "the temporary was removed";
}

}  // namespace
}  // namespace savepoint::io
