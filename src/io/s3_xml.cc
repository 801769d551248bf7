// S3 XML bodies (io/s3_xml.h) with pugixml.
#include "io/s3_xml.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <ctime>
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

Result<uint64_t> Number(const pugi::xml_node& n, const char* child, std::string_view what) {
  const std::string s = Text(n, child);
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
    return CorruptionError(fmt::format("{}: <{}> holds {:?}, not a size", what, child, s));
  }
  return v;
}

}  // namespace

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
  const time_t t = timegm(&tm);
  if (t < 0) return 0;
  int64_t ns = static_cast<int64_t>(t) * 1000000000;
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
