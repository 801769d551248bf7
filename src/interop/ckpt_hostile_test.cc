// Hostile MindSpore `.ckpt` files built with the protobuf messages, for what the reader must not
// trust: numbers that overflow when slices are added up, and a file's savepoint.metadata entry
// holding savepoint's own reserved metadata key or JSON nested deeply enough to overflow a stack.
#include <gtest/gtest.h>

#include <string>

#include "interop/mindspore_ckpt.pb.h"
#include "io/mem_fs.h"
#include "savepoint/mindspore.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

constexpr char kPath[] = "/model.ckpt";

// A hash map entry `name` of `slices` slices whose three tensors have dims [dim0, 0]: no element,
// any first dimension.
void AddEmptyMapSlices(const std::string& name, int64_t dim0, int slices, std::string* file) {
  for (int i = 0; i < slices; ++i) {
    mindspore::Checkpoint c;
    auto* v = c.add_value();
    v->set_tag(name);
    for (int part = 0; part < 3; ++part) {
      auto* t = v->mutable_maptensor()->add_tensor();
      t->add_dims(dim0);
      t->add_dims(0);
      t->set_tensor_type(part == 1 ? "float32" : "int32");
      t->set_tensor_content("");
    }
    *file += c.SerializeAsString();
  }
}

// A string entry as MindSpore stores one (type "str", UCS-4 content); `text` is ASCII.
void AddString(const std::string& name, const std::string& text, std::string* file) {
  std::string ucs4;
  for (char ch : text) ucs4 += std::string{ch, '\0', '\0', '\0'};
  mindspore::Checkpoint c;
  auto* v = c.add_value();
  v->set_tag(name);
  v->mutable_tensor()->add_dims(1);
  v->mutable_tensor()->set_tensor_type("str");
  v->mutable_tensor()->set_tensor_content(ucs4);
  *file += c.SerializeAsString();
}

void AddF32(const std::string& name, std::string* file) {
  mindspore::Checkpoint c;
  auto* v = c.add_value();
  v->set_tag(name);
  v->mutable_tensor()->add_dims(2);
  v->mutable_tensor()->set_tensor_type("Float32");
  v->mutable_tensor()->set_tensor_content(std::string(8, '\x01'));
  *file += c.SerializeAsString();
}

TEST(CkptHostileTest, MapSliceDimsThatOverflowWhenAddedAreCorruption) {
  MemFileSystem fs;
  for (const int64_t dim0 : {int64_t{1} << 62, (int64_t{1} << 62) + 12345}) {
    std::string file;
    AddEmptyMapSlices("emb", dim0, 2, &file);  // 2^62 + 2^62 > INT64_MAX
    SP_ASSERT_OK(fs.WriteFileSynced(kPath, file));
    EXPECT_THAT(LoadMindSporeCheckpoint(kPath, {}, {.fs = &fs}).status(),
                StatusIs(StatusCode::kCorruption, "emb.keys"))
        << dim0;
  }
  // The same slices of a sum that fits load as a map without elements.
  std::string file;
  AddEmptyMapSlices("emb", 3, 2, &file);
  SP_ASSERT_OK(fs.WriteFileSynced(kPath, file));
  SP_ASSERT_OK_AND_ASSIGN(State s, LoadMindSporeCheckpoint(kPath, {}, {.fs = &fs}));
  ASSERT_NE(s.FindTensor("emb.values"), nullptr);
  EXPECT_EQ(s.FindTensor("emb.values")->shape(), (Shape{6, 0}));
}

TEST(CkptHostileTest, ReservedKeyInAFilesMetadataIsNotTrusted) {
  MemFileSystem fs;
  std::string file;
  AddF32("w", &file);
  // The file claims "w" is Int4 and that a map "ghost" exists; neither is true of its entries.
  AddString(kMindSporeSavepointMetadataEntry,
            R"({"metadata":{"run":7,"mindspore.ckpt":{"int4":["w"],"map_tensors":["ghost"]}}})",
            &file);
  SP_ASSERT_OK(fs.WriteFileSynced(kPath, file));
  SP_ASSERT_OK_AND_ASSIGN(State s, LoadMindSporeCheckpoint(kPath, {}, {.fs = &fs}));
  EXPECT_EQ(s.metadata(), (Json{{"run", 7}}));
  // What was read writes back (a convert of the file), and reads back the same.
  SP_ASSERT_OK(SaveMindSporeCheckpoint(s, "/back.ckpt", {}, {.fs = &fs}));
  SP_ASSERT_OK_AND_ASSIGN(State back, LoadMindSporeCheckpoint("/back.ckpt", {}, {.fs = &fs}));
  EXPECT_TRUE(testing::StatesEqual(s, back));
}

// 100,000 nested arrays (an 800 KB file) overflowed the stack when the parsed tree was copied.
TEST(CkptHostileTest, DeeplyNestedSavepointMetadataIsCorruption) {
  MemFileSystem fs;
  for (const size_t depth : {size_t{65}, size_t{100000}}) {
    std::string file;
    AddF32("w", &file);
    AddString(kMindSporeSavepointMetadataEntry,
              R"({"metadata":)" + std::string(depth, '[') + std::string(depth, ']') + "}", &file);
    SP_ASSERT_OK(fs.WriteFileSynced(kPath, file));
    EXPECT_THAT(LoadMindSporeCheckpoint(kPath, {}, {.fs = &fs}).status(),
                StatusIs(StatusCode::kCorruption,
                         "MindSpore checkpoint /model.ckpt: entry \"savepoint.metadata\": JSON "
                         "nested deeper than 64 levels"))
        << depth;
  }
  // 64 levels in all (the entry's object and 63 arrays) load.
  std::string file;
  AddF32("w", &file);
  AddString(kMindSporeSavepointMetadataEntry,
            R"({"metadata":)" + std::string(63, '[') + std::string(63, ']') + "}", &file);
  SP_ASSERT_OK(fs.WriteFileSynced(kPath, file));
  SP_ASSERT_OK_AND_ASSIGN(State s, LoadMindSporeCheckpoint(kPath, {}, {.fs = &fs}));
  EXPECT_TRUE(s.metadata().is_array());
}

}  // namespace
}  // namespace savepoint
