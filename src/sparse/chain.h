// Delta chains of sparse checkpoints (docs/SPARSE.md): opening every link of a chain (manifests
// only), checking each link against what its delta recorded, and the tables' schemas along it.
#ifndef SAVEPOINT_SPARSE_CHAIN_H_
#define SAVEPOINT_SPARSE_CHAIN_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/reader.h"
#include "sparse/stored.h"

namespace savepoint::sparse {

// One slot's dtype and the shape of one of its rows.
struct SlotSchema {
  std::string name;
  DType dtype = DType::kU8;
  Shape row;
  friend bool operator==(const SlotSchema&, const SlotSchema&) = default;
};
// Table name -> its slots, in stored order.
using Schema = std::map<std::string, std::vector<SlotSchema>, std::less<>>;

// One checkpoint of a chain, open (manifest read and validated, no data read).
struct Link {
  std::string path;
  std::unique_ptr<engine::Reader> reader;
  Desc desc;
};

// Opens the chain ending at `path`, newest first (the last link is the full checkpoint). Each
// delta's base must exist (NotFound otherwise), have the checkpoint id and the depth the delta
// recorded, and hold sparse tables (Corruption otherwise); errors name the link "P -> B".
Result<std::vector<Link>> OpenChain(const std::string& path, const LoadOptions& load,
                                    const IoOptions& io);

// The base of the checkpoint at `path` (its path, resolved like OpenChain does) when it is a
// sparse delta; nullopt for a full checkpoint and one without tables. Reads its manifest only.
Result<std::optional<std::string>> BaseOfCheckpoint(const std::string& path, const IoOptions& io);

// The slots of every table stored in `link` (from its manifest).
Schema SchemaOf(const Link& link);

// Checks a delta's tables against `base` (the schema of the chain's full checkpoint; deltas add no
// tables): a table `base` lacks, or a slot that differs, fails with `code` naming `where`, the
// table and the slot.
Status CheckDeltaSchema(const Schema& delta, StatusCode code, std::string_view where,
                        const Schema& base);

}  // namespace savepoint::sparse

#endif  // SAVEPOINT_SPARSE_CHAIN_H_
