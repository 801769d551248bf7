// Fuzz target for what an S3 server answers (src/io/s3_xml.h): a lying or broken server's bodies
// and headers. The first byte ('0' + n, taken modulo 7) picks the decoder, the rest is its input:
//   0 an error document         1 a ListObjectsV2 page        2 an InitiateMultipartUpload result
//   3 a ListMultipartUploads page 4 a header block (lines) read as a HEAD answer
//   5 an ISO 8601 time          6 lines made parts of a CompleteMultipartUpload body
// Properties (std::abort on violation): no crash or sanitizer report; what parses, written back as
// XML, parses to the same value; at most kMaxS3Headers names are kept, in lower case, trimmed;
// HEAD succeeds exactly when Content-Length is a plain decimal of 64 bits, and gives its value; a
// time that reads, printed back (with and without its fraction), reads the same; the body
// savepoint sends parses back (pugixml) to the parts it was made of, in order.
#include <fmt/format.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <map>
#include <pugixml.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/s3_xml.h"

namespace {

using namespace savepoint;
using namespace savepoint::io;

void Require(bool property) {
  if (!property) std::abort();
}

// `s` as XML character data: markup, blanks and control characters as character references, so
// that it parses back exactly (a raw CR would read as LF, blank-only text as nothing).
std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || c == '&' || c == '<' || c == '>') {
      out += fmt::format("&#{};", u);
    } else {
      out += c;
    }
  }
  return out;
}

std::string Element(std::string_view name, std::string_view text) {
  return fmt::format("<{0}>{1}</{0}>", name, Escape(text));
}

// ns since the epoch as "YYYY-MM-DDTHH:MM:SS[.nnnnnnnnn]Z" (0: empty, as a missing date reads).
std::string Iso8601(int64_t ns, bool fraction) {
  if (ns == 0) return {};
  const time_t s = static_cast<time_t>(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char whole[32];
  std::strftime(whole, sizeof(whole), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!fraction) return fmt::format("{}Z", whole);
  return fmt::format("{}.{:09}Z", whole, ns % 1000000000);
}

void ErrorDocument(std::string_view body) {
  const S3ErrorBody e = ParseS3Error(body);
  const S3ErrorBody back = ParseS3Error(
      fmt::format("<Error>{}{}</Error>", Element("Code", e.code), Element("Message", e.message)));
  Require(back.code == e.code && back.message == e.message);
}

void ListPage(std::string_view body) {
  Result<S3ListPage> page = ParseS3ListPage(body, "list");
  if (!page.ok()) return;
  std::string xml = "<ListBucketResult>";
  for (const S3ObjectEntry& o : page->objects) {
    xml += fmt::format("<Contents>{}{}{}</Contents>", Element("Key", o.key),
                       Element("Size", std::to_string(o.size)),
                       Element("LastModified", Iso8601(o.mtime_ns, true)));
  }
  for (const std::string& p : page->prefixes) {
    xml += fmt::format("<CommonPrefixes>{}</CommonPrefixes>", Element("Prefix", p));
  }
  xml += Element("IsTruncated", page->truncated ? "true" : "false");
  xml += Element("NextContinuationToken", page->next_token) + "</ListBucketResult>";
  Result<S3ListPage> back = ParseS3ListPage(xml, "written back");
  Require(back.ok() && back->truncated == page->truncated && back->next_token == page->next_token &&
          back->prefixes == page->prefixes && back->objects.size() == page->objects.size());
  for (size_t i = 0; i < page->objects.size(); ++i) {
    const S3ObjectEntry &a = page->objects[i], &b = back->objects[i];
    Require(a.key == b.key && a.size == b.size && a.mtime_ns == b.mtime_ns);
  }
}

void UploadId(std::string_view body) {
  Result<std::string> id = ParseS3UploadId(body, "initiate");
  if (!id.ok()) return;
  Result<std::string> back = ParseS3UploadId(
      fmt::format("<InitiateMultipartUploadResult>{}</InitiateMultipartUploadResult>",
                  Element("UploadId", *id)),
      "written back");
  Require(back.ok() && *back == *id);
}

void UploadsPage(std::string_view body) {
  Result<S3UploadsPage> page = ParseS3UploadsPage(body, "uploads");
  if (!page.ok()) return;
  std::string xml = "<ListMultipartUploadsResult>";
  for (const S3UploadEntry& u : page->uploads) {
    xml += fmt::format("<Upload>{}{}{}</Upload>", Element("Key", u.key),
                       Element("UploadId", u.upload_id),
                       Element("Initiated", Iso8601(u.initiated_ns, true)));
  }
  xml += Element("IsTruncated", page->truncated ? "true" : "false");
  xml += Element("NextKeyMarker", page->next_key_marker);
  xml += Element("NextUploadIdMarker", page->next_upload_id_marker);
  xml += "</ListMultipartUploadsResult>";
  Result<S3UploadsPage> back = ParseS3UploadsPage(xml, "written back");
  Require(back.ok() && back->truncated == page->truncated &&
          back->next_key_marker == page->next_key_marker &&
          back->next_upload_id_marker == page->next_upload_id_marker &&
          back->uploads.size() == page->uploads.size());
  for (size_t i = 0; i < page->uploads.size(); ++i) {
    const S3UploadEntry &a = page->uploads[i], &b = back->uploads[i];
    Require(a.key == b.key && a.upload_id == b.upload_id && a.initiated_ns == b.initiated_ns);
  }
}

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    out.push_back(text.substr(0, nl == std::string_view::npos ? text.size() : nl + 1));
    text.remove_prefix(out.back().size());
  }
  return out;
}

void HeadAnswer(std::string_view block) {
  std::map<std::string, std::string> headers;
  for (std::string_view line : Lines(block)) AddResponseHeader(line, &headers);
  Require(headers.size() <= kMaxS3Headers);
  for (const auto& [name, value] : headers) {
    for (char c : name) Require(c < 'A' || c > 'Z');
    // (Blanks are trimmed from the front, blanks and line ends from the back.)
    const std::string_view front = " \t", back = " \t\r\n";
    Require(value.empty() || (front.find(value.front()) == std::string_view::npos &&
                              back.find(value.back()) == std::string_view::npos));
  }
  Result<S3Head> head = ParseS3Head(headers, "head");
  auto length = headers.find("content-length");
  uint64_t size = 0;
  bool plain = length != headers.end() && !length->second.empty();
  if (plain) {
    const std::string& v = length->second;
    for (char c : v) plain = plain && c >= '0' && c <= '9';
    plain = plain && std::from_chars(v.data(), v.data() + v.size(), size).ec == std::errc();
  }
  Require(head.ok() == plain && (!plain || head->size == size) &&
          (!head.ok() || head->mtime_ns >= 0));
}

void Time(std::string_view text) {
  const int64_t ns = ParseIso8601Ns(text);
  Require(ns >= 0);
  if (ns == 0) return;
  Require(ParseIso8601Ns(Iso8601(ns, true)) == ns);
  const int64_t whole = ns - ns % 1000000000;
  Require(whole == 0 || ParseIso8601Ns(Iso8601(whole, false)) == whole);
}

void CompleteBody(std::string_view text) {
  std::vector<S3Part> parts;
  int number = 0;
  for (std::string_view line : Lines(text)) {
    std::string etag;
    for (char c : line) {
      if (c != '\0' && c != '\r' && c != '\n') etag += c;  // (an ETag holds no line break)
    }
    parts.push_back({++number, etag, number % 2 ? "" : "AAAAAA=="});
  }
  const std::string body = S3CompleteBody(parts);
  pugi::xml_document doc;
  // As a server reads it: blank-only text is text.
  Require(static_cast<bool>(
      doc.load_buffer(body.data(), body.size(), pugi::parse_default | pugi::parse_ws_pcdata)));
  size_t i = 0;
  for (pugi::xml_node p : doc.child("CompleteMultipartUpload").children("Part")) {
    Require(i < parts.size() && p.child("PartNumber").text().as_int() == parts[i].number &&
            p.child("ETag").text().as_string() == parts[i].etag &&
            p.child("ChecksumCRC32C").text().as_string() == parts[i].crc32c);
    ++i;
  }
  Require(i == parts.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch ((static_cast<unsigned>(data[0]) - '0') % 7) {
    case 0:
      ErrorDocument(body);
      break;
    case 1:
      ListPage(body);
      break;
    case 2:
      UploadId(body);
      break;
    case 3:
      UploadsPage(body);
      break;
    case 4:
      HeadAnswer(body);
      break;
    case 5:
      Time(body);
      break;
    default:
      CompleteBody(body);
      break;
  }
  return 0;
}
