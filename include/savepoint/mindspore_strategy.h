// MindSpore parallel strategy files and distributed-checkpoint transforms (docs/INTEROP.md,
// "MindSpore strategy files").
//
// A MindSpore job that runs with model, optimizer or pipeline parallelism saves one `.ckpt` file
// per rank (`rank_N/...ckpt`) and a strategy file stating, per parameter, how it is split: a device
// matrix, a tensor map and optimizer sharding (protobuf package `mindspore.straspb`, or JSON).
// This header reads and writes those files, maps every layout to savepoint's shard boxes and
// replica groups (savepoint/distributed.h), and moves a checkpoint from one layout to another the
// way MindSpore's `mindspore.parallel` functions do (same output names and contents), reading only
// the bytes each destination rank needs.
//
// Ownership: everything is returned by value. Thread safety: the functions are reentrant.
#ifndef SAVEPOINT_MINDSPORE_STRATEGY_H_
#define SAVEPOINT_MINDSPORE_STRATEGY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/io_options.h"
#include "savepoint/mindspore.h"
#include "savepoint/status.h"

namespace savepoint {

// --- MindSpore parallel layouts (the rule strategy files are read with). ---

// A MindSpore-style parallel layout (see docs/DISTRIBUTED.md): the device matrix arranges ranks
// row-major (last axis fastest); tensor_map[d] = k splits tensor dim d over device axis
// (n - 1 - k), -1 leaves it whole. Ranks that agree on every axis used by the map hold the same
// slice (a replica group). Strategy files (below) resolve to these layouts.
struct SAVEPOINT_API MindSporeLayout {
  std::vector<int64_t> dev_matrix;
  std::vector<int32_t> tensor_map;
  // Optimizer sharding: splits dim 0 of each slice further into this many pieces across its
  // replica group: the member at position p in the sorted group takes piece p % opt_shard_size
  // (MindSpore's rule: the group's fastest axes carry the pieces, so the size must be a product
  // of its fastest axes times a divisor of the next one). 0 = none; -1 = the group's size.
  // Default: 0.
  int opt_shard_size = 0;
  // Rank stride between replicas that hold distinct optimizer pieces (MindSpore's
  // opt_weight_shard_step). Informational: the pieces follow from the device matrix. Default: 1.
  int opt_shard_step = 1;
  // Nested maps (one tensor dim over several device axes): when not empty, used instead of
  // tensor_map; entry d lists the axes splitting dim d (numbered as in tensor_map), the most
  // significant first ({-1}: whole). Default: empty.
  std::vector<std::vector<int32_t>> nested_tensor_map = {};
  // Uneven manual split of dim 0: slice i (the rank's index along dim 0) covers
  // [dim0_offsets[i], dim0_offsets[i] + dim0_sizes[i]); dim0_offsets empty = running sums. One
  // entry per slice, covering dim 0 exactly. Default: empty (split as below).
  std::vector<int64_t> dim0_sizes = {};
  std::vector<int64_t> dim0_offsets = {};
  // Require every split count to divide its dim (MindSpore's rule) instead of allowing uneven
  // parts. Default: false.
  bool even = false;
};

// The box and replica group of `rank` (in [0, prod(dev_matrix))) under `layout`.
SAVEPOINT_API Result<ShardSpec> ShardFromLayout(const Shape& global_shape,
                                                const MindSporeLayout& layout, int rank);

// --- The file, as written. ---

// One parameter's layout (ParallelLayouts).
struct SAVEPOINT_API MindSporeParamLayout {
  // Device matrix: ranks arranged row-major, last axis fastest. Product = ranks per stage.
  std::vector<int64_t> dev_matrix;
  // One entry per tensor dim: the device axes splitting it, in MindSpore's numbering (k names
  // axis dev_matrix.size() - 1 - k), the most significant first; {-1} leaves the dim whole.
  std::vector<std::vector<int32_t>> tensor_map;
  // Whether the file writes tensor_map in the nested form (one TensorMap message per tensor dim)
  // rather than one flat TensorMap. Kept so that a file is written back as it was read.
  bool nested_tensor_map = false;
  // Uneven manual split of dim 0 (MindSpore's manual-split Gather): the size of each slice along
  // dim 0, and where each starts (indices_offset; empty = running sum). Empty = even split.
  std::vector<int64_t> param_split_shape = {};
  std::vector<int64_t> indices_offset = {};
  // MindSpore's embedding "field" size; read and written back, not used for slicing (MindSpore's
  // transform ignores it too). Default: 0.
  int32_t field = 0;
  // Optimizer sharding: dim 0 of each model-parallel slice split further into this many pieces
  // across the ranks holding that slice (-1: all of them; 0: none). Default: 0.
  int32_t opt_weight_shard_size = 0;
  // The rank stride between the members of an optimizer-shard group (informational: the pieces
  // follow from the device matrix). Default: 0.
  int32_t opt_weight_shard_step = 0;
  // The full tensor shape, when the file states it (JSON "tensor_shape"); empty otherwise.
  std::vector<int64_t> tensor_shape = {};
};

// One operator's strategy (ParallelStrategyItem): kept for round trips and for the stage number.
struct SAVEPOINT_API MindSporeNodeStrategy {
  std::string node_name;
  uint32_t stage = 0;
  std::vector<std::vector<uint32_t>> strategy;  // one ParallelStrategy (dims) per input
};

enum class MindSporeStrategyFormat {
  kProtobuf,  // MindSpore's default (`.ckpt` strategy files)
  kJson,      // `strategy_ckpt_config(..., save_file="x.json")`
};

// A strategy file (ParallelStrategyMap).
struct SAVEPOINT_API MindSporeStrategy {
  uint32_t current_stage = 0;
  std::vector<MindSporeNodeStrategy> nodes;  // in file order
  // Parameter name -> layout, in file order. In a merged file the names carry "{stage}-".
  std::vector<std::pair<std::string, MindSporeParamLayout>> layouts;
};

// Parses a strategy file's bytes (`file` names it in errors). JSON when the first byte that is
// not white space is '{', protobuf otherwise. Untrusted input: at most 256 MiB, 2^20 layouts,
// 64 tensor dims and device axes; Corruption naming the file (and the parameter) for malformed
// input; missing optional JSON fields take their defaults.
SAVEPOINT_API Result<MindSporeStrategy> ParseMindSporeStrategy(std::string_view bytes,
                                                               const std::string& file);
// Reads and parses the file at `path` through `fs` (nullptr = DefaultFileSystem()).
SAVEPOINT_API Result<MindSporeStrategy> ReadMindSporeStrategy(const std::string& path,
                                                              FileSystem* fs = nullptr);
// The file's bytes in `format` (protobuf: the bytes MindSpore's own module writes). Every strategy
// that ParseMindSporeStrategy returned encodes in both formats to bytes that parse back to the
// same strategy and encode to the same bytes again. A layout built otherwise may have no form in
// `format` (CheckMindSporeStrategyEncodable says which); its bytes would not parse back the same.
SAVEPOINT_API std::string EncodeMindSporeStrategy(const MindSporeStrategy& strategy,
                                                  MindSporeStrategyFormat format);
// InvalidArgument naming the layout when a tensor_map cannot be written in `format` exactly: an
// entry without axes, a flat map's entry of several axes, or (protobuf) a nested map of one dim
// over several axes, which MindSpore would read back as a flat map of several dims.
SAVEPOINT_API Status CheckMindSporeStrategyEncodable(const MindSporeStrategy& strategy,
                                                     MindSporeStrategyFormat format);
// Writes the file durably (temporary file, sync, rename; replaces an existing file); refuses what
// CheckMindSporeStrategyEncodable refuses.
SAVEPOINT_API Status WriteMindSporeStrategy(const MindSporeStrategy& strategy,
                                            const std::string& path, MindSporeStrategyFormat format,
                                            const IoOptions& io = {});

// --- The layouts, resolved. ---

// One parameter of a resolved strategy: its layout and the pipeline stages holding it.
struct SAVEPOINT_API MindSporeParamPlacement {
  MindSporeParamLayout layout;
  std::vector<uint32_t> stages;  // sorted; {0} outside pipeline parallelism
};

// A checked strategy: every layout valid, one device count per stage, stages 0..stages-1.
struct SAVEPOINT_API MindSporeLayoutMap {
  std::string file;
  int64_t stage_devices = 1;  // ranks per pipeline stage (the product of every dev_matrix)
  uint32_t stages = 1;        // pipeline stages
  uint32_t file_stage = 0;    // the stage of the file's first node (0 without nodes)
  // Parameter name (stage prefix removed) -> placement.
  std::map<std::string, MindSporeParamPlacement, std::less<>> params;
};

// Checks `strategy` (read from `file`) and resolves it. A file is taken as merged (names
// "{stage}-{name}") when every layout name starts with decimal digits and '-'; other names may
// hold '-'. InvalidArgument naming the file and the parameter for: an empty dev_matrix or axes
// < 1, device counts that differ between parameters, tensor maps naming a missing or repeated
// device axis, a param_split_shape that does not match its split, optimizer sharding the device
// matrix cannot hold, two stages claiming one parameter with different layouts, stages that are
// not 0..n-1.
SAVEPOINT_API Result<MindSporeLayoutMap> ResolveMindSporeStrategy(const MindSporeStrategy& strategy,
                                                                  const std::string& file);
SAVEPOINT_API Result<MindSporeLayoutMap> ReadMindSporeLayouts(const std::string& path,
                                                              FileSystem* fs = nullptr);

// How many pieces `layout` cuts each dim of the tensor into (optimizer sharding not included). A
// product past int64 (a layout that did not pass ResolveMindSporeStrategy's caps) saturates at
// INT64_MAX (INT64_MIN when negative).
SAVEPOINT_API std::vector<int64_t> MindSporeSplitCounts(const MindSporeParamLayout& layout);

// The full shape of a parameter whose slice (as one rank saved it) has shape `slice`: each dim
// times its split count, dim 0 also times the optimizer-shard size (or the sum of
// param_split_shape). InvalidArgument when the ranks differ or on overflow.
SAVEPOINT_API Result<Shape> MindSporeGlobalShape(const MindSporeParamLayout& layout,
                                                 const Shape& slice);

// The box and replica group of `local_rank` (in [0, product of dev_matrix)) for a tensor of
// `global_shape` under `layout`. Replicas are local ranks. InvalidArgument (naming `param`) for a
// bad layout or a shape that the split does not divide.
SAVEPOINT_API Result<ShardSpec> MindSporeShard(const MindSporeParamLayout& layout,
                                               const Shape& global_shape, int64_t local_rank,
                                               std::string_view param = "");

// MindSpore's remove_redundancy assignment: the parameters `local_rank` saves. Parameters are
// taken in name order; the k-th parameter of a replica group (ranks holding the same slice) goes
// to member k % group size (members sorted by rank). Parameters without a layout (`all_params`
// entries absent from the map) are saved by every rank. `global_shapes` gives each parameter's
// full shape. Returns sorted names.
SAVEPOINT_API Result<std::vector<std::string>> MindSporeRedundancyFreeParams(
    const MindSporeLayoutMap& layouts,
    const std::map<std::string, Shape, std::less<>>& global_shapes, int64_t local_rank);

// --- MindSpore's mindspore.parallel functions. ---

// merge_pipeline_strategys: merges the per-stage strategy files in `src_dir` (every `*.ckpt`, or
// every `*.json`; mixing both is InvalidArgument) into `dst_file`: layouts renamed
// "{stage}-{name}", node strategies appended, current_stage = 1, one file per stage (a second file
// of a stage already merged is skipped, as MindSpore does), written in the sources' format.
SAVEPOINT_API Status MergeMindSporeStrategies(const std::string& src_dir,
                                              const std::string& dst_file,
                                              const IoOptions& io = {});

// The format of a transform's destination files.
enum class MindSporeTransformFormat {
  kCkpt,         // MindSpore `.ckpt` (output_format="ckpt")
  kSafetensors,  // MindSpore's safetensors flavour (output_format="safetensors"; "format": "ms")
  kNative,       // a savepoint native checkpoint directory per rank (output_format="native")
};

// The format named "ckpt", "safetensors" or "native" (the names of output_format and of the CLI's
// --format); InvalidArgument naming the accepted names otherwise.
SAVEPOINT_API Result<MindSporeTransformFormat> MindSporeTransformFormatFromName(
    std::string_view name);

struct SAVEPOINT_API MindSporeTransformOptions {
  // Source and destination strategy files; nullopt = not split (every parameter whole on one
  // rank). Default: nullopt.
  std::optional<std::string> src_strategy_file = std::nullopt;
  std::optional<std::string> dst_strategy_file = std::nullopt;
  // Destination ranks to write (transform_checkpoints); empty = all. Default: empty.
  std::vector<int64_t> ranks = {};
  // Most bytes of destination tensors held in memory at once (ranks are transformed in parallel,
  // io.io_threads at most, as long as their outputs fit; one rank always runs). Default: 1 GiB.
  uint64_t memory_budget_bytes = uint64_t{1} << 30;
  // Replace existing destination files. Default: true (MindSpore overwrites).
  bool overwrite = true;
  // The destination files' format: kCkpt writes `{prefix}N.ckpt` (SaveMindSporeCheckpoint);
  // kSafetensors writes `{prefix}N.safetensors` as MindSpore's safetensors transform does
  // (SaveSafetensors with mindspore_format: `__metadata__` {"format": "ms"}, the reference
  // writer's tensor order); kNative writes the directory `{prefix}N` as a savepoint native
  // checkpoint (docs/FORMAT.md: CRC32C per chunk, committed atomically; the MindSpore .ckpt
  // bookkeeping kept in its metadata, so it converts back to a .ckpt losslessly). Default: kCkpt.
  MindSporeTransformFormat output_format = MindSporeTransformFormat::kCkpt;
  // Optional progress of MindSporeTransformCheckpoints / ByRank: called with the destination's
  // tensor bytes as total and how far they are along, each byte counting half once read into
  // memory and fully once written, at most about 10 times a second, and once more with done ==
  // total when every file is committed. Called from the worker threads and the calling thread,
  // never two calls at once; done never decreases. Must be cheap and must not call into
  // savepoint. Default: empty (never called).
  ProgressFn progress = nullptr;
};

// rank_list_for_transform: the source ranks whose files destination rank `rank` needs, sorted in
// descending order as MindSpore returns them. savepoint lists only the ranks holding bytes the
// rank needs (MindSpore lists every rank its redistribution plan touches, often all of them):
// per parameter, one holder of each needed slice (the rank's own local rank when it holds it),
// plus the source rank (rank % source devices) parameters without a layout are copied from.
SAVEPOINT_API Result<std::vector<int64_t>> MindSporeRankListForTransform(
    int64_t rank, const MindSporeTransformOptions& options, const IoOptions& io = {});

// transform_checkpoint_by_rank: writes destination rank `rank`'s checkpoint to `dst_file` (which
// must end in ".ckpt", or ".safetensors" for that output_format; for kNative it is the
// checkpoint directory and must not end in either) from `src_files` (source rank -> `.ckpt` or
// MindSpore safetensors file; at least the ranks MindSporeRankListForTransform lists).
SAVEPOINT_API Status MindSporeTransformCheckpointByRank(
    int64_t rank, const std::map<int64_t, std::string>& src_files, const std::string& dst_file,
    const MindSporeTransformOptions& options, const IoOptions& io = {});

// transform_checkpoints: `src_dir/rank_N/` (the lexicographically last `*.ckpt` in each, or in a
// directory without one the last `*.safetensors`: MindSpore saves distributed checkpoints in
// either format, and both are read through the same store seam) ->
// `dst_dir/rank_N/{prefix}N.ckpt` for every destination rank (or, when the source strategy covers
// a strict subset of a single-stage destination's parameters, the source's stage s:
// `dst_dir/rank_N/{prefix}N_part{s}.ckpt`); `.safetensors` instead of `.ckpt` for that
// output_format, and no extension (a checkpoint directory) for kNative. Everything is planned and
// checked before the first file is written: a missing rank directory or parameter, or a strategy
// that does not fit the files, writes nothing. Each file is committed atomically.
SAVEPOINT_API Status MindSporeTransformCheckpoints(const std::string& src_dir,
                                                   const std::string& dst_dir,
                                                   const std::string& prefix,
                                                   const MindSporeTransformOptions& options,
                                                   const IoOptions& io = {});

// --- Loading a MindSpore distributed checkpoint into a layout (no offline transform). ---
//
// The MindSpore counterparts of LoadDistributed (savepoint/distributed.h): the source is a
// MindSpore distributed checkpoint, `src_dir/rank_N/` (the lexicographically last `*.ckpt` of
// each, else the last `*.safetensors`, as transform_checkpoints takes it) saved under a source
// strategy file, and this rank's tensors are read from it directly, in parallel on io.io_threads
// threads, reading only the byte runs of the source slices that intersect each box (one holder
// per slice) and only the files that hold them (plus, for the layout, the first rank of each source
// stage, whose entries name the parameters). Nothing is written. MindSpore's .ckpt files carry at
// most one CRC over the whole file, which a partial read cannot check: the bytes are taken as
// stored. Encrypted source files are refused (Unimplemented). Every parameter the source strategy
// lists must be in the files of its stage (NotFound naming the file and the parameter), every rank
// directory the strategy implies must be there (InvalidArgument naming the strategy file and the
// rank), and every slice must have the shape and dtype the strategy gives it (InvalidArgument
// naming the file); all of it is checked before any tensor byte is read.

struct SAVEPOINT_API MindSporeDistributedLoadOptions {
  // The source checkpoint's strategy file (protobuf or JSON; a merged pipeline file for a
  // pipeline job); nullopt = not split (rank_0's file holds every parameter whole). Default:
  // nullopt.
  std::optional<std::string> src_strategy_file = std::nullopt;
  // LoadMindSporeDistributedRank only: the destination strategy file giving this rank's boxes;
  // nullopt = not split (the rank gets every parameter whole). Must be nullopt for the layout
  // forms (InvalidArgument), where the ShardLayout gives the boxes. Default: nullopt.
  std::optional<std::string> dst_strategy_file = std::nullopt;
};

// Fills every tensor of `targets` (owned or borrowed buffers) with its box, layout[name] (the
// whole tensor when absent; the target's shape must equal the box's sizes and its dtype the
// parameter's, and the layout's global_shape the parameter's full shape: InvalidArgument naming
// it otherwise), from the MindSpore distributed checkpoint in `src_dir`. A parameter without a
// source layout (such as global_step) is read from the first rank of the first source stage
// whose file holds it. The replicas of a ShardSpec are not used. Values and metadata of
// `targets` are left as they are. Errors: NotFound (no such parameter: names the directory and
// the parameter), InvalidArgument (a layout entry without a target, a parameter that is not a
// tensor, options.dst_strategy_file set). On error the targets' contents are unspecified.
SAVEPOINT_API Status LoadMindSporeDistributed(const std::string& src_dir, State& targets,
                                              const ShardLayout& layout,
                                              const MindSporeDistributedLoadOptions& options = {},
                                              const IoOptions& io = {});

// Like LoadMindSporeDistributed, allocating one tensor per layout entry (dtype from the source).
SAVEPOINT_API Result<State> LoadMindSporeDistributedAlloc(
    const std::string& src_dir, const ShardLayout& layout,
    const MindSporeDistributedLoadOptions& options = {}, const IoOptions& io = {});

// Destination rank `rank` of options.dst_strategy_file, in memory: exactly the entries
// MindSporeTransformCheckpointByRank would write for it (cut parameters, entries copied whole,
// string entries as values, hash maps as their three tensors), reading only the files
// MindSporeRankListForTransform lists. InvalidArgument when `rank` is outside the destination.
// (MindSpore's "_part" case, a source that is one stage of the destination's model, is not
// supported: the source directory must hold every rank of the source strategy.)
SAVEPOINT_API Result<State> LoadMindSporeDistributedRank(
    const std::string& src_dir, int64_t rank, const MindSporeDistributedLoadOptions& options,
    const IoOptions& io = {});

// --- remove_redundancy: the file each rank of a MindSpore job saves. ---

// Writes rank `rank`'s `.ckpt` file as a MindSpore job running under `strategy_file` writes it
// with remove_redundancy (ModelCheckpoint / CheckpointConfig(remove_redundancy=True)): of the
// parameters the strategy lays out on the rank's pipeline stage, only those
// MindSporeRedundancyFreeParams assigns to the rank (the k-th parameter, in name order, of each
// replica group goes to member k % group size), plus every entry of `local` without a layout on
// that stage (global_step, values) and the metadata. `local` is the rank's full local state: its
// slice of every parameter of its stage (borrowed; not changed), from which the full shapes follow;
// every such parameter must be there, since each one shifts the assignment (NotFound naming the
// strategy file, the rank and the parameter otherwise; InvalidArgument for a slice the layout
// cannot have come from, or a `rank` outside the strategy: a merged pipeline file holds every
// rank, a stage's own file those of its stage). The result loads in MindSpore with
// load_checkpoint (the parameters the rank holds) and, merged over all ranks, gives every
// parameter exactly once. `options` and `io` as for SaveMindSporeCheckpoint (which writes it).
SAVEPOINT_API Status SaveMindSporeRedundancyFree(const State& local,
                                                 const std::string& strategy_file, int64_t rank,
                                                 const std::string& path,
                                                 const MindSporeSaveOptions& options = {},
                                                 const IoOptions& io = {});

// --- Exporting a native checkpoint as a MindSpore job's rank files. ---

struct SAVEPOINT_API MindSporeExportOptions {
  // The MindSpore job's strategy file (protobuf or JSON; a merged file for a pipeline job);
  // nullopt = not split (one rank, every tensor whole). Default: nullopt.
  std::optional<std::string> dst_strategy_file = std::nullopt;
  // Destination ranks to write; empty = all. Default: empty.
  std::vector<int64_t> ranks = {};
  // How the source is read (verify_checksums, key for an encrypted source; mmap and map_mode must
  // stay at their defaults; names must be empty). Default: {}.
  LoadOptions load = {};
  // Replace existing destination files. Default: true (as transform_checkpoints).
  bool overwrite = true;
};

// Writes the native checkpoint at `src` (written by SaveDistributed or Save: any sharding) as
// `dst_dir/rank_N/{prefix}N.ckpt` for the ranks of options.dst_strategy_file, the files
// MindSpore's transform_checkpoints writes from the merged checkpoint: a tensor with a layout is
// cut to the rank's box (and left out on the ranks of other pipeline stages), every other tensor
// and every value is copied whole; of the metadata only what the .ckpt format keeps
// (kMindSporeMetadataKey) is carried over. So MindSpore's load_checkpoint on rank N gets exactly
// its slices. Every rank's layout is planned and checked before the first file is written; each
// rank reads only the chunks its boxes overlap (LoadDistributed), holds its boxes in memory, and is
// committed atomically. The strategy file itself is not copied. Errors name the destination rank
// and the tensor (InvalidArgument for a shape the strategy cannot split or a rank outside it).
SAVEPOINT_API Status ExportMindSporeDistributed(const std::string& src, const std::string& dst_dir,
                                                const std::string& prefix,
                                                const MindSporeExportOptions& options = {},
                                                const IoOptions& io = {});

}  // namespace savepoint

#endif  // SAVEPOINT_MINDSPORE_STRATEGY_H_
