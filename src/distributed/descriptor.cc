// Encoding of the distributed save's messages and the coordinator's merge (see descriptor.h).
#include "distributed/descriptor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "distributed/wire.h"
#include "format/endian.h"

namespace savepoint::dist {

void EncodeStatus(const Status& s, std::string* out) {
  WireWriter w;
  w.U64(static_cast<uint64_t>(s.code()));
  w.Str(s.message());
  out->append(w.bytes());
}

Status DecodeStatus(std::string_view bytes, std::string_view where) {
  WireReader r(bytes, std::string(where));
  Status s;
  SP_RETURN_IF_ERROR(ReadStatus(r, &s));
  return s;
}

std::string EncodePlan(const Status& status, const format::Manifest& lm, bool encrypted) {
  std::string out;
  EncodeStatus(status, &out);
  WireWriter w;
  bool has = status.ok() && !lm.tensors.empty();
  w.U64(lm.version);
  w.U64(encrypted ? 1 : 0);
  w.U64(lm.chunk_bytes);
  w.U64(has ? lm.files[0].bytes : 0);
  w.U64(has ? lm.tensors.size() : 0);
  std::string_view name, dtype;  // the previous shard's
  for (size_t i = 0; has && i < lm.tensors.size(); ++i) {
    const format::TensorRecord& t = lm.tensors[i];
    const format::ShardRecord& s = t.shards[0];
    // The name as the bytes it shares with the previous shard's and the rest; the dtype only
    // when it changes (a rank's tensors are in name order: most share a long prefix).
    const size_t shared = static_cast<size_t>(
        std::mismatch(name.begin(), name.end(), t.name.begin(), t.name.end()).first - name.begin());
    name = t.name;
    w.V64(shared);
    w.VStr(name.substr(shared));
    const std::string_view dt = DTypeName(t.dtype);
    w.VStr(dt == dtype ? std::string_view() : dt);
    dtype = dt;
    w.Dims(t.shape);
    w.Dims(s.offsets);
    w.Dims(s.sizes);
    w.V64(s.offset);
    w.V64(s.bytes);
  }
  return out + w.bytes();
}

std::string EncodeCrcs(const Status& status, const format::Manifest& lm) {
  std::string out;
  EncodeStatus(status, &out);
  WireWriter w;
  const bool encrypted = status.ok() && lm.encryption.enabled;
  w.Str(encrypted ? std::string_view(reinterpret_cast<const char*>(lm.encryption.key_check.data()),
                                     format::kKeyCheckBytes)
                  : std::string_view());
  w.U64(status.ok() ? lm.tensors.size() : 0);
  for (size_t i = 0; status.ok() && i < lm.tensors.size(); ++i) {
    const format::ShardRecord& s = lm.tensors[i].shards[0];
    w.V64(s.crc32c.size());
    for (uint32_t v : s.crc32c) w.U32(v);
    w.V64(encrypted ? s.tags.size() : 0);
    for (size_t k = 0; encrypted && k < s.tags.size(); ++k) {
      w.Raw({reinterpret_cast<const char*>(s.tags[k].data()), s.tags[k].size()});
    }
  }
  return out + w.bytes();
}

namespace {

// The first u64 of a digest message: above every status code, which a plan starts with.
constexpr uint64_t kDigestMagic = 0x5453454749445053;  // "SPDIGEST", little-endian
constexpr size_t kDigestBytes = 8 + 32;                // magic, SHA-256

crypto::Bytes AsBytes(std::string_view s) { return std::as_bytes(std::span(s)); }

}  // namespace

std::string EncodePlanDigest(std::string_view plan) {
  WireWriter w;
  w.U64(kDigestMagic);
  const crypto::Sha256 d = crypto::Sha256Of(AsBytes(plan));
  w.Raw({reinterpret_cast<const char*>(d.data()), d.size()});
  return w.bytes();
}

bool PlanMatchesDigest(std::string_view plan, std::string_view digest) {
  bool digest_only = false;
  const crypto::Sha256 d = PlanDigest(digest, &digest_only);
  return digest_only && crypto::Sha256Of(AsBytes(plan)) == d;
}

crypto::Sha256 PlanDigest(std::string_view message, bool* digest_only) {
  crypto::Sha256 d;
  *digest_only = message.size() == kDigestBytes && format::GetU64(message, 0) == kDigestMagic;
  if (!*digest_only) return crypto::Sha256Of(AsBytes(message));
  std::memcpy(d.data(), message.data() + 8, d.size());
  return d;
}

std::string EncodeVerdict(const Verdict& v) {
  std::string out;
  EncodeStatus(v.status, &out);
  WireWriter w;
  w.U64(v.need_plans ? 1 : 0);
  w.Str(v.tmp);
  w.U64(v.checkpoint_id);
  // One bit per rank, whether it writes a file: the files are numbered in rank order.
  std::string bits((v.file_index.size() + 7) / 8, '\0');
  for (size_t r = 0; r < v.file_index.size(); ++r) {
    if (v.file_index[r] >= 0) bits[r / 8] = static_cast<char>(bits[r / 8] | (1 << (r % 8)));
  }
  w.U64(v.file_index.size());
  w.Raw(bits);
  w.Str(v.salt);
  w.U64(v.version);
  return out + w.bytes();
}

Result<Verdict> DecodeVerdict(std::string_view bytes, int world) {
  WireReader r(bytes, "save verdict");
  Verdict v;
  SP_RETURN_IF_ERROR(ReadStatus(r, &v.status));
  SP_ASSIGN_OR_RETURN(uint64_t need, r.U64());
  v.need_plans = need != 0;
  SP_ASSIGN_OR_RETURN(v.tmp, r.Str());
  SP_ASSIGN_OR_RETURN(v.checkpoint_id, r.U64());
  SP_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  if (n != static_cast<uint64_t>(world) && (v.status.ok() && !v.need_plans ? true : n != 0)) {
    return InternalError(fmt::format("save verdict: {} ranks' files for {} ranks", n, world));
  }
  SP_ASSIGN_OR_RETURN(std::string_view bits, r.Raw((n + 7) / 8));
  v.file_index.assign(n, -1);
  int64_t files = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if ((static_cast<uint8_t>(bits[i / 8]) >> (i % 8)) & 1) v.file_index[i] = files++;
  }
  SP_ASSIGN_OR_RETURN(v.salt, r.Str());
  SP_ASSIGN_OR_RETURN(uint64_t version, r.U64());
  // (A verdict that decides a save names a version this build writes; others carry 0.)
  const bool decides = v.status.ok() && !v.need_plans;
  if (version > format::kMaxFormatVersion || (decides && version < format::kMinFormatVersion)) {
    return InternalError(fmt::format("save verdict: format version {}", version));
  }
  v.version = static_cast<uint32_t>(version);
  return v;
}

}  // namespace savepoint::dist
