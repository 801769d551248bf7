// The XML bodies (pugixml) and the headers of S3 responses, read as untrusted input: a body that is
// not XML, lacks what the request needs or holds numbers out of range is Corruption naming the
// request, never a crash; headers are kept within fixed bounds. Also the one XML body savepoint
// sends (CompleteMultipartUpload). fuzz/s3_response_fuzzer.cc fuzzes all of them.
#ifndef SAVEPOINT_IO_S3_XML_H_
#define SAVEPOINT_IO_S3_XML_H_

#include <cstddef>
#include <cstdint>
#include <map>
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
// A truncated page without NextKeyMarker (SeaweedFS names only NextUploadIdMarker) continues after
// its last upload; truncated with neither that nor an upload is Corruption.
Result<S3UploadsPage> ParseS3UploadsPage(std::string_view body, std::string_view what);

// A part of a multipart upload as CompleteMultipartUpload lists it.
struct S3Part {
  int number = 0;
  std::string etag;
  std::string crc32c;  // base64, as sent with the part
};
std::string S3CompleteBody(const std::vector<S3Part>& parts);

// "2026-11-27T04:36:08Z" or "2026-11-27T04:36:08.123Z" -> ns since the epoch; 0 if unreadable or
// outside 1970..2262 (what ns since the epoch in an int64_t can hold).
int64_t ParseIso8601Ns(std::string_view text);

// At most kMaxS3Headers header names are kept of one response, each line at most kMaxS3HeaderLine
// bytes long: a server cannot make the client hold more than 2 MiB of headers.
inline constexpr size_t kMaxS3Headers = 256;
inline constexpr size_t kMaxS3HeaderLine = 8192;

// Adds one header line of a response (untrusted: "Name: value\r\n", as libcurl hands each line
// over) to `headers`, the name in lower case, the value without the blanks around it and the line
// end; a repeated name keeps its last value. Ignored: a line without a colon (the status line, the
// empty line after the headers), a line longer than kMaxS3HeaderLine, and a new name when
// `headers` holds kMaxS3Headers already.
void AddResponseHeader(std::string_view line, std::map<std::string, std::string>* headers);

// What HEAD returns.
struct S3Head {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string crc32c;  // x-amz-checksum-crc32c when the server keeps it (base64), else empty
  std::string etag;    // as the server quotes it
};

// The HEAD answer whose headers (untrusted; names in lower case, as AddResponseHeader keeps them)
// are `headers`. IOError naming `what` when Content-Length is absent or not a plain decimal of at
// most 2^64 - 1 (no sign, no blanks, nothing after the digits); Last-Modified (an HTTP date) is
// mtime_ns 0 when absent or unreadable.
Result<S3Head> ParseS3Head(const std::map<std::string, std::string>& headers,
                           std::string_view what);

}  // namespace savepoint::io

#endif  // SAVEPOINT_IO_S3_XML_H_
