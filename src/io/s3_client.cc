// S3Client (io/s3_client.h) on libcurl's easy interface: one blocking transfer per calling
// thread, the connections shared.
#include "io/s3_client.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "util/base64.h"
#include "util/crc32c.h"
#include "util/random.h"

namespace savepoint::io {

struct S3Client::Request {
  const char* method = "GET";                // GET, HEAD, PUT, POST, DELETE
  std::atomic<uint64_t>* counter = nullptr;  // of S3Counters, counting the tries
  std::string bucket;
  std::string key;
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::string> headers;
  std::span<const std::byte> body;  // PUT and POST
  // GET: the body's bytes go here (with `sink(nullptr, 0)` before a retry) when the answer is
  // 2xx; returning false aborts the transfer (an answer longer than asked for);
  // 2xx; otherwise into the response's body.
  std::function<bool(const std::byte*, size_t)> sink;
  bool missing_ok = false;   // DELETE: a 404 of the object (not of the bucket) is success
  bool conditional = false;  // If-None-Match: a 412 is an answer, not an error
  std::string what;          // "PUT s3://b/k", for messages
};

S3Client::Request S3Client::NewRequest(const char* method, std::atomic<uint64_t>* counter,
                                       const std::string& bucket, const std::string& key) {
  Request r;
  r.method = method;
  r.counter = counter;
  r.bucket = bucket;
  r.key = key;
  return r;
}

struct S3Client::Response {
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names in lower case
};

namespace {

constexpr size_t kMaxBodyBytes = 16u << 20;  // error documents and XML answers

// RFC 3986 percent-encoding of everything but unreserved characters (and '/' when `keep_slash`),
// as SigV4's canonical request spells URIs and query strings.
std::string Encode(std::string_view s, bool keep_slash) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (alnum || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

bool ValidBucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  return b.front() != '.' && b.front() != '-' && b.back() != '.' && b.back() != '-';
}

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

bool RetryableCurl(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SEND_FAIL_REWIND:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

// Server trouble, throttling, and bytes damaged on the way (the server's checksum refused them:
// sent again, they arrive whole).
// The store has no room for the write: a full disk behind it (HTTP 507, MinIO's
// XMinioStorageFull) or a quota (Ceph RGW's QuotaExceeded). Not retried: like ENOSPC.
bool StoreFull(long status, const std::string& code) {
  return status == 507 || code == "XMinioStorageFull" || code == "QuotaExceeded" ||
         code == "InsufficientStorage";
}

bool RetryableHttp(long status, const std::string& code) {
  if (StoreFull(status, code)) return false;
  return status >= 500 || status == 429 || code == "SlowDown" || code == "RequestTimeout" ||
         code == "InternalError" || code == "ServiceUnavailable" || code == "BadDigest" ||
         code == "XAmzContentChecksumMismatch";
}

}  // namespace

std::string S3Location::uri() const {
  return key.empty() ? "s3://" + bucket : "s3://" + bucket + "/" + key;
}

Result<S3Location> ParseS3Uri(std::string_view uri) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format("{:?} is not a usable s3:// URI: {}", uri, why));
  };
  if (!IsS3Uri(uri)) return bad("it does not start with s3://");
  std::string_view rest = uri.substr(5);
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (!ValidBucket(loc.bucket)) {
    return bad(fmt::format("bucket name {:?} is not 3 to 63 of a-z, 0-9, '.', '-'", loc.bucket));
  }
  if (slash == std::string_view::npos) return loc;
  loc.key = std::string(rest.substr(slash + 1));
  if (loc.key.size() > 1024) return bad("the key is longer than 1024 bytes");
  size_t start = 0;
  while (start <= loc.key.size()) {
    size_t end = loc.key.find('/', start);
    if (end == std::string::npos) end = loc.key.size();
    const std::string_view seg(loc.key.data() + start, end - start);
    if (seg.empty() || seg == "." || seg == "..") {
      return bad(fmt::format("the key has an empty, '.' or '..' segment"));
    }
    start = end + 1;
  }
  for (unsigned char c : loc.key) {
    if (c < 0x20 || c == 0x7f) return bad("the key holds a control character");
  }
  return loc;
}

std::string S3Crc32cOf(uint32_t crc) {
  return Base64Encode({static_cast<uint8_t>(crc >> 24), static_cast<uint8_t>(crc >> 16),
                       static_cast<uint8_t>(crc >> 8), static_cast<uint8_t>(crc)});
}

std::string S3Crc32c(std::span<const std::byte> data) { return S3Crc32cOf(Crc32c(data)); }

// The curl share (connections, DNS, TLS sessions), a pool of easy handles and the in-flight cap.
struct S3Client::Impl {
  CURLSH* share = nullptr;
  std::mutex locks[CURL_LOCK_DATA_LAST];
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  std::vector<CURL*> idle;

  ~Impl() {
    for (CURL* h : idle) curl_easy_cleanup(h);
    if (share != nullptr) curl_share_cleanup(share);
  }
  CURL* Take(int cap) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight < cap; });
    ++in_flight;
    if (idle.empty()) return curl_easy_init();
    CURL* h = idle.back();
    idle.pop_back();
    curl_easy_reset(h);
    return h;
  }
  void Give(CURL* h) {
    {
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      if (h != nullptr) idle.push_back(h);
    }
    cv.notify_one();
  }
};

S3Client::S3Client(const S3Options& options) : options_(options), impl_(std::make_unique<Impl>()) {}
S3Client::~S3Client() = default;

Result<std::unique_ptr<S3Client>> S3Client::Create(const S3Options& options) {
  static CurlGlobal global;
  std::unique_ptr<S3Client> c(new S3Client(options));
  Impl* impl = c->impl_.get();
  impl->share = curl_share_init();
  if (impl->share == nullptr) return InternalError("curl_share_init failed");
  auto lock = [](CURL*, curl_lock_data d, curl_lock_access, void* p) {
    static_cast<Impl*>(p)->locks[d].lock();
  };
  auto unlock = [](CURL*, curl_lock_data d, void* p) { static_cast<Impl*>(p)->locks[d].unlock(); };
  curl_share_setopt(impl->share, CURLSHOPT_LOCKFUNC, +lock);
  curl_share_setopt(impl->share, CURLSHOPT_UNLOCKFUNC, +unlock);
  curl_share_setopt(impl->share, CURLSHOPT_USERDATA, impl);
  for (curl_lock_data d :
       {CURL_LOCK_DATA_CONNECT, CURL_LOCK_DATA_DNS, CURL_LOCK_DATA_SSL_SESSION}) {
    curl_share_setopt(impl->share, CURLSHOPT_SHARE, d);
  }
  return c;
}

std::string S3Client::Url(const Request& r) const {
  const size_t scheme_end = options_.endpoint.find("://") + 3;
  const bool path_style = options_.addressing == S3Addressing::kPath ||
                          (options_.addressing == S3Addressing::kAuto &&
                           options_.endpoint.find("amazonaws.com") == std::string::npos);
  std::string url;
  if (path_style) {
    url = options_.endpoint + "/" + r.bucket;
  } else {
    url = options_.endpoint.substr(0, scheme_end) + r.bucket + "." +
          options_.endpoint.substr(scheme_end);
  }
  if (!r.key.empty()) url += "/" + Encode(r.key, true);
  if (!path_style && r.key.empty()) url += "/";
  // Sorted and encoded as the canonical request has it: libcurl signs the query as it is.
  std::vector<std::pair<std::string, std::string>> q;
  for (const auto& [k, v] : r.query) q.emplace_back(Encode(k, false), Encode(v, false));
  std::sort(q.begin(), q.end());
  for (size_t i = 0; i < q.size(); ++i) {
    url += (i == 0 ? "?" : "&") + q[i].first + "=" + q[i].second;
  }
  return url;
}

namespace {

// Per-transfer state the curl callbacks see.
struct Transfer {
  CURL* h = nullptr;
  std::span<const std::byte> body;
  size_t sent = 0;
  const std::function<bool(const std::byte*, size_t)>* sink = nullptr;
  std::string error_body;  // non-2xx bodies (and 2xx bodies without a sink), capped
  std::map<std::string, std::string> headers;
  uint64_t received = 0;
};

size_t ReadBody(char* dst, size_t size, size_t n, void* p) {
  auto* t = static_cast<Transfer*>(p);
  const size_t len = std::min(size * n, t->body.size() - t->sent);
  std::memcpy(dst, t->body.data() + t->sent, len);
  t->sent += len;
  return len;
}

// libcurl rewinds a body it must send again within one transfer (a reused connection found dead).
int SeekBody(void* p, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(p);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > t->body.size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  t->sent = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

size_t WriteBody(char* src, size_t size, size_t n, void* p) {
  auto* t = static_cast<Transfer*>(p);
  const size_t len = size * n;
  long status = 0;
  curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &status);
  t->received += len;
  if (t->sink != nullptr && *t->sink && status >= 200 && status < 300) {
    return (*t->sink)(reinterpret_cast<const std::byte*>(src), len) ? len : 0;
  }
  if (t->error_body.size() + len > kMaxBodyBytes) return 0;  // fails the transfer
  t->error_body.append(src, len);
  return len;
}

size_t Header(char* src, size_t size, size_t n, void* p) {
  AddResponseHeader(std::string_view(src, size * n), &static_cast<Transfer*>(p)->headers);
  return size * n;
}

}  // namespace

Result<S3Client::Response> S3Client::Attempt(Request& r, bool* retryable) {
  *retryable = false;
  CURL* h = impl_->Take(options_.max_connections);
  if (h == nullptr) {
    impl_->Give(nullptr);
    return InternalError("curl_easy_init failed");
  }
  Transfer t;
  t.h = h;
  t.body = r.body;
  t.sink = &r.sink;
  const std::string url = Url(r);
  curl_easy_setopt(h, CURLOPT_SHARE, impl_->share);
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  // Bodies go after the server's "100 Continue" (or this long without one). The header cannot be
  // suppressed with "Expect:": libcurl's SigV4 would sign the empty header it does not send.
  curl_easy_setopt(h, CURLOPT_EXPECT_100_TIMEOUT_MS, 300L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.connect_timeout.count()));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME,
                   std::max(1L, static_cast<long>((options_.stall_timeout.count() + 999) / 1000)));
  if (!options_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, options_.ca_file.c_str());
  const std::string sigv4 = "aws:amz:" + options_.region + ":s3";
  if (!options_.access_key_id.empty()) {
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(h, CURLOPT_USERNAME, options_.access_key_id.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, options_.secret_access_key.c_str());
  }
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!options_.session_token.empty()) {
    const std::string tok = "x-amz-security-token: " + options_.session_token;
    headers = curl_slist_append(headers, tok.c_str());
  }
  for (const std::string& hd : r.headers) headers = curl_slist_append(headers, hd.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  const std::string_view method = r.method;
  if (method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(h, CURLOPT_READDATA, &t);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, SeekBody);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
  } else if (method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, reinterpret_cast<const char*>(r.body.data()));
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
  } else if (method == "DELETE") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, Header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  const CURLcode rc = curl_easy_perform(h);
  Response resp;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp.status);
  curl_slist_free_all(headers);
  // A transfer that failed midway may leave the connection in any state: do not reuse the handle.
  impl_->Give(rc == CURLE_OK ? h : (curl_easy_cleanup(h), nullptr));
  counters_.bytes_sent += t.sent;
  counters_.bytes_received += t.received;
  if (rc != CURLE_OK) {
    const std::string detail = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
    *retryable = RetryableCurl(rc);
    return IOError(fmt::format("{} (curl error {})", detail, static_cast<int>(rc)));
  }
  resp.body = std::move(t.error_body);
  resp.headers = std::move(t.headers);
  return resp;
}

Result<S3Client::Response> S3Client::Perform(Request& r, int* attempts) {
  if (r.what.empty()) r.what = fmt::format("{} {}", r.method, S3Location{r.bucket, r.key}.uri());
  std::string last;
  for (int attempt = 1;; ++attempt) {
    if (attempt > 1) {
      ++counters_.retries;
      const int64_t cap = std::min<int64_t>(
          options_.max_backoff.count(), options_.base_backoff.count() << std::min(attempt - 2, 30));
      const int64_t wait = cap > 0 ? static_cast<int64_t>(RandomU64() % (cap + 1)) : 0;
      spdlog::debug("savepoint: {} failed ({}), retry {} in {} ms", r.what, last, attempt - 1,
                    wait);
      std::this_thread::sleep_for(std::chrono::milliseconds(wait));
      if (r.sink) r.sink(nullptr, 0);  // the retry starts again
    }
    ++*r.counter;
    if (attempts != nullptr) *attempts = attempt;
    bool retryable = false;
    Result<Response> resp = Attempt(r, &retryable);
    const bool last_try = attempt >= options_.max_attempts;
    if (!resp.ok()) {
      last = resp.status().message();
      if (!retryable) return IOError(fmt::format("{}: {}", r.what, last));
      if (last_try) {
        return IOError(fmt::format("{}: failed after {} attempts: {}", r.what, attempt, last));
      }
      continue;
    }
    if (resp->status >= 200 && resp->status < 300) return resp;
    if (r.conditional && resp->status == 412) return resp;
    const S3ErrorBody err = ParseS3Error(resp->body);
    if (r.missing_ok && resp->status == 404 && err.code != "NoSuchBucket") return resp;
    last = fmt::format("HTTP {}{}{}", resp->status, err.code.empty() ? "" : " " + err.code,
                       err.message.empty() ? "" : ": " + err.message);
    if (RetryableHttp(resp->status, err.code) && !last_try) continue;
    const std::string tries = attempt > 1 ? fmt::format(" (after {} attempts)", attempt) : "";
    if (resp->status == 404 || err.code == "NoSuchKey" || err.code == "NoSuchBucket") {
      if (err.code == "NoSuchBucket") {
        return NotFoundError(fmt::format("{}: bucket {:?} does not exist", r.what, r.bucket));
      }
      return NotFoundError(fmt::format("{}: no such object ({})", r.what, last));
    }
    if (resp->status == 401 || resp->status == 403) {
      return PermissionDeniedError(fmt::format(
          "{}: access denied by the server ({}); check the credentials (AWS_ACCESS_KEY_ID, "
          "AWS_PROFILE) and the bucket's policy",
          r.what, last));
    }
    if (StoreFull(resp->status, err.code)) {
      return NoSpaceError(fmt::format("{}: the store has no space left for it ({})", r.what, last));
    }
    if (resp->status == 416) {
      return OutOfRangeError(fmt::format("{}: the range lies past the end of the object", r.what));
    }
    return IOError(fmt::format("{}: {}{}", r.what, last, tries));
  }
}

Status S3Client::Put(const S3Location& at, std::span<const std::byte> data,
                     const std::string& crc32c, bool if_none_match) {
  Request r = NewRequest("PUT", &counters_.put, at.bucket, at.key);
  r.body = data;
  r.headers.push_back("x-amz-checksum-crc32c: " + crc32c);
  r.headers.push_back("Content-Type: application/octet-stream");
  if (if_none_match) r.headers.push_back("If-None-Match: *");
  r.conditional = if_none_match;
  int attempts = 0;
  SP_ASSIGN_OR_RETURN(Response resp, Perform(r, &attempts));
  if (resp.status != 412) return Status::OK();
  // Refused because the object exists. If this call retried, an attempt whose answer was lost
  // may have written it: the same CRC32C says so.
  if (attempts > 1) {
    Result<S3Head> h = Head(at);
    if (h.ok() && h->crc32c == crc32c && h->size == data.size()) return Status::OK();
  }
  return AlreadyExistsError(
      fmt::format("{} already exists (the conditional write found it)", at.uri()));
}

Result<std::string> S3Client::PutIfMatch(const S3Location& at, std::span<const std::byte> data,
                                         const std::string& crc32c, const std::string& etag) {
  Request r = NewRequest("PUT", &counters_.put, at.bucket, at.key);
  r.body = data;
  r.headers.push_back("x-amz-checksum-crc32c: " + crc32c);
  r.headers.push_back("Content-Type: application/octet-stream");
  r.headers.push_back(etag.empty() ? std::string("If-None-Match: *") : "If-Match: " + etag);
  r.conditional = true;
  int attempts = 0;
  Result<Response> resp = Perform(r, &attempts);
  // If-Match on an object that is gone: 404 (AWS) or 412; the bucket's absence stays NotFound.
  const bool gone = !etag.empty() && resp.status().code() == StatusCode::kNotFound &&
                    resp.status().message().find("no such object") != std::string::npos;
  if (!resp.ok() && !gone) return resp.status();
  if (resp.ok() && resp->status != 412) {
    auto it = resp->headers.find("etag");
    if (it == resp->headers.end() || it->second.empty()) {
      return IOError(fmt::format("{}: the answer carries no ETag", r.what));
    }
    return it->second;
  }
  // Refused: the object changed, exists, or is gone. If this call retried, an attempt whose
  // answer was lost may have written these very bytes.
  if (attempts > 1) {
    Result<S3Object> now = GetObject(at, data.size());
    if (now.ok() && now->data.size() == data.size() &&
        std::memcmp(now->data.data(), data.data(), data.size()) == 0) {
      return now->etag;
    }
  }
  return FailedPreconditionError(
      fmt::format("{} was {} since it was read (the conditional write was refused)", at.uri(),
                  etag.empty() ? "created" : "changed"));
}

Result<S3Object> S3Client::GetObject(const S3Location& at, uint64_t max_bytes) {
  Request r = NewRequest("GET", &counters_.get, at.bucket, at.key);
  S3Object out;
  bool overlong = false;
  r.sink = [&](const std::byte* p, size_t n) {
    if (p == nullptr) {
      out.data.clear();
      return true;
    }
    if (n > max_bytes - out.data.size()) {
      overlong = true;
      return false;
    }
    out.data.append(reinterpret_cast<const char*>(p), n);
    return true;
  };
  Result<Response> resp = Perform(r);
  if (overlong) {
    return ResourceExhaustedError(
        fmt::format("{}: the object is larger than {} bytes", at.uri(), max_bytes));
  }
  SP_RETURN_IF_ERROR(resp.status());
  out.etag = resp->headers["etag"];
  if (out.etag.empty()) return IOError(fmt::format("{}: the answer carries no ETag", r.what));
  return out;
}

Status S3Client::GetRange(const S3Location& at, uint64_t offset, uint64_t total,
                          const std::function<void(const std::byte*, size_t)>& sink) {
  if (total == 0) return Status::OK();
  Request r = NewRequest("GET", &counters_.get, at.bucket, at.key);
  r.headers.push_back(fmt::format("Range: bytes={}-{}", offset, offset + total - 1));
  uint64_t got = 0;
  bool overlong = false;
  r.sink = [&](const std::byte* p, size_t n) {
    if (p == nullptr) {
      got = 0;
      sink(nullptr, 0);
      return true;
    }
    if (n > total - got) {  // more than the range: not the range asked for
      overlong = true;
      return false;
    }
    sink(p, n);
    got += n;
    return true;
  };
  r.what = fmt::format("GET {} bytes [{}, {})", at.uri(), offset, offset + total);
  Result<Response> resp = Perform(r);
  if (overlong) {
    return IOError(fmt::format("{}: the server sent more bytes than the range holds", r.what));
  }
  SP_RETURN_IF_ERROR(resp.status());
  if (resp->status != 206 && !(offset == 0 && resp->status == 200)) {
    return IOError(
        fmt::format("{}: the answer is HTTP {}, not the range (206)", r.what, resp->status));
  }
  if (got != total) {
    return OutOfRangeError(fmt::format("{}: the object ends after {} of them", r.what, got));
  }
  return Status::OK();
}

Result<S3Head> S3Client::Head(const S3Location& at) {
  Request r = NewRequest("HEAD", &counters_.head, at.bucket, at.key);
  r.headers.push_back("x-amz-checksum-mode: ENABLED");
  SP_ASSIGN_OR_RETURN(Response resp, Perform(r));
  return ParseS3Head(resp.headers, r.what);
}

Status S3Client::HeadBucket(const std::string& bucket) {
  Request r = NewRequest("HEAD", &counters_.head, bucket, "");
  Result<Response> resp = Perform(r);
  if (resp.status().code() == StatusCode::kNotFound) {
    return NotFoundError(fmt::format("bucket {:?} does not exist", bucket));
  }
  return resp.status();
}

Status S3Client::Delete(const S3Location& at) {
  Request r = NewRequest("DELETE", &counters_.del, at.bucket, at.key);
  r.missing_ok = true;  // deleting what is gone is done
  return Perform(r).status();
}

Result<S3ListPage> S3Client::List(const std::string& bucket, const std::string& prefix,
                                  bool delimited, int max_keys, const std::string& token) {
  Request r = NewRequest("GET", &counters_.list, bucket, "");
  r.query = {{"list-type", "2"}, {"prefix", prefix}, {"max-keys", std::to_string(max_keys)}};
  if (delimited) r.query.emplace_back("delimiter", "/");
  if (!token.empty()) r.query.emplace_back("continuation-token", token);
  r.what = fmt::format("LIST s3://{}/{}", bucket, prefix);
  SP_ASSIGN_OR_RETURN(Response resp, Perform(r));
  return ParseS3ListPage(resp.body, r.what);
}

Result<std::string> S3Client::CreateMultipart(const S3Location& at) {
  Request r = NewRequest("POST", &counters_.post, at.bucket, at.key);
  r.query = {{"uploads", ""}};
  r.headers.push_back("x-amz-checksum-algorithm: CRC32C");
  r.headers.push_back("Content-Type: application/octet-stream");
  r.what = fmt::format("start the multipart upload of {}", at.uri());
  SP_ASSIGN_OR_RETURN(Response resp, Perform(r));
  return ParseS3UploadId(resp.body, r.what);
}

Result<std::string> S3Client::UploadPart(const S3Location& at, const std::string& upload_id,
                                         int number, std::span<const std::byte> data,
                                         const std::string& crc32c) {
  Request r = NewRequest("PUT", &counters_.put, at.bucket, at.key);
  r.query = {{"partNumber", std::to_string(number)}, {"uploadId", upload_id}};
  r.body = data;
  r.headers.push_back("x-amz-checksum-crc32c: " + crc32c);
  r.what = fmt::format("PUT {} part {}", at.uri(), number);
  SP_ASSIGN_OR_RETURN(Response resp, Perform(r));
  std::string etag = resp.headers["etag"];
  if (etag.empty()) return IOError(fmt::format("{}: the answer has no ETag", r.what));
  return etag;
}

Status S3Client::CompleteMultipart(const S3Location& at, const std::string& upload_id,
                                   const std::vector<S3Part>& parts, bool if_none_match) {
  Request r = NewRequest("POST", &counters_.post, at.bucket, at.key);
  r.query = {{"uploadId", upload_id}};
  const std::string body = S3CompleteBody(parts);
  r.body = std::as_bytes(std::span(body));
  r.headers.push_back("Content-Type: application/xml");
  if (if_none_match) r.headers.push_back("If-None-Match: *");
  r.conditional = if_none_match;
  r.what = fmt::format("complete the multipart upload of {}", at.uri());
  // S3 may answer 200 with an <Error> document when the completion fails after it started; a
  // retryable one is tried again like any other.
  int tries = 0;
  for (int attempt = 1;; ++attempt) {
    int attempts = 0;
    Result<Response> answer = Perform(r, &attempts);
    tries += attempts;
    const bool gone = answer.status().code() == StatusCode::kNotFound &&
                      answer.status().message().find("NoSuchUpload") != std::string::npos;
    const bool exists = answer.ok() && answer->status == 412;
    if ((gone || exists) && tries > 1 && CompletedBy(at, parts)) return Status::OK();
    SP_RETURN_IF_ERROR(answer.status());
    Response& resp = *answer;
    if (exists) {
      return AlreadyExistsError(
          fmt::format("{} already exists (the conditional write found it)", at.uri()));
    }
    const S3ErrorBody err = ParseS3Error(resp.body);
    if (err.code.empty()) return Status::OK();
    if (!RetryableHttp(500, err.code) || attempt >= options_.max_attempts) {
      return IOError(fmt::format("{}: {}: {}", r.what, err.code, err.message));
    }
    ++counters_.retries;
  }
}

bool S3Client::CompletedBy(const S3Location& at, const std::vector<S3Part>& parts) {
  // A multipart object's ETag: the hex MD5 of its parts' binary MD5s, "-", the number of parts.
  std::string digests;
  for (const S3Part& p : parts) {
    std::string_view hex = p.etag;
    if (hex.size() == 34 && hex.front() == '"' && hex.back() == '"') hex = hex.substr(1, 32);
    if (hex.size() != 32) return false;  // not an MD5 (an encrypted store's ETag)
    for (size_t i = 0; i < 32; i += 2) {
      unsigned byte = 0;
      if (std::from_chars(hex.data() + i, hex.data() + i + 2, byte, 16).ec != std::errc()) {
        return false;
      }
      digests.push_back(static_cast<char>(byte));
    }
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(digests.data(), digests.size(), md, &n, EVP_md5(), nullptr) != 1) return false;
  std::string want;
  for (unsigned int i = 0; i < n; ++i) want += fmt::format("{:02x}", md[i]);
  want = fmt::format("\"{}-{}\"", want, parts.size());
  Result<S3Head> h = Head(at);
  if (!h.ok() || h->etag != want) return false;
  spdlog::info("savepoint: {}: an earlier attempt completed it (its answer was lost)", at.uri());
  return true;
}

Status S3Client::AbortMultipart(const S3Location& at, const std::string& upload_id) {
  Request r = NewRequest("DELETE", &counters_.del, at.bucket, at.key);
  r.query = {{"uploadId", upload_id}};
  r.what = fmt::format("abort the multipart upload of {}", at.uri());
  return Perform(r).status();
}

Result<S3UploadsPage> S3Client::ListMultipart(const std::string& bucket, const std::string& prefix,
                                              const std::string& key_marker,
                                              const std::string& upload_marker) {
  Request r = NewRequest("GET", &counters_.list, bucket, "");
  r.query = {{"uploads", ""}, {"prefix", prefix}};
  if (!key_marker.empty()) r.query.emplace_back("key-marker", key_marker);
  if (!upload_marker.empty()) r.query.emplace_back("upload-id-marker", upload_marker);
  r.what = fmt::format("list the multipart uploads under s3://{}/{}", bucket, prefix);
  SP_ASSIGN_OR_RETURN(Response resp, Perform(r));
  return ParseS3UploadsPage(resp.body, r.what);
}

}  // namespace savepoint::io
