// Checkpoints in S3-compatible object storage (AWS S3, the S3 APIs of GCS, Ceph RGW, SeaweedFS,
// MinIO) behind the FileSystem seam.
//
// Paths are URIs "s3://<bucket>/<key>"; a directory is a key prefix ("s3://b/run/step-10" holds
// "run/step-10/MANIFEST", "run/step-10/data-00000-00000.spd", ...). Every call that takes a
// checkpoint path takes such a URI: DefaultFileSystem() sends "s3://" paths to a process-wide S3
// file system built from the environment on first use, so
//
//   SP_RETURN_IF_ERROR(savepoint::Save(state, "s3://bucket/run/step-10"));
//
// needs nothing more than the usual AWS variables. To choose the settings in code instead:
//
//   SP_ASSIGN_OR_RETURN(auto s3, savepoint::NewS3FileSystem({.endpoint = "http://10.0.0.5:8333"}));
//   SP_RETURN_IF_ERROR(savepoint::Save(state, "s3://bucket/run/step-10", {}, {.fs = s3.get()}));
//
// A checkpoint in a bucket is the same directory layout and MANIFEST as on a disk, committed
// without renames (docs/FORMAT.md §5): data objects first, each written only if absent, then the
// MANIFEST, written only if absent. docs/OBJECT_STORAGE.md is the user's guide.
//
// Requests are signed with AWS Signature Version 4 (libcurl's CURLOPT_AWS_SIGV4), retried with
// jittered exponential back-off on 5xx, SlowDown, timeouts and connection resets, and carry the
// CRC32C of their bytes (x-amz-checksum-crc32c), which the server checks.
#ifndef SAVEPOINT_S3_H_
#define SAVEPOINT_S3_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {

// How a request names its bucket.
enum class S3Addressing {
  // Virtual-hosted for an AWS endpoint (one under amazonaws.com), path style for any other (a
  // local or private server).
  kAuto,
  // http(s)://endpoint/<bucket>/<key>
  kPath,
  // http(s)://<bucket>.endpoint/<key>
  kVirtualHosted,
};

// Settings of an S3 file system. Empty strings are resolved from the environment and the AWS
// configuration files by ResolveS3Options, from the sources each field names, in the order the AWS
// CLI reads them (static keys only: not instance metadata, web identity, SSO or
// credential_process). Every field is honoured.
struct SAVEPOINT_API S3Options {
  // "http(s)://host[:port]". Empty: AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then the
  // profile's endpoint_url, then "https://s3.<region>.amazonaws.com".
  std::string endpoint = {};
  // Region signed into every request. Empty: AWS_REGION, then AWS_DEFAULT_REGION, then the
  // profile's region, then "us-east-1".
  std::string region = {};
  // Credentials. An empty access_key_id takes all three from AWS_ACCESS_KEY_ID,
  // AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, else from the profile in the shared credentials
  // file (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials) or the config file
  // (AWS_CONFIG_FILE, default ~/.aws/config). With no credentials anywhere, requests go unsigned
  // (public buckets). session_token may be empty.
  std::string access_key_id = {};
  std::string secret_access_key = {};
  std::string session_token = {};
  // Profile of the AWS files to read. Empty: AWS_PROFILE, then "default". A profile named here or
  // by AWS_PROFILE must hold credentials (else InvalidArgument).
  std::string profile = {};
  // Default: kAuto.
  S3Addressing addressing = S3Addressing::kAuto;
  // CA bundle for TLS. Empty: AWS_CA_BUNDLE, else the system's CA store.
  std::string ca_file = {};
  // Requests in flight at once through this file system (threads beyond it wait), 1..256.
  // Default: 16.
  int max_connections = 16;
  // Part size of multipart uploads, 5 MiB..5 GiB. An object of at most one part is one PUT. A file
  // whose announced size (WritableFile::Preallocate) needs more than 10,000 parts uses parts of the
  // smallest multiple of this size that fits. Default: 16 MiB.
  uint64_t part_bytes = uint64_t{16} << 20;
  // Tries of one request, the first included, on a retryable failure (HTTP 5xx, 429, SlowDown,
  // RequestTimeout, a connection reset or refused, a timeout), 1..100. Default: 8.
  int max_attempts = 8;
  // Back-off before retry n (n = 1, 2, ...): a random wait in [0, min(max_backoff, base_backoff ×
  // 2^(n-1))] ("full jitter"). Defaults: 50 ms and 5 s.
  std::chrono::milliseconds base_backoff{50};
  std::chrono::milliseconds max_backoff{5000};
  // Time to open a connection. Default: 10 s.
  std::chrono::milliseconds connect_timeout{10000};
  // A request that moves no byte for this long fails as a timeout (and is retried). Default: 30 s.
  std::chrono::milliseconds stall_timeout{30000};
};

// `options` with every empty field filled from the environment and the AWS files (see the fields),
// checked: InvalidArgument naming the field for an endpoint that is not http(s)://, counts, sizes
// or durations out of range, a secret without a key id, or a named profile without credentials.
SAVEPOINT_API Result<S3Options> ResolveS3Options(S3Options options);

// A FileSystem serving "s3://bucket/key" paths with the resolved `options`. Thread-safe. Paths
// without the scheme are refused with InvalidArgument. What it does not do: Rename (savepoint
// commits there without it; Unimplemented), MapFile (Unimplemented), direct I/O (ignored, files
// report direct() == false). A file being written is buffered in parts of part_bytes and appears
// in the bucket whole when Sync or Close publishes it; it is written once (a write after that is
// FailedPrecondition).
SAVEPOINT_API Result<std::unique_ptr<FileSystem>> NewS3FileSystem(const S3Options& options);

// Requests an S3 file system made, by kind, and the bytes it moved, since it was made (tries
// count: a retried request counts each time). For benchmarks and tests: requests per GiB, and a
// restore that makes no LIST.
struct SAVEPOINT_API S3RequestCounts {
  uint64_t get = 0, put = 0, head = 0, list = 0, del = 0, post = 0;
  uint64_t retries = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
};

// The counts of `fs` when NewS3FileSystem made it; with nullptr, of the S3 file system that
// DefaultFileSystem() serves s3:// URIs with (all zero before its first use). InvalidArgument for
// another file system.
SAVEPOINT_API Result<S3RequestCounts> S3Requests(FileSystem* fs = nullptr);

// Whether `path` starts with "s3://".
SAVEPOINT_API bool IsS3Uri(std::string_view path);

}  // namespace savepoint

#endif  // SAVEPOINT_S3_H_
