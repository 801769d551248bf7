// Debris names (io/debris.h): only the exact form savepoint writes is debris, and what it writes
// is recognised again; lock file contents are described without echoing foreign bytes.
#include "io/debris.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "savepoint/filesystem.h"

namespace savepoint::io {
namespace {

struct Classified {
  DebrisKind kind;
  std::string name;
  int64_t pid;
};

Classified Classify(std::string_view entry) {
  Classified c{DebrisKind::kNone, "", -1};
  c.kind = ClassifyDebris(entry, &c.name, &c.pid);
  return c;
}

TEST(DebrisTest, WhatSavepointWritesIsRecognisedAgain) {
  for (std::string ckpt : {"step-1", "a.savepoint-tmp.5.0123456789abcdef", "x y"}) {
    SCOPED_TRACE(ckpt);
    const Classified tmp = Classify(Basename(TmpPathFor("/d/" + ckpt)));
    EXPECT_EQ(tmp.kind, DebrisKind::kTmp);
    EXPECT_EQ(tmp.name, ckpt);
    EXPECT_EQ(tmp.pid, ::getpid());
    const Classified old = Classify(Basename(OldPathFor("/d/" + ckpt)));
    EXPECT_EQ(old.kind, DebrisKind::kOld);
    EXPECT_EQ(old.name, ckpt);
    EXPECT_EQ(old.pid, 0);
    EXPECT_EQ(Classify(Basename(DelPathFor("/d/" + ckpt))).kind, DebrisKind::kDeleted);
  }
  EXPECT_EQ(DebrisEntryName(DebrisKind::kTmp, "s", 42, 0xab),
            ".s.savepoint-tmp.42.00000000000000ab");
}

TEST(DebrisTest, UserFilesThatMerelyHoldAMarkerAreNotDebris) {
  for (const char* entry : {
           ".notes.savepoint-tmp.txt",                       // no pid, no nonce
           ".s.savepoint-tmp.0.0123456789abcdef",            // pid 0
           ".s.savepoint-tmp.042.0123456789abcdef",          // leading zero
           ".s.savepoint-tmp.-5.0123456789abcdef",           // a sign (kill(-5) is a group)
           ".s.savepoint-tmp.12345678901.0123456789abcdef",  // more digits than a pid
           ".s.savepoint-tmp.4294967297.0123456789abcdef",   // past pid_t (wraps to 1)
           ".s.savepoint-tmp.5.0123456789ABCDEF",            // upper case
           ".s.savepoint-old.0123456789abcde",               // 15 hex digits
           ".s.savepoint-del.0123456789abcdef0",             // 17
           ".s.savepoint-old.0123456789abcdef.bak",          // a suffix
           "..savepoint-old.0123456789abcdef",               // no checkpoint name
           "....savepoint-old.0123456789abcdef",             // checkpoint ".."
           "...savepoint-del.0123456789abcdef",              // checkpoint "."
           "s.savepoint-old.0123456789abcdef",               // not hidden
       }) {
    SCOPED_TRACE(entry);
    const Classified c = Classify(entry);
    EXPECT_EQ(c.kind, DebrisKind::kNone);
    EXPECT_EQ(c.pid, 0);
  }
}

TEST(DebrisTest, LockHolderIsAPidOrUnknown) {
  EXPECT_EQ(DescribeLockHolder("4242"), "pid 4242");
  for (const char* contents : {"", "0", "-1", "4242\n\x1b[31m", "99999999999", "pid"}) {
    SCOPED_TRACE(contents);
    EXPECT_EQ(DescribeLockHolder(contents), "unknown (the lock file holds no pid)");
  }
}

}  // namespace
}  // namespace savepoint::io
