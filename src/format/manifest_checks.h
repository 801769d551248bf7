// Checks shared by the manifest decoders: the JSON body (manifest_decode.cc) and the binary
// sections of version 3 (manifest_index.cc). Internal to src/format/.
#ifndef SAVEPOINT_FORMAT_MANIFEST_CHECKS_H_
#define SAVEPOINT_FORMAT_MANIFEST_CHECKS_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "format/manifest.h"
#include "format/manifest_index.h"

namespace savepoint::format::internal {

// Context for error messages: "<file>: <path in manifest>: ...".
struct Ctx {
  std::string_view where;
  Status Bad(std::string_view what) const;
};

// `s` (of tensor `t`, named `in` in messages) has t's rank, lies within its shape, has the bytes of
// its box, a file of `m`, and an extent (or stored chunks) within that file with one checksum per
// chunk.
Status CheckShardRange(const TensorRecord& t, const ShardRecord& s, const Manifest& m,
                       const Ctx& ctx, const std::string& in);

// The shards of `t` lie within its shape and do not overlap; with `cover`, they also cover it.
// (tiling.cc, as the next.)
Status CheckTiling(const TensorRecord& t, const Ctx& ctx, const std::string& in, bool cover = true);

// The same for `count` boxes held flat in `boxes`: 2 * shape.size() values each, the offsets then
// the sizes. With `grid`, a grid (GridOrder) passes at once; other layouts, or all without it, are
// swept along one dimension.
Status CheckBoxTiling(const Shape& shape, const int64_t* boxes, size_t count, const Ctx& ctx,
                      const std::string& in, bool cover = true, bool grid = true);

// The number of distinct values among `values` (each >= 0; reordered): a scan when they are
// sorted, else a hash set, falling back to a sort when values collide too much (hostile input),
// so it stays O(n log n) at worst. `table` is scratch. (tiling.cc: the sweep of CheckBoxTiling.)
size_t DistinctCount(std::vector<int64_t>& values, std::vector<int64_t>& table);

// Checks the 64-byte header of MANIFEST `bytes` (all of it, or for version 3 at least header and
// head) and reads its version, id, encryption flag and MAC into `m`.
Status CheckHeader(std::string_view bytes, const Ctx& ctx, Manifest* m);

// Version 3: sets the sections' offsets, back to back from `head_end`; they must end the file of
// `file_bytes` bytes exactly.
Status PlaceSections(uint64_t head_end, uint64_t file_bytes, const Ctx& ctx,
                     std::vector<SectionRef>* sections);

// Decodes the JSON head of a version 3 or 4 manifest (after CheckHeader) into `m` and `sections`
// (offsets not yet placed). With `fast`, ReadFastHead's path is tried first: a head it reads and
// whose checks pass is decoded from it; any other is decoded from nlohmann's DOM, which gives the
// errors. Both ways give the same result (the manifest fuzzer compares them).
Status DecodeHeadBody(std::string_view head, const Ctx& ctx, Manifest* m,
                      std::vector<SectionRef>* sections, bool fast = true);

// A tensor entry of an indexed head (docs/FORMAT.md §15), its fields as read.
struct TensorEntry {
  std::string name, dtype;
  Shape shape;
  uint64_t shards = 0, chunks = 0, section_bytes = 0, section_crc32c = 0;
  bool stored = false;
};

// A head read by ReadFastHead: "files" and "tensors" as records, the rest of the root object as a
// DOM.
struct FastHead {
  nlohmann::json rest;
  std::vector<FileRecord> files;
  std::vector<TensorEntry> tensors;
};

// Reads a head (its JSON, already checked for depth) in one pass of nlohmann's SAX parser
// (head_reader.cc). Only the form writers give is read: a root object with "files" and "tensors"
// once each, every file entry exactly "bytes" (an unsigned integer) and "name" (a string), every
// tensor entry exactly the eight fields of a TensorEntry with their JSON types, and at most
// kMaxFiles, kMaxTensors, kMaxRank and kMaxDimension. False for anything else (invalid JSON
// included): the DOM path decodes it. Nothing here is checked beyond form.
bool ReadFastHead(std::string_view head, FastHead* out);

}  // namespace savepoint::format::internal

#endif  // SAVEPOINT_FORMAT_MANIFEST_CHECKS_H_
