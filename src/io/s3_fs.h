// S3FileSystem: the FileSystem seam over an S3 bucket (savepoint/s3.h is the public face).
//
// Mapping: "s3://b/dir/file" is object "dir/file" of bucket "b"; a directory exists while some
// object has its key as a prefix ("dir/"); CreateDir and SyncDir do nothing (prefixes need no
// creation and a published object is durable); RemoveDir refuses a prefix that still holds objects.
// Writable files buffer their bytes in parts (S3Options::part_bytes): a part is uploaded as soon
// as it is complete (a write covering a whole part is uploaded from the caller's memory, without a
// copy); Sync or Close publishes the object (one PUT, or the last parts and
// CompleteMultipartUpload), with If-None-Match: * when FileOptions::exclusive. A file dropped
// without being published aborts its multipart upload. Readable files HEAD the object once and
// read with ranged GETs; ReadAtMany coalesces nearby ranges into one GET each and runs the GETs in
// parallel.
//
// Thread safety: as FileSystem's.
#ifndef SAVEPOINT_IO_S3_FS_H_
#define SAVEPOINT_IO_S3_FS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/s3_client.h"
#include "savepoint/filesystem.h"
#include "savepoint/s3.h"

namespace savepoint::io {

class S3FileSystem final : public FileSystem {
 public:
  // `options` must be resolved (ResolveS3Options).
  static Result<std::unique_ptr<S3FileSystem>> Create(const S3Options& options);

  S3Client* client() const { return client_.get(); }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const FileOptions& options) override;
  Status CreateDir(const std::string& path) override;
  Result<std::vector<FileInfo>> ListDir(const std::string& path) override;
  Result<FileInfo> Stat(const std::string& path) override;
  Status RemoveFile(const std::string& path) override;
  Status RemoveDir(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& path) override;
  bool IsObjectStore(const std::string& path) override;
  // Lists the multipart uploads under `root`'s key prefix (ListMultipartUploads, every page) and
  // aborts those initiated before `before_ns`.
  Result<std::vector<std::string>> AbortAbandonedWrites(const std::string& root, int64_t before_ns,
                                                        bool dry_run) override;
  // GET with the object's ETag; PUT with If-Match (or If-None-Match: * for an empty version).
  Result<VersionedFile> ReadVersioned(const std::string& path, uint64_t max_bytes) override;
  Result<std::string> WriteIfVersion(const std::string& path, std::string_view contents,
                                     const std::string& version) override;

 private:
  explicit S3FileSystem(std::unique_ptr<S3Client> client) : client_(std::move(client)) {}
  // Whether some object's key starts with `prefix`.
  Result<bool> AnyUnder(const S3Location& dir);

  std::unique_ptr<S3Client> client_;
};

// Appends to *out the entries a ListObjectsV2 page (asked with delimiter '/') lists directly under
// `prefix` ("dir/", or "" for the bucket), by their names below it; a directory marker (the
// prefix itself) is skipped. A key or common prefix that is not directly under `prefix` (a lying
// or broken server) is Corruption naming `path` and the key: never a name to act on.
Status AppendListedChildren(const S3ListPage& page, std::string_view prefix, std::string_view path,
                            std::vector<FileInfo>* out);

}  // namespace savepoint::io

#endif  // SAVEPOINT_IO_S3_FS_H_
