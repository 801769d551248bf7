// A tensor larger than 4 GiB round-trips (32-bit truncation of sizes, offsets or CRC lengths
// would break it). Uses the in-memory file system; the source is a lazily zero-filled anonymous
// mapping with sentinels, so only the written copy and the loaded copy take memory (~8.6 GiB).
#include <sys/mman.h>

#include <cstring>

#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

constexpr uint64_t kElems = (uint64_t{4} << 30) + 12345;  // U8 elements: 4 GiB + 12345 bytes

std::byte* MapZeros(uint64_t n) {
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

TEST(LargeTensor, MoreThan4GiBRoundTrips) {
  std::byte* src = MapZeros(kElems);
  ASSERT_NE(src, nullptr);
  const uint64_t marks[] = {0, (uint64_t{1} << 32) - 1, uint64_t{1} << 32, kElems - 1};
  for (uint64_t m : marks) src[m] = static_cast<std::byte>(0xA5 ^ (m & 0xff));
  State s;
  SP_ASSERT_OK(s.PutView("huge", TensorView(src, DType::kU8, {int64_t(kElems)})));
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  SaveOptions so;
  so.chunk_bytes = 64 << 20;
  SP_ASSERT_OK(Save(s, "/ck", so, io));
  ::munmap(src, kElems);

  auto reader = CheckpointReader::Open("/ck", {}, io);
  SP_ASSERT_OK(reader.status());
  EXPECT_EQ((*reader)->tensors()[0].nbytes, kElems);
  EXPECT_EQ((*reader)->tensors()[0].num_chunks, (kElems + so.chunk_bytes - 1) / so.chunk_bytes);

  std::byte* dst = MapZeros(kElems);
  ASSERT_NE(dst, nullptr);
  SP_ASSERT_OK((*reader)->ReadTensor("huge", TensorView(dst, DType::kU8, {int64_t(kElems)})));
  for (uint64_t m : marks) EXPECT_EQ(dst[m], static_cast<std::byte>(0xA5 ^ (m & 0xff))) << m;
  EXPECT_EQ(dst[12345], std::byte{0});
  ::munmap(dst, kElems);
}

}  // namespace
}  // namespace savepoint
