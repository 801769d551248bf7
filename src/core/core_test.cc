// Unit tests of the core model: Status/Result, DType, shapes, Tensor, Value and State.
#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/utf8.h"
#include "savepoint/savepoint.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

// ---- Status and Result ----

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_THAT(s, StatusIs(StatusCode::kOk));
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "ok");
  EXPECT_EQ(Status::OK(), Status());
}

TEST(Status, FactoriesSetCodes) {
  struct Case {
    Status s;
    StatusCode code;
    std::string_view name;
  };
  const std::vector<Case> cases = {
      {InvalidArgumentError("m"), StatusCode::kInvalidArgument, "invalid argument"},
      {NotFoundError("m"), StatusCode::kNotFound, "not found"},
      {AlreadyExistsError("m"), StatusCode::kAlreadyExists, "already exists"},
      {CorruptionError("m"), StatusCode::kCorruption, "corruption"},
      {IOError("m"), StatusCode::kIOError, "I/O error"},
      {NoSpaceError("m"), StatusCode::kNoSpace, "no space"},
      {UnimplementedError("m"), StatusCode::kUnimplemented, "unimplemented"},
      {FailedPreconditionError("m"), StatusCode::kFailedPrecondition, "failed precondition"},
      {OutOfRangeError("m"), StatusCode::kOutOfRange, "out of range"},
      {PermissionDeniedError("m"), StatusCode::kPermissionDenied, "permission denied"},
      {ResourceExhaustedError("m"), StatusCode::kResourceExhausted, "resource exhausted"},
      {InternalError("m"), StatusCode::kInternal, "internal"},
  };
  std::set<std::string_view> names;
  for (const auto& c : cases) {
    EXPECT_FALSE(c.s.ok());
    EXPECT_EQ(c.s.code(), c.code);
    EXPECT_EQ(c.s.message(), "m");
    EXPECT_EQ(StatusCodeName(c.code), c.name);
    EXPECT_EQ(c.s.ToString(), std::string(c.name) + ": m");
    names.insert(StatusCodeName(c.code));
  }
  EXPECT_EQ(names.size(), cases.size());
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "ok");
  // The numeric codes are a stable interface (CLI exit codes, Python exceptions).
  EXPECT_EQ(static_cast<int>(StatusCode::kCorruption), 4);
  EXPECT_EQ(static_cast<int>(StatusCode::kInternal), 12);
}

TEST(Status, WithContextAndEquality) {
  Status s = CorruptionError("bad chunk");
  Status c = s.WithContext("checkpoint /x").WithContext("load");
  EXPECT_THAT(c, StatusIs(StatusCode::kCorruption));
  EXPECT_EQ(c.message(), "load: checkpoint /x: bad chunk");
  EXPECT_EQ(s.message(), "bad chunk");  // unchanged
  EXPECT_TRUE(Status::OK().WithContext("ctx").ok());
  EXPECT_EQ(Status::OK().WithContext("ctx").message(), "");
  EXPECT_EQ(CorruptionError("a"), CorruptionError("a"));
  EXPECT_FALSE(CorruptionError("a") == CorruptionError("b"));
  EXPECT_FALSE(CorruptionError("a") == IOError("a"));
}

TEST(Status, ErrnoToStatus) {
  struct Case {
    int err;
    StatusCode code;
  };
  for (Case c :
       {Case{ENOSPC, StatusCode::kNoSpace}, Case{EDQUOT, StatusCode::kNoSpace},
        Case{ENOENT, StatusCode::kNotFound}, Case{EEXIST, StatusCode::kAlreadyExists},
        Case{EACCES, StatusCode::kPermissionDenied}, Case{EPERM, StatusCode::kPermissionDenied},
        Case{EROFS, StatusCode::kPermissionDenied}, Case{EIO, StatusCode::kIOError},
        Case{EBADF, StatusCode::kIOError}}) {
    Status s = ErrnoToStatus(c.err, "open /a/b");
    EXPECT_EQ(s.code(), c.code) << std::strerror(c.err);
    EXPECT_EQ(s.message(), std::string("open /a/b: ") + std::strerror(c.err));
  }
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  SP_ASSIGN_OR_RETURN(int h, Half(x));
  SP_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  SP_RETURN_IF_ERROR(Half(x).status());
  return Status::OK();
}

TEST(Result, ValueAndError) {
  Result<int> r = 5;
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 5);
  EXPECT_TRUE(r.status().ok());
  Result<int> e = NotFoundError("gone");
  EXPECT_FALSE(e.ok());
  EXPECT_THAT(e, StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(e.status().message(), "gone");
  // A Result built from an OK status is an internal error, never a value-less success.
  Result<int> bogus = Status::OK();
  EXPECT_FALSE(bogus.ok());
  EXPECT_THAT(bogus, StatusIs(StatusCode::kInternal));
  // Move-only values.
  Result<std::unique_ptr<int>> p = std::make_unique<int>(3);
  std::unique_ptr<int> taken = std::move(p).value();
  EXPECT_EQ(*taken, 3);
  Result<std::string> str = std::string("abc");
  EXPECT_EQ(str->size(), 3u);
}

TEST(Result, Macros) {
  EXPECT_EQ(Quarter(8).value(), 2);
  EXPECT_THAT(Quarter(6), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(Quarter(7).status().message(), "odd");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_THAT(CheckEven(3), StatusIs(StatusCode::kInvalidArgument));
}

// ---- DType ----

TEST(DType, NamesRoundTripAndSizes) {
  auto all = AllDTypes();
  EXPECT_EQ(all.size(), 17u);
  std::set<std::string_view> names;
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(all[i]), i) << "enum order";
    std::string_view name = DTypeName(all[i]);
    names.insert(name);
    std::optional<DType> back = DTypeFromName(name);
    ASSERT_TRUE(back.has_value()) << name;
    EXPECT_EQ(*back, all[i]);
    size_t size = DTypeSize(all[i]);
    EXPECT_TRUE(size == 1 || size == 2 || size == 4 || size == 8 || size == 16) << name;
  }
  EXPECT_EQ(names.size(), all.size());
  const std::vector<std::pair<std::string_view, size_t>> expected = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},    {"U16", 2},     {"I16", 2},    {"U32", 4},
      {"I32", 4},  {"U64", 8}, {"I64", 8},   {"F16", 2},     {"BF16", 2},   {"F32", 4},
      {"F64", 8},  {"C64", 8}, {"C128", 16}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, size] : expected) {
    std::optional<DType> d = DTypeFromName(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(DTypeSize(*d), size) << name;
    EXPECT_EQ(DTypeName(*d), name);
  }
}

TEST(DType, UnknownNames) {
  for (std::string_view bad :
       {"", "F7", "f32", "Float32", "F32 ", " F32", "BF", "F8", "U128", "float32", "C32"}) {
    EXPECT_FALSE(DTypeFromName(bad).has_value()) << bad;
  }
  EXPECT_FALSE(DTypeFromName(std::string_view("F32\0", 4)).has_value());
}

// ---- Shapes ----

TEST(Shape, NumElementsAndBytes) {
  EXPECT_EQ(NumElements({}).value(), 1);
  EXPECT_EQ(NumElements({0}).value(), 0);
  EXPECT_EQ(NumElements({3, 0, 5}).value(), 0);
  EXPECT_EQ(NumElements({2, 3, 4}).value(), 24);
  EXPECT_EQ(NumElements(Shape(64, 1)).value(), 1);
  EXPECT_EQ(NumElements({INT64_MAX}).value(), INT64_MAX);
  EXPECT_EQ(NumBytes(DType::kBF16, {3, 5}).value(), 30u);
  EXPECT_EQ(NumBytes(DType::kC128, {}).value(), 16u);
  EXPECT_EQ(NumBytes(DType::kF32, {0, INT64_MAX}).value(), 0u);
  EXPECT_EQ(NumBytes(DType::kU8, {INT64_MAX}).value(), uint64_t{INT64_MAX});
}

TEST(Shape, InvalidShapesRejected) {
  EXPECT_THAT(NumElements({-1}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(NumElements({0, -1}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(NumElements({INT64_MIN}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(NumElements(Shape(65, 1)), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(NumElements(Shape(65, 0)), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(NumElements({int64_t{1} << 32, int64_t{1} << 31}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_THAT(NumElements({INT64_MAX, 2}), StatusIs(StatusCode::kInvalidArgument));
  // Elements fit in int64, bytes do not.
  EXPECT_EQ(NumBytes(DType::kF32, {int64_t{1} << 62}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(NumBytes(DType::kU8, {int64_t{1} << 62, 2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_THAT(NumBytes(DType::kC128, {INT64_MAX / 8}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(NumElements({-1}).status().message().find("[-1]"), std::string::npos);
}

TEST(Shape, ToString) {
  EXPECT_EQ(ShapeToString({}), "[]");
  EXPECT_EQ(ShapeToString({2, 3}), "[2, 3]");
}

// ---- Tensor ----

TEST(Tensor, AlignmentAndCapacity) {
  struct Case {
    DType dtype;
    Shape shape;
    uint64_t nbytes, capacity;
  };
  for (const Case& c :
       {Case{DType::kU8, {}, 1, 4096}, Case{DType::kU8, {0}, 0, 4096},
        Case{DType::kF32, {1024}, 4096, 4096}, Case{DType::kU8, {4097}, 4097, 8192},
        Case{DType::kC128, {3, 256}, 12288, 12288}, Case{DType::kBF16, {333, 77}, 51282, 53248}}) {
    Result<Tensor> t = Tensor::Empty(c.dtype, c.shape);
    SP_ASSERT_OK(t.status());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % kTensorAlignment, 0u);
    EXPECT_EQ(t->nbytes(), c.nbytes);
    EXPECT_EQ(t->capacity(), c.capacity);
    EXPECT_EQ(t->dtype(), c.dtype);
    EXPECT_EQ(t->shape(), c.shape);
    EXPECT_EQ(t->view().data(), t->data());
  }
}

TEST(Tensor, ZerosAreZeroFilledToCapacity) {
  for (int round = 0; round < 4; ++round) {  // reuse freed memory that held garbage
    Tensor junk = Tensor::Empty(DType::kU8, {10000}).value();
    std::memset(junk.data(), 0xAB, junk.capacity());
    junk = Tensor();
    Tensor z = Tensor::Zeros(DType::kU8, {10000}).value();
    for (uint64_t i = 0; i < z.capacity(); ++i) {
      ASSERT_EQ(z.data()[i], std::byte{0}) << "byte " << i;
    }
  }
}

TEST(Tensor, InvalidShapesAndHugeAllocations) {
  EXPECT_THAT(Tensor::Empty(DType::kF32, {-1}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Tensor::Zeros(DType::kF32, Shape(65, 1)), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(Tensor::Empty(DType::kF64, {int64_t{1} << 61}).status().code(),
            StatusCode::kInvalidArgument);
  Result<Tensor> huge = Tensor::Empty(DType::kU8, {INT64_MAX});
  EXPECT_THAT(huge, StatusIs(StatusCode::kResourceExhausted));
}

TEST(Tensor, CopyOfAndTypedAccess) {
  std::vector<float> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f;
  TensorView v(src.data(), DType::kF32, {10, 100});
  SP_ASSERT_OK(v.Validate());
  EXPECT_EQ(v.nbytes(), 4000u);
  EXPECT_EQ(v.bytes().size(), 4000u);
  Result<Tensor> c = Tensor::CopyOf(v);
  SP_ASSERT_OK(c.status());
  EXPECT_NE(c->data(), v.data());
  EXPECT_EQ(c->shape(), (Shape{10, 100}));
  ASSERT_EQ(c->as<float>().size(), 1000u);
  EXPECT_EQ(std::memcmp(c->data(), src.data(), 4000), 0);
  EXPECT_EQ(c->as<float>()[999], 499.5f);
  src[0] = 7;  // the copy is independent
  EXPECT_EQ(c->as<float>()[0], 0.0f);
  // Empty and invalid views.
  SP_EXPECT_OK(Tensor::CopyOf(TensorView(static_cast<void*>(nullptr), DType::kU8, {0})).status());
  EXPECT_EQ(
      Tensor::CopyOf(TensorView(static_cast<void*>(nullptr), DType::kU8, {1})).status().code(),
      StatusCode::kInvalidArgument);
  TensorView bad(src.data(), DType::kF32, {-4});
  EXPECT_FALSE(bad.Validate().ok());
  EXPECT_EQ(bad.nbytes(), 0u);
}

TEST(Tensor, MoveTransfersOwnership) {
  Tensor a = Tensor::Zeros(DType::kI32, {8}).value();
  std::byte* p = a.data();
  Tensor b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.shape(), Shape{8});
}

// ---- Value ----

TEST(Value, KindsAndAccessors) {
  EXPECT_EQ(Value().kind(), ValueKind::kInt);
  EXPECT_EQ(Value().as_int(), 0);
  EXPECT_EQ(Value(3).kind(), ValueKind::kInt);
  EXPECT_EQ(Value(int64_t{-5}).as_int(), -5);
  EXPECT_EQ(Value(2.5).kind(), ValueKind::kFloat);
  EXPECT_EQ(Value(true).kind(), ValueKind::kBool);
  EXPECT_EQ(Value("s").kind(), ValueKind::kString);
  EXPECT_EQ(Value(std::string("s")).as_string(), "s");
  EXPECT_EQ(Value(Bytes{{1, 2}}).kind(), ValueKind::kBytes);
  EXPECT_EQ(Value::FromJson(Json::array()).kind(), ValueKind::kJson);
  EXPECT_TRUE(Value(1).is_int());
  EXPECT_FALSE(Value(1.0).is_int());
  EXPECT_EQ(ValueKindName(ValueKind::kInt), "int");
  EXPECT_EQ(ValueKindName(ValueKind::kFloat), "float");
  EXPECT_EQ(ValueKindName(ValueKind::kBool), "bool");
  EXPECT_EQ(ValueKindName(ValueKind::kString), "string");
  EXPECT_EQ(ValueKindName(ValueKind::kBytes), "bytes");
  EXPECT_EQ(ValueKindName(ValueKind::kJson), "json");
}

TEST(Value, Equality) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(Value(nan), Value(nan));  // bitwise
  EXPECT_FALSE(Value(nan) == Value(-nan));
  EXPECT_FALSE(Value(0.0) == Value(-0.0));
  EXPECT_EQ(Value(std::numeric_limits<double>::infinity()),
            Value(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(Value(1.5), Value(1.5));
  EXPECT_FALSE(Value(1) == Value(1.0));  // different kinds
  EXPECT_FALSE(Value(1) == Value(true));
  EXPECT_FALSE(Value("ab") == Value(Bytes{{'a', 'b'}}));
  EXPECT_EQ(Value(Bytes{{0, 255}}), Value(Bytes{{0, 255}}));
  EXPECT_FALSE(Value(Bytes{{0}}) == Value(Bytes{}));
  EXPECT_EQ(Value::FromJson(Json{{"a", 1}}), Value::FromJson(Json::parse(R"({"a":1})")));
  EXPECT_FALSE(Value::FromJson(Json{{"a", 1}}) == Value::FromJson(Json{{"a", 2}}));
  EXPECT_FALSE(Value::FromJson(Json("x")) == Value("x"));
}

// ---- Names and State ----

TEST(State, ValidNames) {
  for (std::string_view ok :
       {"a", "model.layer1.weight", "../x", "a/b", " spaced name ", "\xc3\xa9t\xc3\xa9",
        "\xe5\xb1\x82", "\xf0\x9f\x99\x82", "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf", "\xc2\x80"}) {
    SP_EXPECT_OK(ValidateName(ok));
  }
  SP_EXPECT_OK(ValidateName(std::string(kMaxNameBytes, 'x')));
}

TEST(State, InvalidNames) {
  std::vector<std::string> bad = {"",
                                  std::string("a\0b", 3),
                                  "tab\there",
                                  "line\n",
                                  "del\x7f",
                                  "\x1b[31m",
                                  "\xff",
                                  "\xc0\x80",          // overlong NUL
                                  "\xe0\x80\xaf",      // overlong '/'
                                  "\xed\xa0\x80",      // surrogate
                                  "\xf4\x90\x80\x80",  // > U+10FFFF
                                  "\xe5\xb1",          // truncated
                                  "\x80",              // lone continuation
                                  "\xf8\x88\x80\x80\x80",
                                  std::string(kMaxNameBytes + 1, 'x')};
  for (const std::string& name : bad) {
    Status s = ValidateName(name);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument)) << ::testing::PrintToString(name);
    State st;
    EXPECT_THAT(st.PutValue(name, 1), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_EQ(st.Put(name, Tensor::Zeros(DType::kU8, {1}).value()).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(st.size(), 0u);
  }
  EXPECT_FALSE(IsValidUtf8("\xc1\xbf"));
  EXPECT_TRUE(IsValidUtf8(""));
}

TEST(State, PutFindErase) {
  State s;
  SP_ASSERT_OK(s.Put("w", Tensor::Zeros(DType::kF32, {2, 3}).value()));
  std::vector<uint16_t> mine(10);
  SP_ASSERT_OK(s.PutView("v", TensorView(mine.data(), DType::kBF16, {10})));
  SP_ASSERT_OK(s.PutValue("step", 7));
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.num_tensors(), 2u);
  EXPECT_EQ(s.tensor_bytes(), 24u + 20u);
  EXPECT_TRUE(s.Contains("w"));
  ASSERT_NE(s.Find("w"), nullptr);
  EXPECT_TRUE(s.Find("w")->is_tensor());
  EXPECT_EQ(s.FindTensor("w")->shape(), (Shape{2, 3}));
  EXPECT_EQ(s.FindTensor("v")->data(), reinterpret_cast<std::byte*>(mine.data()));
  EXPECT_EQ(s.FindTensor("step"), nullptr);
  EXPECT_EQ(s.FindValue("w"), nullptr);
  EXPECT_EQ(s.FindValue("step")->as_int(), 7);
  EXPECT_EQ(s.Find("nope"), nullptr);
  EXPECT_EQ(s.FindTensor("nope"), nullptr);
  // Tensors and values share one namespace.
  EXPECT_THAT(s.PutValue("w", 1), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_EQ(s.Put("step", Tensor::Zeros(DType::kU8, {1}).value()).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(s.PutView("v", TensorView(mine.data(), DType::kU8, {1})).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(s.FindTensor("v")->dtype(), DType::kBF16);  // the original survives
  // Invalid views are rejected.
  EXPECT_EQ(s.PutView("null", TensorView(static_cast<void*>(nullptr), DType::kU8, {4})).code(),
            StatusCode::kInvalidArgument);
  SP_EXPECT_OK(s.PutView("empty", TensorView(static_cast<void*>(nullptr), DType::kU8, {0})));
  // Iteration is in byte-wise name order.
  std::vector<std::string> names;
  for (const auto& [name, e] : s.entries()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"empty", "step", "v", "w"}));
  EXPECT_TRUE(s.Erase("w"));
  EXPECT_FALSE(s.Erase("w"));
  EXPECT_FALSE(s.Contains("w"));
  EXPECT_EQ(s.tensor_bytes(), 20u);
  SP_EXPECT_OK(s.PutValue("w", 2.0));  // the name is free again
  EXPECT_EQ(s.FindValue("w")->as_float(), 2.0);
  EXPECT_TRUE(s.metadata().is_null());
  s.metadata()["k"] = 1;
  EXPECT_EQ(s.metadata()["k"], 1);
}

TEST(State, NonAsciiNamesSortByteWise) {
  State s;
  SP_ASSERT_OK(s.PutValue("\xc3\xa9", 1));  // U+00E9
  SP_ASSERT_OK(s.PutValue("z", 2));
  SP_ASSERT_OK(s.PutValue("Z", 3));
  std::vector<std::string> names;
  for (const auto& [name, e] : s.entries()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"Z", "z", "\xc3\xa9"}));
}

}  // namespace
}  // namespace savepoint
