// io::DirectFile: whole blocks through the O_DIRECT handle, a file's partial last block through the
// buffered one; the bytes read back are the bytes written, on POSIX (O_DIRECT where the file
// system grants it) and in memory.
#include "io/direct_file.h"

#include <cstring>
#include <string>
#include <vector>

#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

// Writes `size` patterned bytes in pieces of `piece` (4 KiB multiples; the last one partial) and
// checks the file's contents.
void WriteAndCheck(FileSystem* fs, const std::string& path, uint64_t size, uint64_t piece) {
  std::vector<std::byte> bytes(size);
  for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>((i * 131) >> 3);
  // O_DIRECT needs aligned memory: copy each piece into a 4 KiB-aligned buffer.
  Tensor staging = Tensor::Empty(DType::kU8, {static_cast<int64_t>(piece)}).value();
  SP_ASSERT_OK_AND_ASSIGN(io::DirectFile f, io::DirectFile::Create(fs, path, true, size));
  for (uint64_t at = 0; at < size; at += piece) {
    const uint64_t n = std::min(piece, size - at);
    std::memcpy(staging.data(), bytes.data() + at, n);
    SP_ASSERT_OK(f.WriteAt(at, std::span<const std::byte>(staging.data(), n)));
  }
  SP_ASSERT_OK(f.Finish());
  SP_ASSERT_OK_AND_ASSIGN(std::string back, fs->ReadFile(path, size + 1));
  ASSERT_EQ(back.size(), size);
  EXPECT_EQ(std::memcmp(back.data(), bytes.data(), size), 0);
}

TEST(DirectFile, PartialLastBlockOnPosix) {
  testing::TempDir dir;
  for (uint64_t size : {uint64_t{1}, uint64_t{4095}, uint64_t{8192}, uint64_t{3 * 4096 + 17}}) {
    SCOPED_TRACE(size);
    WriteAndCheck(DefaultFileSystem(), dir.Sub("f" + std::to_string(size)), size, 8192);
  }
}

TEST(DirectFile, InMemory) {
  MemFileSystem mem;
  WriteAndCheck(&mem, "/f", 3 * 4096 + 17, 4096);
}

TEST(DirectFile, MissingParentIsAnError) {
  MemFileSystem mem;
  EXPECT_FALSE(io::DirectFile::Create(&mem, "/no/such/dir/f", true, 10).ok());
}

}  // namespace
}  // namespace savepoint
