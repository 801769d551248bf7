// Shared fixtures of the DCP import's unit tests: `.metadata` pickles built opcode by opcode, as
// DCP's FileSystemWriter lays them out, so that tests can state exactly what a hostile file holds.
#ifndef SAVEPOINT_INTEROP_DCP_TESTUTIL_H_
#define SAVEPOINT_INTEROP_DCP_TESTUTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "savepoint/dcp.h"
#include "savepoint/filesystem.h"
#include "savepoint/state.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"

namespace savepoint::testing {

// A protocol-2 pickle written opcode by opcode.
class PickleText {
 public:
  PickleText() : s_("\x80\x02") {}
  std::string Stop() && { return std::move(s_) + "."; }

  PickleText& Op(char op) { return s_ += op, *this; }
  PickleText& Global(const std::string& module, const std::string& name) {
    return s_ += "c" + module + "\n" + name + "\n", *this;
  }
  PickleText& Str(const std::string& v) {
    s_ += 'X';
    AppendLe(v.size(), 4);
    return s_ += v, *this;
  }
  // LONG1 of `bytes` little-endian bytes (two's complement): 8 for any int64, 9 to go beyond.
  PickleText& Int(int64_t v, int bytes = 8) {
    s_ += '\x8a';
    s_ += static_cast<char>(bytes);
    AppendLe(static_cast<uint64_t>(v), bytes);
    return *this;
  }
  // BINPUT / BINGET of memo slot `slot`.
  PickleText& Put(uint8_t slot) { return Op('q').Op(static_cast<char>(slot)); }
  PickleText& Get(uint8_t slot) { return Op('h').Op(static_cast<char>(slot)); }
  // torch.Size(dims): a REDUCE of torch.Size on a 1-tuple of the tuple of dims.
  PickleText& Size(const Shape& dims) {
    Global("torch", "Size").Op('(');
    for (int64_t d : dims) Int(d);
    return Op('t').Op('\x85').Op('R');
  }
  // An instance of class `cls` of `module` (NEWOBJ), its BUILD state a dict of the `fields` that
  // `add` pushes (key, value pairs).
  template <typename F>
  PickleText& Object(const std::string& module, const std::string& cls, F&& add) {
    Global(module, cls).Op(')').Op('\x81').Op('}').Op('(');
    add(*this);
    return Op('u').Op('b');
  }

 private:
  void AppendLe(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) s_ += static_cast<char>(i < 8 ? (v >> (8 * i)) & 0xff : 0);
  }
  std::string s_;
};

inline constexpr char kDcpMd[] = "torch.distributed.checkpoint.metadata";

// One chunk: its box and the bytes of the data file it is stored at.
struct Chunk {
  Shape offsets, sizes;
  int64_t offset = 0, length = 0;
};

// DCP metadata of float32 tensor "w" of `size` stored in `chunks` of __0_0.distcp; with
// `planner_data` set, it pushes the value of the Metadata's planner_data.
inline std::string Metadata(const Shape& size, const std::vector<Chunk>& chunks,
                            const std::function<void(PickleText&)>& planner_data = nullptr) {
  PickleText p;
  p.Object(kDcpMd, "Metadata", [&](PickleText& m) {
    m.Str("state_dict_metadata").Op('}').Str("w");
    m.Object(kDcpMd, "TensorStorageMetadata", [&](PickleText& t) {
      t.Str("properties").Object(kDcpMd, "TensorProperties", [](PickleText& props) {
        props.Str("dtype").Global("torch", "float32");
      });
      t.Str("size").Size(size);
      t.Str("chunks").Op(']').Op('(');
      for (const Chunk& c : chunks) {
        t.Object(kDcpMd, "ChunkStorageMetadata", [&](PickleText& k) {
          k.Str("offsets").Size(c.offsets).Str("sizes").Size(c.sizes);
        });
      }
      t.Op('e');
    });
    m.Op('s').Str("storage_data").Op('}').Op('(');
    for (const Chunk& c : chunks) {
      m.Object(kDcpMd, "MetadataIndex", [&](PickleText& k) {
        k.Str("fqn").Str("w").Str("offset").Size(c.offsets).Str("index").Op('N');
      });
      m.Object("torch.distributed.checkpoint.filesystem", "_StorageInfo", [&](PickleText& i) {
        i.Str("relative_path").Str("__0_0.distcp");
        i.Str("offset").Int(c.offset).Str("length").Int(c.length);
      });
    }
    m.Op('u');
    if (planner_data) planner_data(m.Str("planner_data"));
  });
  return std::move(p).Stop();
}

// Writes the DCP directory `dir` of `fs`, `.metadata` and the data file __0_0.distcp holding
// `data`, and loads it.
inline Result<State> WriteAndLoadDcp(FileSystem& fs, const std::string& dir,
                                     std::string_view metadata, std::string_view data) {
  SP_RETURN_IF_ERROR(fs.CreateDirs(dir));
  SP_RETURN_IF_ERROR(fs.WriteFileSynced(dir + "/.metadata", metadata));
  SP_RETURN_IF_ERROR(fs.WriteFileSynced(dir + "/__0_0.distcp", data));
  return LoadDcpCheckpoint(dir, {}, {.fs = &fs});
}

}  // namespace savepoint::testing

#endif  // SAVEPOINT_INTEROP_DCP_TESTUTIL_H_
