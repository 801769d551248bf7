// Opening and checking delta chains.
#include "sparse/chain.h"

#include <fmt/format.h>

namespace savepoint::sparse {
namespace {

Result<Link> OpenLink(const std::string& path, const LoadOptions& load, const IoOptions& io) {
  Link link;
  link.path = path;
  SP_ASSIGN_OR_RETURN(link.reader, engine::Reader::OpenImpl(path, load, io));
  bool found = false;
  SP_ASSIGN_OR_RETURN(
      link.desc, DecodeDesc(link.reader->manifest(), fmt::format("checkpoint {}", path), &found));
  if (!found) {
    return CorruptionError(fmt::format("checkpoint {} holds no sparse tables", path));
  }
  return link;
}

// Opens the base of `delta` and checks it is the checkpoint the delta was saved on.
Result<Link> OpenBase(const Link& delta, const LoadOptions& load, const IoOptions& io) {
  const std::string base = ResolveBase(delta.path, delta.desc.base);
  const std::string where = fmt::format("delta chain link {} -> {}", delta.path, base);
  Result<Link> link = OpenLink(base, load, io);
  if (!link.ok()) {
    if (link.status().code() == StatusCode::kNotFound) {
      return NotFoundError(
          fmt::format("{}: the base is missing ({})", where, link.status().message()));
    }
    return link.status().WithContext(where);
  }
  const uint64_t id = link->reader->manifest().checkpoint_id;
  if (id != delta.desc.base_id) {
    return CorruptionError(fmt::format(
        "{}: the base is checkpoint id {:016x}, the delta was saved on {:016x} (the base was "
        "replaced, or belongs to another run)",
        where, id, delta.desc.base_id));
  }
  if (link->desc.depth != delta.desc.depth - 1) {
    return CorruptionError(
        fmt::format("{}: the base has depth {}, the delta depth {}: a gap in "
                    "the chain",
                    where, link->desc.depth, delta.desc.depth));
  }
  return link;
}

}  // namespace

Result<std::vector<Link>> OpenChain(const std::string& path, const LoadOptions& load,
                                    const IoOptions& io) {
  std::vector<Link> chain;
  SP_ASSIGN_OR_RETURN(Link head, OpenLink(path, load, io));
  chain.push_back(std::move(head));
  while (chain.back().desc.delta()) {  // depth decreases by one per link: at most kMaxChainDepth
    SP_ASSIGN_OR_RETURN(Link base, OpenBase(chain.back(), load, io));
    chain.push_back(std::move(base));
  }
  return chain;
}

Result<std::optional<std::string>> BaseOfCheckpoint(const std::string& path, const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<engine::Reader> reader,
                      engine::Reader::OpenImpl(path, LoadOptions{}, io));
  bool found = false;
  SP_ASSIGN_OR_RETURN(Desc d,
                      DecodeDesc(reader->manifest(), fmt::format("checkpoint {}", path), &found));
  if (!found || !d.delta()) return std::optional<std::string>();
  return std::optional<std::string>(ResolveBase(path, d.base));
}

Schema SchemaOf(const Link& link) {
  Schema schema;
  const engine::Reader& r = *link.reader;
  for (const StoredTable& t : link.desc.tables) {
    std::vector<SlotSchema>& slots = schema[t.name];
    for (const auto& [slot, tensor] : t.names.slots) {
      const format::TensorRecord& rec = r.manifest().tensors[r.IndexOf(tensor)];
      slots.push_back({slot, rec.dtype, Shape(rec.shape.begin() + 1, rec.shape.end())});
    }
  }
  return schema;
}

namespace {

std::string Describe(const SlotSchema& s) {
  return fmt::format("{} rows of {}", DTypeName(s.dtype), ShapeToString(s.row));
}

}  // namespace

Status CheckDeltaSchema(const Schema& delta, StatusCode code, std::string_view where,
                        const Schema& base) {
  for (const auto& [table, slots] : delta) {
    auto it = base.find(table);
    if (it == base.end()) {
      return Status(code, fmt::format("{}: a delta of table {:?}, which its base does not have (a "
                                      "delta of another table)",
                                      where, table));
    }
    if (it->second == slots) continue;
    for (const SlotSchema& s : slots) {
      auto b = std::find_if(it->second.begin(), it->second.end(),
                            [&](const SlotSchema& x) { return x.name == s.name; });
      if (b == it->second.end()) {
        return Status(code, fmt::format("{}: table {:?}: slot {:?} is not in the base", where,
                                        table, s.name));
      }
      if (!(*b == s)) {
        return Status(code, fmt::format("{}: table {:?}: slot {:?} is {} in the delta, {} in the "
                                        "base",
                                        where, table, s.name, Describe(s), Describe(*b)));
      }
    }
    return Status(code, fmt::format("{}: table {:?}: the delta has {} slots, the base {}", where,
                                    table, slots.size(), it->second.size()));
  }
  return Status::OK();
}

}  // namespace savepoint::sparse
