// S3 XML bodies (io/s3_xml.h) with pugixml, and response headers.
#include "io/s3_xml.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <ctime>
#include <limits>
#include <optional>
#include <pugixml.hpp>
#include <sstream>

namespace savepoint::io {
namespace {

// Bodies larger than this are refused before parsing (a listing page of 1,000 keys of 1 KiB each
// is about 1.3 MiB).
constexpr size_t kMaxXmlBytes = 16u << 20;

Status Parse(pugi::xml_document* doc, std::string_view body, std::string_view what) {
  if (body.size() > kMaxXmlBytes) {
    return CorruptionError(
        fmt::format("{}: the response body is {} bytes, more than the {} an "
                    "S3 XML answer may have",
                    what, body.size(), kMaxXmlBytes));
  }
  pugi::xml_parse_result r =
      doc->load_buffer(body.data(), body.size(), pugi::parse_default, pugi::encoding_utf8);
  if (!r) {
    return CorruptionError(fmt::format("{}: the response is not XML ({} at byte {})", what,
                                       r.description(), r.offset));
  }
  return Status::OK();
}

std::string Text(const pugi::xml_node& n, const char* child) {
  return n.child(child).text().as_string();
}

// `s` as a plain unsigned decimal: digits only (no sign, no blanks), at most 2^64 - 1.
std::optional<uint64_t> Decimal(std::string_view s) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

Result<uint64_t> Number(const pugi::xml_node& n, const char* child, std::string_view what) {
  const std::string s = Text(n, child);
  std::optional<uint64_t> v = Decimal(s);
  if (!v) return CorruptionError(fmt::format("{}: <{}> holds {:?}, not a size", what, child, s));
  return *v;
}

// Seconds since the epoch as ns; none before the epoch or where the ns (with a fraction of a second
// added) would not fit in an int64_t (after 2262).
std::optional<int64_t> SecondsToNs(int64_t s) {
  constexpr int64_t kMaxSeconds = std::numeric_limits<int64_t>::max() / 1000000000 - 1;
  if (s < 0 || s > kMaxSeconds) return std::nullopt;
  return s * 1000000000;
}

std::string Lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  return out;
}

// A header's value without the blanks around it and the line end.
std::string_view TrimHeaderValue(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() &&
         (v.back() == '\r' || v.back() == '\n' || v.back() == ' ' || v.back() == '\t')) {
    v.remove_suffix(1);
  }
  return v;
}

std::string HeaderValue(const std::map<std::string, std::string>& headers, const char* name) {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

}  // namespace

void AddResponseHeader(std::string_view line, std::map<std::string, std::string>* headers) {
  const size_t colon = line.find(':');
  if (line.size() > kMaxS3HeaderLine || colon == std::string_view::npos) return;
  std::string name = Lowercase(line.substr(0, colon));
  if (headers->size() >= kMaxS3Headers && !headers->contains(name)) return;
  (*headers)[std::move(name)] = std::string(TrimHeaderValue(line.substr(colon + 1)));
}

Result<S3Head> ParseS3Head(const std::map<std::string, std::string>& headers,
                           std::string_view what) {
  auto length = headers.find("content-length");
  if (length == headers.end()) {
    return IOError(fmt::format("{}: the answer has no Content-Length", what));
  }
  std::optional<uint64_t> size = Decimal(length->second);
  if (!size) {
    return IOError(
        fmt::format("{}: the answer's Content-Length {:?} is not a size", what, length->second));
  }
  const time_t t = curl_getdate(HeaderValue(headers, "last-modified").c_str(), nullptr);
  return S3Head{.size = *size,
                .mtime_ns = SecondsToNs(t).value_or(0),
                .crc32c = HeaderValue(headers, "x-amz-checksum-crc32c"),
                .etag = HeaderValue(headers, "etag")};
}

int64_t ParseIso8601Ns(std::string_view text) {
  std::tm tm{};
  int year = 0, mon = 0, day = 0, hour = 0, min = 0, sec = 0;
  const std::string s(text.substr(0, 19));
  if (s.size() != 19 || std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &year, &mon, &day, &hour,
                                    &min, &sec) != 6) {
    return 0;
  }
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = min;
  tm.tm_sec = sec;
  std::optional<int64_t> whole = SecondsToNs(timegm(&tm));
  if (!whole) return 0;
  int64_t ns = *whole;
  if (text.size() > 20 && text[19] == '.') {  // fraction of a second
    int64_t scale = 100000000;
    for (size_t i = 20; i < text.size() && text[i] >= '0' && text[i] <= '9' && scale > 0; ++i) {
      ns += (text[i] - '0') * scale;
      scale /= 10;
    }
  }
  return ns;
}

S3ErrorBody ParseS3Error(std::string_view body) {
  pugi::xml_document doc;
  if (body.empty() || !Parse(&doc, body, "").ok()) return {};
  pugi::xml_node e = doc.child("Error");
  return {Text(e, "Code"), Text(e, "Message")};
}

Result<S3ListPage> ParseS3ListPage(std::string_view body, std::string_view what) {
  pugi::xml_document doc;
  SP_RETURN_IF_ERROR(Parse(&doc, body, what));
  pugi::xml_node root = doc.child("ListBucketResult");
  if (!root) return CorruptionError(fmt::format("{}: no <ListBucketResult> in the answer", what));
  S3ListPage page;
  for (pugi::xml_node c : root.children("Contents")) {
    S3ObjectEntry e;
    e.key = Text(c, "Key");
    if (e.key.empty()) return CorruptionError(fmt::format("{}: an entry without <Key>", what));
    SP_ASSIGN_OR_RETURN(e.size, Number(c, "Size", what));
    e.mtime_ns = ParseIso8601Ns(Text(c, "LastModified"));
    page.objects.push_back(std::move(e));
  }
  for (pugi::xml_node p : root.children("CommonPrefixes")) {
    std::string prefix = Text(p, "Prefix");
    if (prefix.empty()) return CorruptionError(fmt::format("{}: an empty <Prefix>", what));
    page.prefixes.push_back(std::move(prefix));
  }
  page.truncated = Text(root, "IsTruncated") == "true";
  page.next_token = Text(root, "NextContinuationToken");
  if (page.truncated && page.next_token.empty()) {
    return CorruptionError(
        fmt::format("{}: the listing is truncated but names no continuation token", what));
  }
  return page;
}

Result<std::string> ParseS3UploadId(std::string_view body, std::string_view what) {
  pugi::xml_document doc;
  SP_RETURN_IF_ERROR(Parse(&doc, body, what));
  std::string id = Text(doc.child("InitiateMultipartUploadResult"), "UploadId");
  if (id.empty()) return CorruptionError(fmt::format("{}: the answer names no UploadId", what));
  return id;
}

Result<S3UploadsPage> ParseS3UploadsPage(std::string_view body, std::string_view what) {
  pugi::xml_document doc;
  SP_RETURN_IF_ERROR(Parse(&doc, body, what));
  pugi::xml_node root = doc.child("ListMultipartUploadsResult");
  if (!root) {
    return CorruptionError(fmt::format("{}: no <ListMultipartUploadsResult> in the answer", what));
  }
  S3UploadsPage page;
  for (pugi::xml_node u : root.children("Upload")) {
    S3UploadEntry e{Text(u, "Key"), Text(u, "UploadId"), ParseIso8601Ns(Text(u, "Initiated"))};
    if (e.key.empty() || e.upload_id.empty()) {
      return CorruptionError(fmt::format("{}: an upload without <Key> or <UploadId>", what));
    }
    page.uploads.push_back(std::move(e));
  }
  page.truncated = Text(root, "IsTruncated") == "true";
  page.next_key_marker = Text(root, "NextKeyMarker");
  page.next_upload_id_marker = Text(root, "NextUploadIdMarker");
  if (page.truncated && page.next_key_marker.empty() && !page.uploads.empty()) {
    // SeaweedFS names only the next upload id: the listing goes on after the last upload listed.
    page.next_key_marker = page.uploads.back().key;
    if (page.next_upload_id_marker.empty()) {
      page.next_upload_id_marker = page.uploads.back().upload_id;
    }
  }
  if (page.truncated && page.next_key_marker.empty()) {
    return CorruptionError(fmt::format("{}: the listing is truncated but names no marker", what));
  }
  return page;
}

std::string S3CompleteBody(const std::vector<S3Part>& parts) {
  pugi::xml_document doc;
  pugi::xml_node root = doc.append_child("CompleteMultipartUpload");
  root.append_attribute("xmlns") = "http://s3.amazonaws.com/doc/2006-03-01/";
  for (const S3Part& p : parts) {
    pugi::xml_node n = root.append_child("Part");
    n.append_child("PartNumber").text().set(p.number);
    n.append_child("ETag").text().set(p.etag.c_str());
    if (!p.crc32c.empty()) n.append_child("ChecksumCRC32C").text().set(p.crc32c.c_str());
  }
  std::ostringstream out;
  doc.save(out, "", pugi::format_raw);
  return out.str();
}

}  // namespace savepoint::io
