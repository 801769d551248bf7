// The parts of the S3 store that need no server: URIs, settings from the environment and the AWS
// files, hostile XML answers and headers, the default file system's schemes, and retries against
// a port where nothing listens. The server tests are tests/s3/s3_store_test.cc (label s3).
#include "savepoint/s3.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/default_fs.h"
#include "io/s3_client.h"
#include "io/s3_fs.h"
#include "io/s3_xml.h"
#include "savepoint/checkpoint.h"
#include "testutil/testutil.h"

namespace savepoint::io {
namespace {

using ::savepoint::testing::StatusIs;

// Sets environment variables for one test and puts the old values back.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : kAll) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      unsetenv(name);
    }
    for (const auto& [k, v] : vars) setenv(k, v, 1);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        setenv(k.c_str(), v->c_str(), 1);
      } else {
        unsetenv(k.c_str());
      }
    }
  }

 private:
  static constexpr const char* kAll[] = {
      "AWS_ENDPOINT_URL",   "AWS_ENDPOINT_URL_S3", "AWS_REGION",
      "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",   "AWS_SECRET_ACCESS_KEY",
      "AWS_SESSION_TOKEN",  "AWS_PROFILE",         "AWS_SHARED_CREDENTIALS_FILE",
      "AWS_CONFIG_FILE",    "AWS_CA_BUNDLE",       "HOME"};
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(S3UriTest, BucketAndKeyAreCheckedAndNeverEscapeTheirPrefix) {
  S3Location loc = ParseS3Uri("s3://my-bucket/run/step-10/").value();
  EXPECT_EQ(loc.bucket, "my-bucket");
  EXPECT_EQ(loc.key, "run/step-10");
  EXPECT_EQ(loc.uri(), "s3://my-bucket/run/step-10");
  EXPECT_EQ(ParseS3Uri("s3://bkt").value().key, "");
  for (const char* bad : {"s3://", "s3://Upper/x", "s3://ab/x", "s3://bkt/a//b", "s3://bkt/a/../b",
                          "s3://bkt/./b", "s3://bkt/a\nb", "/local/path", "s3:/bkt/x"}) {
    EXPECT_THAT(ParseS3Uri(bad), StatusIs(StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_THAT(ParseS3Uri("s3://bkt/" + std::string(1025, 'k')),
              StatusIs(StatusCode::kInvalidArgument, "1024"));
}

TEST(S3OptionsTest, EnvironmentComesBeforeProfilesAndDefaultsLast) {
  ::savepoint::testing::TempDir dir;
  const std::string creds = dir.path() + "/credentials", config = dir.path() + "/config";
  std::ofstream(creds) << "[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = DEFSEC\n"
                          "[work]\naws_access_key_id=WORKKEY\naws_secret_access_key=WORKSEC\n"
                          "aws_session_token = TOK\n";
  std::ofstream(config) << "[default]\nregion = eu-west-1\n[profile work]\nregion = ap-south-1\n"
                           "endpoint_url = http://127.0.0.1:9/\n";
  {
    ScopedEnv env(
        {{"AWS_SHARED_CREDENTIALS_FILE", creds.c_str()}, {"AWS_CONFIG_FILE", config.c_str()}});
    S3Options o = ResolveS3Options({}).value();
    EXPECT_EQ(o.access_key_id, "DEFKEY");
    EXPECT_EQ(o.region, "eu-west-1");
    EXPECT_EQ(o.endpoint, "https://s3.eu-west-1.amazonaws.com");
  }
  {
    ScopedEnv env({{"AWS_SHARED_CREDENTIALS_FILE", creds.c_str()},
                   {"AWS_CONFIG_FILE", config.c_str()},
                   {"AWS_PROFILE", "work"}});
    S3Options o = ResolveS3Options({}).value();
    EXPECT_EQ(o.access_key_id, "WORKKEY");
    EXPECT_EQ(o.session_token, "TOK");
    EXPECT_EQ(o.region, "ap-south-1");
    EXPECT_EQ(o.endpoint, "http://127.0.0.1:9");
  }
  {
    ScopedEnv env({{"AWS_SHARED_CREDENTIALS_FILE", creds.c_str()},
                   {"AWS_ACCESS_KEY_ID", "ENVKEY"},
                   {"AWS_SECRET_ACCESS_KEY", "ENVSEC"},
                   {"AWS_ENDPOINT_URL", "http://127.0.0.1:8333"},
                   {"AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000"},
                   {"AWS_REGION", "us-west-2"}});
    S3Options o = ResolveS3Options({}).value();
    EXPECT_EQ(o.access_key_id, "ENVKEY");
    EXPECT_EQ(o.endpoint, "http://127.0.0.1:9000");
    EXPECT_EQ(o.region, "us-west-2");
    o = ResolveS3Options(
            {.endpoint = "http://10.0.0.1", .access_key_id = "K", .secret_access_key = "S"})
            .value();
    EXPECT_EQ(o.endpoint, "http://10.0.0.1");
    EXPECT_EQ(o.access_key_id, "K");
  }
  {
    ScopedEnv env({{"AWS_SHARED_CREDENTIALS_FILE", creds.c_str()}, {"AWS_PROFILE", "nobody"}});
    EXPECT_THAT(ResolveS3Options({}), StatusIs(StatusCode::kInvalidArgument, "\"nobody\""));
  }
  {
    ScopedEnv env({{"AWS_SHARED_CREDENTIALS_FILE", creds.c_str()}});
    S3Options named;
    named.profile = "absent";
    EXPECT_THAT(ResolveS3Options(named), StatusIs(StatusCode::kInvalidArgument, "\"absent\""));
  }
}

TEST(S3OptionsTest, OutOfRangeFieldsAreNamed) {
  ScopedEnv env({});
  EXPECT_THAT(ResolveS3Options({.endpoint = "ftp://x"}),
              StatusIs(StatusCode::kInvalidArgument, "S3Options::endpoint"));
  EXPECT_THAT(ResolveS3Options({.max_connections = 0}),
              StatusIs(StatusCode::kInvalidArgument, "S3Options::max_connections"));
  EXPECT_THAT(ResolveS3Options({.part_bytes = 1 << 20}),
              StatusIs(StatusCode::kInvalidArgument, "S3Options::part_bytes"));
  EXPECT_THAT(ResolveS3Options({.max_attempts = 0}),
              StatusIs(StatusCode::kInvalidArgument, "S3Options::max_attempts"));
  EXPECT_THAT(ResolveS3Options({.access_key_id = "only-the-id"}),
              StatusIs(StatusCode::kInvalidArgument, "S3Options::secret_access_key"));
}

TEST(S3XmlTest, ListingsParseAndHostileAnswersAreCorruption) {
  const std::string page =
      "<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>t1</NextContinuationToken>"
      "<Contents><Key>run/a</Key><Size>12</Size><LastModified>2026-11-27T04:36:08.500Z"
      "</LastModified></Contents><CommonPrefixes><Prefix>run/sub/</Prefix></CommonPrefixes>"
      "</ListBucketResult>";
  S3ListPage p = ParseS3ListPage(page, "LIST").value();
  ASSERT_EQ(p.objects.size(), 1u);
  EXPECT_EQ(p.objects[0].key, "run/a");
  EXPECT_EQ(p.objects[0].size, 12u);
  EXPECT_EQ(p.objects[0].mtime_ns, 1795754168500000000);
  EXPECT_EQ(p.prefixes, std::vector<std::string>{"run/sub/"});
  EXPECT_TRUE(p.truncated);
  EXPECT_EQ(p.next_token, "t1");
  for (const char* bad :
       {"", "not xml",
        "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size>"
        "</Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>", "<Other/>",
        "<ListBucketResult><Contents><Key>k</Key><Size>"
        "99999999999999999999999</Size></Contents></ListBucketResult>"}) {
    EXPECT_THAT(ParseS3ListPage(bad, "LIST s3://b/x"), StatusIs(StatusCode::kCorruption, "LIST"))
        << bad;
  }
  EXPECT_THAT(ParseS3UploadId("<InitiateMultipartUploadResult/>", "start"),
              StatusIs(StatusCode::kCorruption, "UploadId"));
  EXPECT_EQ(ParseS3Error("<Error><Code>SlowDown</Code><Message>m</Message></Error>").code,
            "SlowDown");
  EXPECT_EQ(ParseS3Error("garbage").code, "");
  const std::string body = S3CompleteBody({{1, "\"e1\"", "AAAAAA=="}, {2, "\"e2\"", ""}});
  EXPECT_NE(body.find("<Part><PartNumber>1</PartNumber><ETag>\"e1\"</ETag><ChecksumCRC32C>"
                      "AAAAAA==</ChecksumCRC32C></Part>"),
            std::string::npos)
      << body;
  EXPECT_EQ(S3Crc32c(std::as_bytes(std::span("hello", 5))), "mnG7TA==");
}

TEST(S3XmlTest, TimesOutsideWhatNanosecondsHoldAreZero) {
  EXPECT_EQ(ParseIso8601Ns("2262-04-11T23:47:15.999999999Z"), 9223372035999999999);
  EXPECT_EQ(ParseIso8601Ns("2262-04-11T23:47:16Z"), 0);  // ns past INT64_MAX
  EXPECT_EQ(ParseIso8601Ns("9999-99-99T99:99:99.999Z"), 0);
  EXPECT_EQ(ParseIso8601Ns("1969-12-31T23:59:59Z"), 0);
  EXPECT_EQ(ParseIso8601Ns("1970-01-01T00:00:00.5Z"), 500000000);
}

// The headers that these lines, as libcurl hands them over, leave.
std::map<std::string, std::string> HeadersOf(const std::vector<std::string>& lines) {
  std::map<std::string, std::string> headers;
  for (const std::string& line : lines) AddResponseHeader(line, &headers);
  return headers;
}

TEST(S3HeaderTest, NamesAreLowerCasedAndValuesTrimmed) {
  EXPECT_EQ(
      HeadersOf({"HTTP/1.1 200 OK\r\n", "Content-Length: 12\r\n", "ETag:\t\"e1\" \t\r\n",
                 "X-Amz-Meta-A:  a: b \r\n", "Empty:\r\n", "\r\n"}),
      (std::map<std::string, std::string>{
          {"content-length", "12"}, {"etag", "\"e1\""}, {"x-amz-meta-a", "a: b"}, {"empty", ""}}));
}

TEST(S3HeaderTest, LinesWithoutAColonOrLongerThan8KiBAreIgnored) {
  const std::string fill(kMaxS3HeaderLine, 'v');
  EXPECT_TRUE(HeadersOf({"no colon here\r\n", "\r\n", "", "long: " + fill}).empty());
  const std::string longest = "x: " + fill.substr(3);  // exactly kMaxS3HeaderLine bytes
  EXPECT_EQ(HeadersOf({longest}).at("x"), fill.substr(3));
}

TEST(S3HeaderTest, AtMost256NamesAreKeptAndARepeatedNameKeepsItsLastValue) {
  std::vector<std::string> lines;
  for (int i = 0; i < 300; ++i) lines.push_back(fmt::format("h{:03}: {}\r\n", i, i));
  lines.push_back("H000: again\r\n");
  const std::map<std::string, std::string> headers = HeadersOf(lines);
  ASSERT_EQ(headers.size(), kMaxS3Headers);
  EXPECT_EQ(headers.at("h000"), "again");
  EXPECT_EQ(headers.at("h255"), "255");
  EXPECT_FALSE(headers.contains("h256"));
}

TEST(S3HeadTest, SizeTimeChecksumAndETagAreRead) {
  S3Head h = ParseS3Head(HeadersOf({"Content-Length: 18446744073709551615\r\n",
                                    "Last-Modified: Wed, 21 Oct 2015 07:28:00 GMT\r\n",
                                    "x-amz-checksum-crc32c: mnG7TA==\r\n", "ETag: \"e1\"\r\n"}),
                         "HEAD s3://b/k")
                 .value();
  EXPECT_EQ(h.size, UINT64_MAX);
  EXPECT_EQ(h.mtime_ns, 1445412480000000000);
  EXPECT_EQ(h.crc32c, "mnG7TA==");
  EXPECT_EQ(h.etag, "\"e1\"");
  EXPECT_EQ(ParseS3Head({{"content-length", "0"}}, "HEAD").value().etag, "");
}

TEST(S3HeadTest, MissingLengthIsAnIOErrorNamingTheRequest) {
  EXPECT_THAT(ParseS3Head({{"etag", "\"e1\""}}, "HEAD s3://b/k"),
              StatusIs(StatusCode::kIOError, "HEAD s3://b/k: the answer has no Content-Length"));
}

TEST(S3HeadTest, SignedOrTrailingBytesInTheLengthAreAnIOError) {
  for (const char* bad :
       {"", "+12", "-1", "12abc", "12 34", " 12", "0x10", "1e3", "18446744073709551616"}) {
    EXPECT_THAT(ParseS3Head({{"content-length", bad}}, "HEAD s3://b/k"),
                StatusIs(StatusCode::kIOError, "HEAD s3://b/k"))
        << bad;
  }
}

TEST(S3HeadTest, AnUnreadableOrFarDateIsMtimeZero) {
  for (const char* date :
       {"", "yesterday", "Fri, 31 Dec 9999 23:59:59 GMT", "Wed, 31 Dec 1969 23:59:59 GMT"}) {
    EXPECT_EQ(ParseS3Head({{"content-length", "1"}, {"last-modified", date}}, "HEAD")->mtime_ns, 0)
        << date;
  }
}

// As SeaweedFS 4.48 answers a truncated ListMultipartUploads: no NextKeyMarker.
TEST(S3XmlTest, TruncatedUploadsPageWithoutKeyMarkerGoesOnAfterItsLastUpload) {
  const std::string body =
      "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated><KeyMarker></KeyMarker>"
      "<NextUploadIdMarker>u2</NextUploadIdMarker><Upload><Key>run/a.bin</Key>"
      "<UploadId>u1</UploadId></Upload><Upload><Key>run/b.bin</Key><UploadId>u2</UploadId>"
      "</Upload></ListMultipartUploadsResult>";
  SP_ASSERT_OK_AND_ASSIGN(S3UploadsPage page, ParseS3UploadsPage(body, "list uploads"));
  EXPECT_EQ(page.next_key_marker, "run/b.bin");
  EXPECT_EQ(page.next_upload_id_marker, "u2");
  EXPECT_THAT(ParseS3UploadsPage("<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>"
                                 "</ListMultipartUploadsResult>",
                                 "list uploads"),
              StatusIs(StatusCode::kCorruption, "names no marker"));
}

TEST(S3ListDirTest, OnlyNamesDirectlyUnderThePrefixAreListed) {
  S3ListPage page;
  page.objects = {{"ckpt/MANIFEST", 3, 0}, {"ckpt/", 0, 0}};
  page.prefixes = {"ckpt/data/"};
  std::vector<FileInfo> out;
  SP_ASSERT_OK(AppendListedChildren(page, "ckpt/", "s3://b/ckpt", &out));
  ASSERT_EQ(out.size(), 2u);  // the marker "ckpt/" is no entry
  EXPECT_EQ(out[0].name, "MANIFEST");
  EXPECT_EQ(out[1].name, "data");
  EXPECT_TRUE(out[1].is_dir);
  // A server that lists keys elsewhere, or deeper despite the delimiter, is not believed.
  for (const auto& [object, dir] :
       std::vector<std::pair<std::string, std::string>>{{"other/x", ""},
                                                        {"ckpt/a/b", ""},
                                                        {"", "ckpt/a/b/"},
                                                        {"", "elsewhere/"},
                                                        {"", "ckpt/noslash"},
                                                        {"ckp", ""}}) {
    S3ListPage lying;
    if (!object.empty()) lying.objects = {{object, 1, 0}};
    if (!dir.empty()) lying.prefixes = {dir};
    std::vector<FileInfo> none;
    EXPECT_THAT(AppendListedChildren(lying, "ckpt/", "s3://b/ckpt", &none),
                StatusIs(StatusCode::kCorruption, "not a"))
        << object << dir;
    EXPECT_TRUE(none.empty());
  }
}

TEST(DefaultFileSystemTest, OtherSchemesAreRefusedNamingThem) {
  EXPECT_EQ(SchemeOf("s3://b/k"), "s3");
  EXPECT_EQ(SchemeOf("/data/s3://x"), "");
  EXPECT_EQ(SchemeOf("relative/dir"), "");
  State s;
  SP_ASSERT_OK(s.PutValue("step", Value(int64_t{1})));
  EXPECT_THAT(Save(s, "gs://bucket/run"), StatusIs(StatusCode::kInvalidArgument, "\"gs\""));
  EXPECT_THAT(Load("hdfs://nn/run"), StatusIs(StatusCode::kInvalidArgument, "\"hdfs\""));
  EXPECT_TRUE(DefaultFileSystem()->IsObjectStore("s3://b/k"));
  EXPECT_FALSE(DefaultFileSystem()->IsObjectStore("/tmp/k"));
}

// A port on 127.0.0.1 where nothing listens (bound, never listened on).
class DeadPort {
 public:
  DeadPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~DeadPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(S3ClientTest, RefusedConnectionsAreRetriedThenAnIOErrorNamingTheObject) {
  DeadPort dead;
  ScopedEnv env({});
  S3Options o{.endpoint = "http://127.0.0.1:" + std::to_string(dead.port()),
              .access_key_id = "k",
              .secret_access_key = "s",
              .max_attempts = 3,
              .base_backoff = std::chrono::milliseconds(1),
              .max_backoff = std::chrono::milliseconds(2)};
  std::unique_ptr<S3FileSystem> fs = S3FileSystem::Create(ResolveS3Options(o).value()).value();
  EXPECT_THAT(fs->Stat("s3://bkt/run/MANIFEST"),
              StatusIs(StatusCode::kIOError, "s3://bkt/run/MANIFEST"));
  EXPECT_THAT(fs->Stat("s3://bkt/run/MANIFEST"), StatusIs(StatusCode::kIOError, "3 attempts"));
  EXPECT_EQ(fs->client()->counters().retries.load(), 4u);
  EXPECT_EQ(fs->client()->counters().head.load(), 6u);
}

}  // namespace
}  // namespace savepoint::io
