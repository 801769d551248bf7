// Shared fixtures of the encrypted-checkpoint tests (engine/encryption_test.cc,
// engine/encryption_tamper_test.cc, distributed/dist_encryption_test.cc): a state with every kind
// of tensor the writers treat differently, keys, and helpers to read and rewrite a checkpoint's
// manifest. Tests only.
#ifndef SAVEPOINT_ENGINE_ENCRYPTION_TESTUTIL_H_
#define SAVEPOINT_ENGINE_ENCRYPTION_TESTUTIL_H_

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <string_view>

#include "format/manifest.h"
#include "savepoint/savepoint.h"
#include "testutil/testutil.h"

namespace savepoint::testing {

inline constexpr uint64_t kEncChunk = 64 << 10;  // also the Checkpointer's slab (its minimum)
inline constexpr char kEncDataFile[] = "data-00000-00000.spd";

// 32-byte keys; kKeyB is another key of the same size.
inline const std::string kKeyA = "0123456789abcdef0123456789ABCDEF";
inline const std::string kKeyB = "fedcba9876543210fedcba9876543210";

// Random multi-chunk data (incompressible), mostly-zero data (compressible), tensors below 64 KiB
// (packed in format version 2), a scalar, an empty tensor, values of several kinds and metadata.
inline State EncState(uint64_t seed) {
  State s;
  auto make = [](DType d, Shape shape) { return Tensor::Zeros(d, std::move(shape)).value(); };
  Tensor rnd = make(DType::kF32, {64, 1000});  // 256000 bytes: 4 chunks
  FillPattern(rnd.view(), seed);
  Tensor zeros = make(DType::kF64, {40000});  // 320000 bytes, 1 in 1000 elements set
  for (int64_t i = 0; i < 40000; i += 1000) zeros.as<double>()[i] = 1.5 * i;
  Tensor bias = make(DType::kF32, {16});
  FillPattern(bias.view(), seed + 1);
  Tensor step = make(DType::kI64, {});
  FillPattern(step.view(), seed + 2);
  Tensor mid = make(DType::kU8, {70001});  // just above the packing limit, odd size
  FillPattern(mid.view(), seed + 3);
  EXPECT_TRUE(s.Put("rand.f32", std::move(rnd)).ok());
  EXPECT_TRUE(s.Put("zeros.f64", std::move(zeros)).ok());
  EXPECT_TRUE(s.Put("opt.bias", std::move(bias)).ok());
  EXPECT_TRUE(s.Put("opt.step", std::move(step)).ok());
  EXPECT_TRUE(s.Put("mid.u8", std::move(mid)).ok());
  EXPECT_TRUE(s.Put("empty.f32", make(DType::kF32, {0, 5})).ok());
  EXPECT_TRUE(s.PutValue("step", int64_t{12}).ok());
  EXPECT_TRUE(s.PutValue("rng", Value(Bytes{{1, 2, 3, 255}})).ok());
  s.metadata() = Json{{"run", "encryption"}};
  return s;
}

inline SaveOptions EncSave(const std::string& key) {
  SaveOptions o;
  o.chunk_bytes = kEncChunk;
  o.key = EncryptionKey::FromBytes(key);
  return o;
}

inline LoadOptions EncLoad(const std::string& key) {
  LoadOptions o;
  o.key = EncryptionKey::FromBytes(key);
  return o;
}

inline bool Has(const Status& s, std::string_view needle) {
  return s.message().find(needle) != std::string::npos;
}

// The decoded MANIFEST of the checkpoint at `dir` (not authenticated).
inline format::Manifest ReadManifest(FileSystem* fs, const std::string& dir) {
  Result<std::string> bytes = fs->ReadFile(JoinPath(dir, "MANIFEST"), 1 << 24);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  Result<format::Manifest> m = format::DecodeManifest(bytes.ok() ? *bytes : "", dir);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : format::Manifest{};
}

// Writes `m` as the MANIFEST of `dir`, authenticated with `key` (as the writer would), or with a
// zero MAC when `key` is empty (as someone without the key would).
inline void WriteManifest(FileSystem* fs, const std::string& dir, const format::Manifest& m,
                          const std::string& key) {
  std::string bytes;
  if (key.empty()) {
    bytes = format::EncodeManifest(m);
  } else {
    auto keys = format::CheckpointKeys::Derive(SecretBytes(key), m.encryption.salt).value();
    bytes = format::EncodeManifest(m, &keys);
  }
  ASSERT_TRUE(fs->WriteFileSynced(JoinPath(dir, "MANIFEST"), bytes).ok());
}

// The shard of tensor `name` in `m`.
inline format::ShardRecord& ShardOf(format::Manifest& m, std::string_view name, size_t shard = 0) {
  for (auto& t : m.tensors) {
    if (t.name == name) return t.shards.at(shard);
  }
  ADD_FAILURE() << "no tensor " << name;
  return m.tensors.at(0).shards.at(0);
}

}  // namespace savepoint::testing

#endif  // SAVEPOINT_ENGINE_ENCRYPTION_TESTUTIL_H_
