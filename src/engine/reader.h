// CheckpointReader implementation and the chunk-read pipeline shared by Load, LoadInto and Verify.
#ifndef SAVEPOINT_ENGINE_READER_H_
#define SAVEPOINT_ENGINE_READER_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "format/manifest.h"
#include "savepoint/checkpoint.h"

namespace savepoint::engine {

// Where a tensor's bytes go: `data` (nullptr = verify only) with `capacity` writable bytes.
struct Destination {
  std::byte* data = nullptr;
  uint64_t capacity = 0;
};

class Reader final : public CheckpointReader {
 public:
  static Result<std::unique_ptr<Reader>> OpenImpl(const std::string& path, const LoadOptions& o);

  const std::string& path() const override { return path_; }
  uint32_t format_version() const override { return m_.version; }
  int64_t created_ns() const override { return m_.created_ns; }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  uint64_t total_file_bytes() const override { return total_bytes_; }
  const TensorInfo* FindTensor(const std::string& name) const override;
  const State& values() const override { return m_.values; }
  const Json& manifest_json() const override { return json_; }

  Status ReadTensor(const std::string& name, const TensorView& dst) override;
  Result<Tensor> ReadTensor(const std::string& name) override;
  Status Verify(IoStats* stats) override;

  // Reads several tensors (by index into the manifest) into their destinations in one parallel
  // pass. Destinations of multi-shard tensors receive the assembled global tensor.
  Status ReadMany(const std::vector<std::pair<size_t, Destination>>& jobs, IoStats* stats,
                  bool verify);
  // Index of a tensor in the manifest, or -1.
  int64_t IndexOf(std::string_view name) const;

 private:
  Reader() = default;
  struct Task;
  // A shard that is a box of its tensor: read into `buffer`, then copied into `dst`.
  struct Scatter {
    Tensor buffer;
    const format::TensorRecord* tensor;
    const format::ShardRecord* shard;
    Destination dst;
  };
  Result<RandomAccessFile*> File(uint32_t index);
  Status ReadChunk(const Task& t, std::byte* staging, bool verify);
  Status AddTasks(size_t tensor, Destination dst, std::vector<Task>* tasks,
                  std::vector<Scatter>* scatter);

  FileSystem* fs_ = nullptr;
  LoadOptions options_;
  std::string path_;
  format::Manifest m_;
  Json json_;
  std::vector<TensorInfo> infos_;
  uint64_t total_bytes_ = 0;
  std::mutex mu_;  // guards files_
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
};

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_READER_H_
