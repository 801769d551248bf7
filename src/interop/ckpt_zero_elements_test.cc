// Zero-element tensors with INT64_MAX-sized and near-overflow dims in MindSpore `.ckpt` files
// (issue 37: all arithmetic on numbers read from a file is checked), tensors and hash-map slices.
// MindSpore's load_checkpoint reshapes np.frombuffer(content) to the dims: numpy accepts a
// zero-element shape only when the product of its non-zero dims times the item size fits in
// int64 (so [0, 2^63-1] loads as int8 and fails as float32, "array is too big"), and refuses a
// shape whose product of all dims overflows ([2^63-1, 2, 0]: "cannot reshape array of size 0").
// savepoint loads every zero-element shape whose element and byte counts, taken left to right,
// fit in int64 ([0, 2^63-1], [2^63-1, 0], [0, 2^63-1, 2^63-1]) and refuses the others with
// Corruption naming the file and the entry, never with a signed overflow or an allocation.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "interop/mindspore_ckpt.pb.h"
#include "io/mem_fs.h"
#include "savepoint/mindspore.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

constexpr char kPath[] = "/zero.ckpt";
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k2p62 = int64_t{1} << 62;
constexpr int64_t k2p61 = int64_t{1} << 61;

// One Checkpoint message: a tensor value `name` (MindSpore `type`, `dims`, no content), or, with
// `map`, one hash-map slice whose keys, values and status tensors all have `dims`.
std::string Value(const std::string& name, const std::string& type,
                  const std::vector<int64_t>& dims, bool map = false) {
  mindspore::Checkpoint c;
  auto* v = c.add_value();
  v->set_tag(name);
  for (int part = 0; part < (map ? 3 : 1); ++part) {
    mindspore::TensorProto* t = map ? v->mutable_maptensor()->add_tensor() : v->mutable_tensor();
    for (int64_t d : dims) t->add_dims(d);
    t->set_tensor_type(map && part == 1 ? "float32" : type);
    t->set_tensor_content("");
  }
  return c.SerializeAsString();
}

class CkptZeroElementsTest : public ::testing::Test {
 protected:
  Result<State> Load(const std::string& file) {
    EXPECT_TRUE(fs_.WriteFileSynced(kPath, file).ok());
    return LoadMindSporeCheckpoint(kPath, {}, {.fs = &fs_});
  }

  // The file loads, "w" is the zero-element tensor of `shape`, and the state writes back as a
  // .ckpt that loads the same.
  void ExpectZeroElements(const std::string& type, const Shape& shape) {
    SP_ASSERT_OK_AND_ASSIGN(State s, Load(Value("w", type, shape)));
    const TensorView* w = s.FindTensor("w");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->shape(), shape);
    EXPECT_EQ(w->nbytes(), 0u);
    SP_ASSERT_OK(SaveMindSporeCheckpoint(s, "/back.ckpt", {.overwrite = true}, {.fs = &fs_}));
    SP_ASSERT_OK_AND_ASSIGN(State back, LoadMindSporeCheckpoint("/back.ckpt", {}, {.fs = &fs_}));
    EXPECT_TRUE(testing::StatesEqual(s, back));
  }

  MemFileSystem fs_;
};

TEST_F(CkptZeroElementsTest, ZeroElementsWithInt64MaxDimension) {
  ExpectZeroElements("Float32", {0, kMax});
  ExpectZeroElements("Int8", {kMax, 0});
  ExpectZeroElements("UInt8", {0, kMax, kMax});
  ExpectZeroElements("Float64", {k2p62, 0});
  ExpectZeroElements("Int4", {kMax, 0});
}

TEST_F(CkptZeroElementsTest, OverflowingOrNegativeDimsAreCorruption) {
  for (const Shape& dims : {Shape{kMax, kMax, 0}, Shape{kMax, 2, 0}, Shape{k2p62, k2p62, 0},
                            Shape{-1, 0}, Shape{0, std::numeric_limits<int64_t>::min()}}) {
    SCOPED_TRACE(ShapeToString(dims));
    EXPECT_THAT(Load(Value("w", "Float32", dims)),
                StatusIs(StatusCode::kCorruption, "entry \"w\": dims are negative or overflow"));
  }
  // Elements that fit, bytes that do not: [2, 2^61] is 2^62 elements, 2^64 bytes of float32.
  EXPECT_THAT(Load(Value("w", "Float32", {2, k2p61})),
              StatusIs(StatusCode::kCorruption, "entry \"w\": dims are negative or overflow"));
  // Bytes that fit but are not in the file.
  EXPECT_THAT(
      Load(Value("w", "Float32", {2, k2p61 / 4})),
      StatusIs(StatusCode::kCorruption, "needs 4611686018427387904 bytes, the file holds 0"));
}

// Hash maps: each slice is checked, then the sum of their first dims, then the whole shape.
TEST_F(CkptZeroElementsTest, MapSlicesOfZeroElements) {
  SP_ASSERT_OK_AND_ASSIGN(
      State s, Load(Value("emb", "int32", {kMax, 0}, true) + Value("emb", "int32", {0, 0}, true)));
  ASSERT_NE(s.FindTensor("emb.values"), nullptr);
  EXPECT_EQ(s.FindTensor("emb.values")->shape(), (Shape{kMax, 0}));
  SP_ASSERT_OK_AND_ASSIGN(
      s, Load(Value("emb", "int64", {0, kMax}, true) + Value("emb", "int64", {0, kMax}, true)));
  EXPECT_EQ(s.FindTensor("emb.keys")->shape(), (Shape{0, kMax}));

  const struct {
    std::string file, message;
  } bad[] = {
      {Value("emb", "int32", {kMax, 0}, true) + Value("emb", "int32", {1, 0}, true),
       "the map slices' first dimensions add up past 2^63"},
      // Two slices of valid shapes, [2^61, 2, 0] each, whose sum [2^62, 2, 0] is none.
      {Value("emb", "int32", {k2p61, 2, 0}, true) + Value("emb", "int32", {k2p61, 2, 0}, true),
       "the map slices add up to an invalid shape"},
      {Value("emb", "int32", {kMax, 2, 0}, true), "dims are negative or overflow"},
      {Value("emb", "int32", {-1, 0}, true), "dims are negative or overflow"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(b.message);
    EXPECT_THAT(Load(b.file),
                StatusIs(StatusCode::kCorruption, "entry \"emb.keys\": " + b.message));
  }
}

}  // namespace
}  // namespace savepoint
