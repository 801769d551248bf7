// S3Client: the S3 REST calls savepoint makes, on libcurl.
//
// Each call is one request (one page for listings), signed with AWS Signature Version 4 by libcurl
// (CURLOPT_AWS_SIGV4; payloads are sent UNSIGNED-PAYLOAD and protected by their CRC32C instead),
// retried on retryable failures with full-jitter exponential back-off (S3Options), and turned into
// a Status naming the object: NotFound (no such key or bucket), PermissionDenied (credentials or
// signature refused: never retried), AlreadyExists (a conditional write found the object),
// IOError (the server or the network failed after every attempt, or the answer was not what S3
// sends), Corruption (an unreadable XML answer).
//
// Connections are reused across requests and threads (a curl share of the connection cache, DNS
// and TLS sessions); at most S3Options::max_connections requests are in flight, the others wait.
//
// Thread safety: every method may be called from any number of threads.
#ifndef SAVEPOINT_IO_S3_CLIENT_H_
#define SAVEPOINT_IO_S3_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/s3_xml.h"
#include "savepoint/s3.h"
#include "savepoint/status.h"

namespace savepoint::io {

// An object's address: "s3://<bucket>/<key>".
struct S3Location {
  std::string bucket;
  std::string key;  // may be empty (the bucket itself)
  std::string uri() const;
};

// Parses "s3://bucket[/key]". InvalidArgument naming the URI for a missing or malformed bucket
// name (3..63 of [a-z0-9.-]), a key longer than 1024 bytes, control characters, or a key with an
// empty, "." or ".." segment (so that no key escapes the prefix it is joined to). Trailing slashes
// are dropped.
Result<S3Location> ParseS3Uri(std::string_view uri);

// (S3Head, what HEAD returns: io/s3_xml.h.)

// An object read whole (GetObject).
struct S3Object {
  std::string data;
  std::string etag;  // as the server quotes it
};

// Requests by kind and bytes moved since the client was made (for tests and benchmarks).
struct S3Counters {
  std::atomic<uint64_t> get{0}, put{0}, head{0}, list{0}, del{0}, post{0};
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> bytes_sent{0}, bytes_received{0};
};

class S3Client {
 public:
  // `options` must be resolved (ResolveS3Options).
  static Result<std::unique_ptr<S3Client>> Create(const S3Options& options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Options& options() const { return options_; }
  const S3Counters& counters() const { return counters_; }

  // PUT of a whole object with its CRC32C (base64, x-amz-checksum-crc32c). `if_none_match`: only
  // if absent (AlreadyExists otherwise; a retry that finds an object with the same CRC32C counts
  // as success, since it is what an earlier, unanswered attempt wrote).
  Status Put(const S3Location& at, std::span<const std::byte> data, const std::string& crc32c,
             bool if_none_match);
  // PUT replacing the object only if its ETag is still `etag` (If-Match), or, with an empty
  // `etag`, only if it is absent (If-None-Match: *). Returns the new ETag. FailedPrecondition when
  // the object changed (or exists); a retry that finds the object holding these bytes counts as
  // success, as for Put.
  Result<std::string> PutIfMatch(const S3Location& at, std::span<const std::byte> data,
                                 const std::string& crc32c, const std::string& etag);
  // GET of a whole object of at most `max_bytes` (ResourceExhausted if larger) with its ETag.
  Result<S3Object> GetObject(const S3Location& at, uint64_t max_bytes);
  // GET of bytes [offset, offset + total) into `sink`, called in order with consecutive pieces;
  // `sink(nullptr, 0)` means "start again" (a retried transfer). OutOfRange when the object is
  // shorter.
  Status GetRange(const S3Location& at, uint64_t offset, uint64_t total,
                  const std::function<void(const std::byte*, size_t)>& sink);
  Result<S3Head> Head(const S3Location& at);
  // OK if the bucket exists and is reachable with these credentials.
  Status HeadBucket(const std::string& bucket);
  Status Delete(const S3Location& at);
  // One page of ListObjectsV2 of `prefix` (delimiter "/" when `delimited`), at most `max_keys`.
  Result<S3ListPage> List(const std::string& bucket, const std::string& prefix, bool delimited,
                          int max_keys, const std::string& token);

  Result<std::string> CreateMultipart(const S3Location& at);
  // Returns the part's ETag.
  Result<std::string> UploadPart(const S3Location& at, const std::string& upload_id, int number,
                                 std::span<const std::byte> data, const std::string& crc32c);
  // A retried completion refused because the object exists (412) or the upload is gone
  // (NoSuchUpload) succeeds when the object is the one these parts make (its ETag, the MD5 of
  // the parts' MD5s, says so): an earlier attempt completed it and its answer was lost.
  Status CompleteMultipart(const S3Location& at, const std::string& upload_id,
                           const std::vector<S3Part>& parts, bool if_none_match);
  Status AbortMultipart(const S3Location& at, const std::string& upload_id);
  Result<S3UploadsPage> ListMultipart(const std::string& bucket, const std::string& prefix,
                                      const std::string& key_marker,
                                      const std::string& upload_marker);

  struct Request;
  struct Response;

 private:
  explicit S3Client(const S3Options& options);
  static Request NewRequest(const char* method, std::atomic<uint64_t>* counter,
                            const std::string& bucket, const std::string& key);
  // Sends `r`, retrying as the options say; a response with a non-2xx status is an error (but a
  // 412 of a conditional request). `*attempts`, when given: the tries made.
  Result<Response> Perform(Request& r, int* attempts = nullptr);
  // One try; `*retryable` says whether a transport failure may be retried.
  Result<Response> Attempt(Request& r, bool* retryable);
  std::string Url(const Request& r) const;
  // Whether the object at `at` is the one the multipart upload of `parts` made (CompleteMultipart).
  bool CompletedBy(const S3Location& at, const std::vector<S3Part>& parts);

  const S3Options options_;
  S3Counters counters_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The base64 x-amz-checksum-crc32c value of `data`.
std::string S3Crc32c(std::span<const std::byte> data);
// ... of a CRC32C already computed.
std::string S3Crc32cOf(uint32_t crc);

}  // namespace savepoint::io

#endif  // SAVEPOINT_IO_S3_CLIENT_H_
