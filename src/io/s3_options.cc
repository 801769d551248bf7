// ResolveS3Options (savepoint/s3.h): the AWS environment variables and configuration files, read
// in the order the AWS CLI reads them.
#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "savepoint/s3.h"

namespace savepoint {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

std::string Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

using Section = std::map<std::string, std::string>;

// The `key = value` lines of section `name` of an AWS INI file ("[name]", or "[profile name]" in
// the config file). Empty when the file or the section is absent.
Section ReadSection(const std::string& file, const std::string& name, bool config_file) {
  Section out;
  std::ifstream in(file);
  if (!in) return out;
  const std::string want = config_file && name != "default" ? "profile " + name : name;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const std::string t = Trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      inside = Trim(std::string_view(t).substr(1, t.size() - 2)) == want;
      continue;
    }
    const size_t eq = t.find('=');
    if (!inside || eq == std::string::npos) continue;
    out[Trim(std::string_view(t).substr(0, eq))] = Trim(std::string_view(t).substr(eq + 1));
  }
  return out;
}

std::string HomeFile(const char* var, const char* rel) {
  std::string f = Env(var);
  if (!f.empty()) return f;
  const std::string home = Env("HOME");
  return home.empty() ? std::string() : home + "/" + rel;
}

// The first non-empty of `values`.
std::string First(std::initializer_list<std::string> values) {
  for (const std::string& v : values) {
    if (!v.empty()) return v;
  }
  return {};
}

std::string Get(const Section& s, const char* key) {
  auto it = s.find(key);
  return it == s.end() ? std::string() : it->second;
}

Status CheckRanges(const S3Options& o) {
  auto bad = [](std::string_view field, std::string_view why) {
    return InvalidArgumentError(fmt::format("S3Options::{}: {}", field, why));
  };
  if (o.endpoint.rfind("http://", 0) != 0 && o.endpoint.rfind("https://", 0) != 0) {
    return bad("endpoint", fmt::format("{:?} is not an http:// or https:// URL", o.endpoint));
  }
  if (o.max_connections < 1 || o.max_connections > 256) {
    return bad("max_connections", fmt::format("{} is outside 1..256", o.max_connections));
  }
  if (o.part_bytes < (uint64_t{5} << 20) || o.part_bytes > (uint64_t{5} << 30)) {
    return bad("part_bytes", fmt::format("{} is outside 5 MiB..5 GiB", o.part_bytes));
  }
  if (o.max_attempts < 1 || o.max_attempts > 100) {
    return bad("max_attempts", fmt::format("{} is outside 1..100", o.max_attempts));
  }
  if (o.base_backoff.count() < 0 || o.max_backoff < o.base_backoff) {
    return bad("base_backoff", "must be >= 0 and <= max_backoff");
  }
  if (o.connect_timeout.count() <= 0 || o.stall_timeout.count() <= 0) {
    return bad("connect_timeout", "the timeouts must be positive");
  }
  if (o.access_key_id.empty() != o.secret_access_key.empty()) {
    return bad(o.access_key_id.empty() ? "access_key_id" : "secret_access_key",
               "an access key id and a secret come together (the other one is set)");
  }
  return Status::OK();
}

}  // namespace

bool IsS3Uri(std::string_view path) { return path.rfind("s3://", 0) == 0; }

Result<S3Options> ResolveS3Options(S3Options o) {
  const bool named = !o.profile.empty() || !Env("AWS_PROFILE").empty();
  if (o.profile.empty()) o.profile = First({Env("AWS_PROFILE"), "default"});
  const Section creds =
      ReadSection(HomeFile("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), o.profile, false);
  const Section config = ReadSection(HomeFile("AWS_CONFIG_FILE", ".aws/config"), o.profile, true);
  o.region = First(
      {o.region, Env("AWS_REGION"), Env("AWS_DEFAULT_REGION"), Get(config, "region"), "us-east-1"});
  o.endpoint =
      First({o.endpoint, Env("AWS_ENDPOINT_URL_S3"), Env("AWS_ENDPOINT_URL"),
             Get(config, "endpoint_url"), fmt::format("https://s3.{}.amazonaws.com", o.region)});
  while (o.endpoint.size() > 8 && o.endpoint.back() == '/') o.endpoint.pop_back();
  if (o.access_key_id.empty() && !Env("AWS_ACCESS_KEY_ID").empty()) {
    o.access_key_id = Env("AWS_ACCESS_KEY_ID");
    o.secret_access_key = Env("AWS_SECRET_ACCESS_KEY");
    o.session_token = Env("AWS_SESSION_TOKEN");
  }
  for (const Section* s : {&creds, &config}) {
    if (!o.access_key_id.empty()) break;
    o.access_key_id = Get(*s, "aws_access_key_id");
    o.secret_access_key = Get(*s, "aws_secret_access_key");
    o.session_token = Get(*s, "aws_session_token");
  }
  if (o.access_key_id.empty() && named) {
    return InvalidArgumentError(fmt::format(
        "S3Options::profile: profile {:?} holds no credentials in the shared credentials or "
        "config file",
        o.profile));
  }
  if (o.ca_file.empty()) o.ca_file = Env("AWS_CA_BUNDLE");
  SP_RETURN_IF_ERROR(CheckRanges(o));
  return o;
}

}  // namespace savepoint
