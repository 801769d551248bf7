// Hostile safetensors files: every malformed header or data buffer is rejected cleanly, by both
// InspectSafetensors and LoadSafetensors, with Corruption (or Unimplemented for a real safetensors
// dtype savepoint lacks) naming the file and, where there is one, the tensor.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/endian.h"
#include "interop/safetensors_testutil.h"
#include "io/mem_fs.h"
#include "savepoint/safetensors.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

constexpr char kPath[] = "/h.safetensors";

using testing::LoadWith;

// u64 length + header + data.
std::string MakeFile(const std::string& header, const std::string& data) {
  std::string f(8, '\0');
  format::PutU64(&f, 0, header.size());
  return f + header + data;
}

struct HostileCase {
  std::string label;
  std::string bytes;
  std::string message;  // a piece the error message must contain
  StatusCode code = StatusCode::kCorruption;
};

std::string Tensor1(const std::string& name, const std::string& dtype, const std::string& shape,
                    uint64_t begin, uint64_t end) {
  return fmt::format(R"("{}": {{"dtype": "{}", "shape": {}, "data_offsets": [{}, {}]}})", name,
                     dtype, shape, begin, end);
}

std::vector<HostileCase> Cases() {
  const std::string a8 = Tensor1("a", "F32", "[2]", 0, 8);
  std::vector<HostileCase> c = {
      {"empty file", "", "too short"},
      {"short length", std::string(5, '\0'), "too short"},
      {"huge header length",
       MakeFile("{}", "").replace(0, 8, "\x00\xc2\xeb\x0b\x00\x00\x00\x00", 8),
       "exceeds the limit"},
      {"all-ones header length", MakeFile("{}", "").replace(0, 8, std::string(8, '\xff')),
       "exceeds the limit"},
      {"header beyond file", MakeFile("{}", "").replace(0, 8, "\xe8\x03\0\0\0\0\0\0", 8),
       "runs past the end"},
      {"not JSON", MakeFile("{\"a\": ", ""), "not valid JSON"},
      {"non-object JSON", MakeFile("[1, 2, 3]", ""), "not a JSON object"},
      {"string JSON", MakeFile("\"x\"", ""), "not a JSON object"},
      {"invalid UTF-8", MakeFile("{\"\xff\": 1}", ""), "UTF-8"},
      {"deep nesting", MakeFile(std::string(100, '[') + std::string(100, ']'), ""),
       "nested too deeply"},
      {"overlap",
       MakeFile(
           "{" + Tensor1("a", "F32", "[2]", 0, 8) + "," + Tensor1("b", "F32", "[2]", 4, 12) + "}",
           std::string(12, 'x')),
       "overlap"},
      {"hole",
       MakeFile(
           "{" + Tensor1("a", "F32", "[1]", 0, 4) + "," + Tensor1("b", "F32", "[1]", 8, 12) + "}",
           std::string(12, 'x')),
       "hole of 4 bytes"},
      {"hole at start", MakeFile("{" + Tensor1("a", "F32", "[1]", 4, 8) + "}", std::string(8, 'x')),
       "hole"},
      {"bad dtype", MakeFile("{" + Tensor1("a", "F33", "[2]", 0, 8) + "}", std::string(8, 'x')),
       "unknown dtype \"F33\""},
      {"C128 is not a safetensors code",
       MakeFile("{" + Tensor1("a", "C128", "[1]", 0, 16) + "}", std::string(16, 'x')),
       "unknown dtype"},
      {"dtype not a string",
       MakeFile(R"({"a": {"dtype": 7, "shape": [1], "data_offsets": [0, 1]}})", "x"),
       "dtype is not a string"},
      {"unsupported safetensors dtype",
       MakeFile("{" + Tensor1("a", "F8_E8M0", "[2]", 0, 2) + "}", "xx"), "F8_E8M0",
       StatusCode::kUnimplemented},
      {"shape/offset mismatch", MakeFile("{" + Tensor1("a", "F32", "[3]", 0, 8) + "}", "12345678"),
       "needs 12 bytes"},
      {"negative dimension", MakeFile("{" + Tensor1("a", "F32", "[-1]", 0, 8) + "}", "12345678"),
       "bad dimension"},
      {"fractional dimension", MakeFile("{" + Tensor1("a", "U8", "[1.5]", 0, 1) + "}", "1"),
       "bad dimension"},
      {"shape overflow",
       MakeFile("{" + Tensor1("a", "F64", "[4611686018427387904, 4611686018427387904]", 0, 8) + "}",
                "12345678"),
       "tensor \"a\""},
      {"shape not an array",
       MakeFile(R"({"a": {"dtype": "U8", "shape": 1, "data_offsets": [0, 1]}})", "x"),
       "shape is not an array"},
      {"offsets reversed", MakeFile("{" + Tensor1("a", "U8", "[0]", 5, 4) + "}", ""),
       "data_offsets"},
      {"offsets not integers",
       MakeFile(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": ["0", 1]}})", "x"),
       "data_offsets"},
      {"offsets beyond u64",
       MakeFile(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1e30]}})", "x"),
       "data_offsets"},
      {"missing field", MakeFile(R"({"a": {"dtype": "U8", "shape": [1]}})", "x"),
       "lacks \"data_offsets\""},
      {"tensor not an object", MakeFile(R"({"a": [1]})", ""), "not a JSON object"},
      {"duplicate names", MakeFile("{" + a8 + "," + a8 + "}", std::string(8, 'x')),
       "repeats the key \"a\""},
      {"duplicate field",
       MakeFile(R"({"a": {"dtype": "U8", "dtype": "U8", "shape": [1], "data_offsets": [0, 1]}})",
                "x"),
       "repeats the key \"dtype\""},
      {"truncated data", MakeFile("{" + a8 + "}", "1234"), "truncated"},
      {"trailing data", MakeFile("{" + a8 + "}", "123456789"), "trailing bytes"},
      {"control character in name",
       MakeFile("{" + Tensor1("a\\u0001", "U8", "[1]", 0, 1) + "}", "x"), "tensor name"},
      {"empty name", MakeFile("{" + Tensor1("", "U8", "[1]", 0, 1) + "}", "x"), "tensor name"},
      {"metadata not an object", MakeFile(R"({"__metadata__": [1]})", ""),
       "__metadata__ is not a JSON object"},
      {"metadata value not a string", MakeFile(R"({"__metadata__": {"k": 1}})", ""),
       "__metadata__[\"k\"] is not a string"},
      {"savepoint.values not JSON", MakeFile(R"({"__metadata__": {"savepoint.values": "[{"}})", ""),
       "savepoint.values is not valid JSON"},
      {"savepoint.values bad entry",
       MakeFile(R"({"__metadata__": {"savepoint.values": "[{\"name\": \"s\", \"kind\": \"int\", )"
                R"(\"value\": \"x\"}]"}})",
                ""),
       "values[0]"},
      {"value named like a tensor",
       MakeFile(
           "{" + Tensor1("s", "U8", "[1]", 0, 1) +
               R"(, "__metadata__": {"savepoint.values": "[{\"name\": \"s\", \"kind\": \"int\", )"
               R"(\"value\": 1}]"}})",
           "x"),
       "both a tensor and a value"},
      {"savepoint.metadata not an object beside strings",
       MakeFile(R"({"__metadata__": {"savepoint.metadata": "[1]", "k": "v"}})", ""),
       "savepoint.metadata is not a JSON object"},
  };
  return c;
}

TEST(SafetensorsHostileTest, EveryHostileFileIsRejectedCleanly) {
  MemFileSystem fs;
  for (const HostileCase& c : Cases()) {
    SCOPED_TRACE(c.label);
    SP_ASSERT_OK(fs.WriteFileSynced(kPath, c.bytes));
    Result<SafetensorsInfo> info = InspectSafetensors(kPath, &fs);
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.status().code(), c.code) << info.status().ToString();
    EXPECT_NE(info.status().message().find(kPath), std::string::npos) << info.status().message();
    EXPECT_NE(info.status().message().find(c.message), std::string::npos)
        << info.status().message();
    for (bool mmap : {false, true}) {
      Result<State> s = LoadSafetensors(kPath, LoadWith(mmap), {.fs = &fs});
      EXPECT_EQ(s.status(), info.status());
    }
    SP_ASSERT_OK(fs.RemoveFile(kPath));
  }
}

TEST(SafetensorsHostileTest, ErrorsNameTheTensor) {
  MemFileSystem fs;
  SP_ASSERT_OK(fs.WriteFileSynced(
      kPath, MakeFile("{" + Tensor1("model.layer3.weight", "F16", "[4]", 0, 6) + "}", "123456")));
  Status st = InspectSafetensors(kPath, &fs).status();
  EXPECT_NE(st.message().find("\"model.layer3.weight\""), std::string::npos) << st.message();
}

// The reference writer pads with spaces; readers must not require padding or specific key order,
// and must accept what other writers produce: a null __metadata__, unknown fields, zero tensors.
TEST(SafetensorsHostileTest, AcceptsValidVariants) {
  MemFileSystem fs;
  const std::vector<std::string> ok = {
      MakeFile("{}", ""),
      MakeFile("{}      ", ""),
      MakeFile(R"({"__metadata__": null})", ""),
      MakeFile(R"({"a": {"data_offsets": [0, 2], "shape": [2], "dtype": "I8", "x": 1}})", "ab"),
      MakeFile("{" + Tensor1("e", "F32", "[0]", 0, 0) + "," + Tensor1("s", "U8", "[]", 0, 1) + "," +
                   Tensor1("t", "U8", "[0, 9]", 1, 1) + "}",
               "z"),
      MakeFile(R"({"__metadata__": {"format": "pt", "savepoint.other": "kept"}})", ""),
  };
  for (const std::string& bytes : ok) {
    SCOPED_TRACE(bytes.substr(8));
    SP_ASSERT_OK(fs.WriteFileSynced(kPath, bytes));
    Result<State> s = LoadSafetensors(kPath, {}, {.fs = &fs});
    SP_EXPECT_OK(s.status());
  }
  Result<State> s = LoadSafetensors(kPath, {}, {.fs = &fs});
  SP_ASSERT_OK(s.status());
  EXPECT_EQ(s->metadata(), (Json{{"format", "pt"}, {"savepoint.other", "kept"}}));
}

}  // namespace
}  // namespace savepoint
