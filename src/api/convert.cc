// The public Convert: a source store read (src/store/), a target store written. The target is
// opened first, so that a refused option or an existing target fails before the source is read.
#include <fmt/format.h>

#include <memory>

#include "engine/request.h"
#include "savepoint/checkpoint.h"
#include "savepoint/sparse.h"
#include "store/store.h"

namespace savepoint {
namespace {

engine::WriteRequest TargetRequest(const std::string& dst, const ConvertOptions& o,
                                   const IoOptions& io) {
  engine::WriteRequest r;
  r.path = dst;
  r.options.overwrite = o.overwrite;
  r.options.key = o.key;
  r.options.progress = o.write_progress;
  r.io = io;
  return r;
}

void Describe(const State& state, ConvertReport* report) {
  report->tensors = state.num_tensors();
  report->values = state.size() - state.num_tensors();
  report->tensor_bytes = state.tensor_bytes();
  report->tables = state.tables().size();
  for (const auto& [name, t] : state.tables()) report->table_rows += t->num_rows();
}

}  // namespace

Result<ConvertReport> Convert(const std::string& src, const std::string& dst,
                              const ConvertOptions& o, const IoOptions& io) {
  ConvertReport report;
  report.to = o.to == Format::kAuto ? TargetFormat(dst) : o.to;
  SP_ASSIGN_OR_RETURN(std::unique_ptr<store::Writer> writer,
                      store::OpenWrite(TargetRequest(dst, o, io), report.to,
                                       {.file_checksum = o.file_checksum,
                                        .mindspore_flavour = o.mindspore_flavour,
                                        .cipher = o.cipher}));
  Format from = o.from;
  if (from == Format::kAuto) {
    SP_ASSIGN_OR_RETURN(from, DetectFormat(src, FileSystemOf(io)));
  }
  // Native and safetensors sources are mapped where they can be (not when encrypted).
  const LoadOptions read{.mmap = !o.source_key && store::CapabilitiesOf(from).map,
                         .progress = o.read_progress,
                         .key = o.source_key};
  SP_ASSIGN_OR_RETURN(std::unique_ptr<store::Reader> reader,
                      store::OpenRead(src, from, read, io, o.source_cipher));
  report.from = reader->format();
  report.notes = reader->notes();
  SP_ASSIGN_OR_RETURN(State state, reader->Read({}));
  if (!state.tables().empty() && !store::CapabilitiesOf(report.to).tables) {
    return InvalidArgumentError(
        fmt::format("convert {} to {}: the source has {} sparse tables, which only native "
                    "checkpoints hold",
                    src, dst, state.tables().size()));
  }
  SP_RETURN_IF_ERROR(writer->Commit(state));
  Describe(state, &report);
  return report;
}

}  // namespace savepoint
