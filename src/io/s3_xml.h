// The XML bodies of S3 responses (pugixml), read as untrusted input: a body that is not XML, lacks
// what the request needs or holds numbers out of range is Corruption naming the request, never a
// crash. Also the one XML body savepoint sends (CompleteMultipartUpload).
#ifndef SAVEPOINT_IO_S3_XML_H_
#define SAVEPOINT_IO_S3_XML_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/status.h"

namespace savepoint::io {

// <Error><Code>..</Code><Message>..</Message></Error>; empty fields when the body is not one.
struct S3ErrorBody {
  std::string code;
  std::string message;
};
S3ErrorBody ParseS3Error(std::string_view body);

struct S3ObjectEntry {
  std::string key;
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // LastModified (0 when absent or unreadable)
};

// One page of ListObjectsV2.
struct S3ListPage {
  std::vector<S3ObjectEntry> objects;
  std::vector<std::string> prefixes;  // CommonPrefixes
  bool truncated = false;
  std::string next_token;  // NextContinuationToken when truncated
};
Result<S3ListPage> ParseS3ListPage(std::string_view body, std::string_view what);

// InitiateMultipartUploadResult's UploadId.
Result<std::string> ParseS3UploadId(std::string_view body, std::string_view what);

// One upload of ListMultipartUploads.
struct S3UploadEntry {
  std::string key;
  std::string upload_id;
  int64_t initiated_ns = 0;
};
struct S3UploadsPage {
  std::vector<S3UploadEntry> uploads;
  bool truncated = false;
  std::string next_key_marker;
  std::string next_upload_id_marker;
};
Result<S3UploadsPage> ParseS3UploadsPage(std::string_view body, std::string_view what);

// A part of a multipart upload as CompleteMultipartUpload lists it.
struct S3Part {
  int number = 0;
  std::string etag;
  std::string crc32c;  // base64, as sent with the part
};
std::string S3CompleteBody(const std::vector<S3Part>& parts);

// "2026-11-27T04:36:08Z" or "2026-11-27T04:36:08.123Z" -> ns since the epoch; 0 if unreadable.
int64_t ParseIso8601Ns(std::string_view text);

}  // namespace savepoint::io

#endif  // SAVEPOINT_IO_S3_XML_H_
