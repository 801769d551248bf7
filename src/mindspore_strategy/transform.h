// Internals of the MindSpore transform (savepoint/mindspore_strategy.h): which destination files
// there are, and for each, which source slices fill which parameter (transform_plan.cc); the
// source files and the execution live in transform.cc.
//
// MindSpore's rules, which the plan follows (docs/INTEROP.md, "MindSpore strategy files"): a
// destination rank r is local rank r % Nd of stage r / Nd (Nd: destination ranks per stage).
// Source rank s*Ns + l (stage s, local rank l) holds the stage-s slices of local rank l. The
// parameters of a destination file are the names of its "home" source files (local rank
// r % Nd % Ns of every source stage), less the parameters of other destination stages; a parameter
// with a layout on both sides (a missing strategy counts as "whole on one rank") is cut to the
// destination box, every other one is copied whole from the first home file holding it.
#ifndef SAVEPOINT_MINDSPORE_STRATEGY_TRANSFORM_H_
#define SAVEPOINT_MINDSPORE_STRATEGY_TRANSFORM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "savepoint/mindspore_strategy.h"

namespace savepoint::transform {

// One side of a transform: a resolved strategy, or none (every parameter whole on one rank).
struct Side {
  std::optional<MindSporeLayoutMap> map;
  int64_t devices() const { return map ? map->stage_devices : 1; }
  uint32_t stages() const { return map ? map->stages : 1; }
  const MindSporeParamPlacement* Find(std::string_view name) const;
};

// One destination file.
struct Job {
  int64_t rank = 0;       // destination rank
  int64_t src_base = 0;   // first source rank (the source stage's, in the "_part" case)
  std::string path = {};  // the file to write
};

// What a source rank's file holds, as the planner sees it.
struct SourceParam {
  DType dtype;
  Shape shape;
  bool int4 = false;  // a MindSpore Int4 (qint4x2) entry, read as I8
};
class Sources {
 public:
  virtual ~Sources() = default;
  virtual bool Has(int64_t rank) const = 0;
  // The file of `rank` (for errors).
  virtual std::string Path(int64_t rank) const = 0;
  // Tensor entries of the file, in file order; nullopt when `rank` has none.
  virtual const std::vector<std::pair<std::string, std::optional<SourceParam>>>* Params(
      int64_t rank) const = 0;
};

// One source slice's part of a destination tensor (global coordinates).
struct Copy {
  int64_t src_rank = 0;
  Shape src_offsets = {}, src_sizes = {};  // the source slice's box
  Shape offsets = {}, sizes = {};          // the part copied
};

struct OutTensor {
  std::string name;
  DType dtype = DType::kU8;
  Shape offsets, sizes;  // the destination box
  std::vector<Copy> copies;
  bool int4 = false;  // the source entries are Int4: the destination entry is marked Int4 too
};

struct RankPlan {
  Job job;
  std::vector<OutTensor> tensors = {};
  std::map<int64_t, std::vector<std::string>> whole = {};  // source rank -> entries copied whole
  uint64_t bytes = 0;  // destination tensor bytes (cut and whole; hash maps and strings aside)
};

// Plans one destination file from the sources. Errors name the strategy files, the source files
// and the parameter.
Result<RankPlan> PlanRank(const Side& src, const Side& dst, const Job& job, const Sources& sources);

// The source ranks destination rank `rank` reads (layouts only), sorted in descending order.
Result<std::vector<int64_t>> NeededRanks(const Side& src, const Side& dst, int64_t rank);

// --- Shared with the distributed loads and exports (distributed_load.cc, export.cc). ---

// The tensors `names` of a rank's own layout: each one's box is layout[name], or the whole
// tensor when absent. `home` holds at least the first rank of each source stage (whose entries
// name the parameters; every parameter the source strategy lists must be among them); `in` as
// for PlanBox. NotFound for a name no home file holds, InvalidArgument for one that is not a
// tensor.
Result<std::vector<OutTensor>> PlanBoxes(const Side& src, const std::vector<std::string>& names,
                                         const ShardLayout& layout, const Sources& home,
                                         const Sources* in);

// One tensor of a rank's own layout (a box given directly, not by a destination strategy): the
// source slices that fill `box` (global coordinates; box.global_shape must be the parameter's
// full shape). `home` is the parameter's entry in the file of source rank `home_rank` (the first
// home file holding it); a parameter without a source layout is read from that file. With
// `in` == nullptr only the layouts are used (the home rank, else the first member of each
// replica group, is taken as the holder); otherwise the holders present in `in` are checked
// against the strategy. Errors name the strategy file, the source file and the parameter.
Result<OutTensor> PlanBox(const Side& src, std::string_view name, const SourceParam& home,
                          int64_t home_rank, const ShardSpec& box, const Sources* in);

// The following are defined in transform.cc.
// The source file of every rank directory of `dir`: its lexicographically last "*.ckpt".
Result<std::map<int64_t, std::string>> SourceRankFiles(FileSystem* fs, const std::string& dir);
// A strategy file resolved; nullopt = not split. InvalidArgument when it lists no layouts.
Result<Side> ReadSide(const std::optional<std::string>& file, FileSystem* fs);
// InvalidArgument (naming the strategy file and the rank) unless `files` holds exactly the
// source strategy's ranks.
Status CheckSourceRanks(const Side& src, const std::map<int64_t, std::string>& files,
                        const std::string& dir);
// One source rank's file, scanned (transform.cc).
struct SourceFile;

// The source files of a transform: opened and scanned (headers only, bounded memory).
class FileSources final : public Sources {
 public:
  FileSources();
  ~FileSources() override;
  // Opens and scans the files (source rank -> path) on `threads` threads.
  static Result<std::unique_ptr<FileSources>> Open(FileSystem* fs,
                                                   const std::map<int64_t, std::string>& paths,
                                                   int threads);
  bool Has(int64_t rank) const override;
  std::string Path(int64_t rank) const override;
  const std::vector<std::pair<std::string, std::optional<SourceParam>>>* Params(
      int64_t rank) const override;
  // Precondition: Has(rank).
  const SourceFile& File(int64_t rank) const;

 private:
  std::map<int64_t, std::unique_ptr<SourceFile>> files_;
};

// Fills the bytes of `t` (t.sizes of t.dtype, row-major, at `data`) from its copies, reading
// only their byte runs. Thread-safe for distinct tensors.
Status FillTensor(const OutTensor& t, const FileSources& in, std::byte* data);
// The State a destination file of `plan` holds (what the transform writes).
Result<State> BuildRankState(const RankPlan& plan, const FileSources& in, const IoOptions& io);

}  // namespace savepoint::transform

#endif  // SAVEPOINT_MINDSPORE_STRATEGY_TRANSFORM_H_
