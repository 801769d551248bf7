// Asynchronous, two-phase saves: training is blocked only while the state is copied.
//
//   auto ckpt = savepoint::Checkpointer::Create({}).value();
//   auto handle = ckpt->SaveAsync(state, "/ckpt/step-1000").value();  // returns after the copy
//   ... keep training; the caller may now modify its tensors ...
//   savepoint::Status s = handle.Wait();                              // durable when OK
//
// Phase 1, snapshot (the caller's thread, helped by snapshot_threads - 1 more): every tensor is
// copied into a staging pool laid out as the data file will be (4 KiB-aligned extents packed into
// fixed-size slabs), and each chunk's CRC32C is computed while its bytes are hot in cache. An
// encrypted save (SaveOptions::key, resolved by SaveAsync on the caller's thread) encrypts during
// this copy, so the caller is blocked longer (AES-GCM runs at a few GB/s per thread,
// docs/PERFORMANCE.md); compressed chunks are encrypted after compression, in phase 2. Phase 2,
// persist (background threads): the staged slabs are written with direct I/O once the snapshot is
// done (or as soon as they are filled, when the pool runs short or persist_during_snapshot is set),
// then the manifest is written and the checkpoint committed exactly like a synchronous Save
// (docs/FORMAT.md §5).
//
// Memory is bounded: the pool never holds more than `staging_bytes`. When the state is larger,
// the snapshot fills slabs as fast as the persist threads drain them, so the caller is blocked for
// roughly (state bytes - staging bytes) / disk bandwidth on top of the copy. Slabs are reused
// across saves, so a steady training loop does not page-fault on every save.
//
// Thread safety: a Checkpointer may be used from several threads; SaveHandle is a shared,
// thread-safe reference to one save.
#ifndef SAVEPOINT_ASYNC_H_
#define SAVEPOINT_ASYNC_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "savepoint/checkpoint.h"
#include "savepoint/export.h"
#include "savepoint/io_options.h"
#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint {

struct SparseSaveOptions;  // savepoint/sparse.h

// Copies tensor bytes into host staging memory during the snapshot. The default copies with
// memcpy and checksums in the same pass. A device copier (e.g. CUDA device-to-host) implements
// this to snapshot accelerator memory; the CRC is then computed on the staged host bytes.
// Thread safety: Copies() and Copy() are called from several snapshot threads at once;
// PrepareStaging() and ReleaseStaging() from the thread allocating or freeing a slab.
class SAVEPOINT_API SnapshotCopier {
 public:
  virtual ~SnapshotCopier() = default;
  // Whether this copier copies the tensor memory at `src` (one call per tensor chunk). false
  // leaves that memory to the built-in copy, which checksums while it copies (e.g. a device
  // copier declines plain host memory). Default: true.
  virtual bool Copies(const std::byte* src) const {
    (void)src;
    return true;
  }
  // Copies `n` bytes from `src` (tensor memory as given in the State) to `dst` (host memory).
  // Returns only once the bytes are in `dst`.
  virtual Status Copy(const std::byte* src, std::byte* dst, uint64_t n) = 0;
  // The most bytes handed to one Copy call; the checksum of those staged bytes follows each call.
  // Default: 0 = 256 KiB, so the checksum reads bytes still in cache. A device copier asks for
  // more (up to a whole chunk) so that its per-call latency is amortised.
  virtual uint64_t max_copy_bytes() const { return 0; }
  // Called once for each staging slab when the Checkpointer allocates it, before any Copy into
  // it (e.g. to page-lock it so that a device's DMA engine writes it at full speed). An error is
  // logged and the slab used as it is. Default: nothing.
  virtual Status PrepareStaging(std::byte* slab, uint64_t n) {
    (void)slab, (void)n;
    return Status::OK();
  }
  // Called for each slab PrepareStaging succeeded on, before the Checkpointer frees it (when the
  // Checkpointer is destroyed). Default: nothing.
  virtual void ReleaseStaging(std::byte* slab, uint64_t n) { (void)slab, (void)n; }
};

struct SAVEPOINT_API CheckpointerOptions {
  // Cap on staging memory in bytes. Default: 0 = a quarter of physical RAM, at most 16 GiB.
  // At least two slabs are always used.
  uint64_t staging_bytes = 0;
  // Staging bytes to reserve (Checkpointer::Reserve) as soon as the Checkpointer is created, in
  // the background: a first save of up to this many bytes then blocks for the copy alone, not for
  // allocating and faulting in fresh memory (0.43 s of a 1.5 GiB first save, docs/PERFORMANCE.md).
  // At most staging_bytes are reserved. Default: 0 = none (a CheckpointManager with async reserves
  // its registered objects' bytes when they are registered:
  // ManagerOptions::async_save.prefault_staging).
  uint64_t prefault_bytes = 0;
  // Slab size: the unit of staging and of each background write; also the checksum chunk size.
  // A multiple of 4096 in [64 KiB, 1 GiB]. Default: 8 MiB.
  uint64_t slab_bytes = uint64_t{8} << 20;
  // Start writing staged slabs while the snapshot is still copying. Default: false: the writers
  // wait until the snapshot is done (or until the staging pool runs out of slabs, when they must
  // drain it), so the copy has the CPUs and memory bandwidth to itself and the caller is blocked
  // for little more than a memcpy (on 2 vCPUs, overlapping made the stall 2x longer,
  // docs/PERFORMANCE.md). true overlaps the two phases: a shorter time to the durable commit, for
  // machines with cores and memory bandwidth to spare.
  bool persist_during_snapshot = false;
  // Allow a new SaveAsync while an earlier save is still persisting. Default: false (SaveAsync
  // first waits for the previous save to finish, bounding memory and disk contention).
  bool allow_concurrent_saves = false;
  // Threads copying (and checksumming) the state during the snapshot, the caller's thread
  // included (0..64). Each chunk is copied by one thread; more threads shorten the time the
  // caller is blocked when one core cannot saturate memory bandwidth. Default: 0 = the hardware
  // threads, at most 4 (at most 8 with a `copier`: a CUDA copier's threads wait for their DMA
  // between checksums). 1 = the caller's thread alone.
  int snapshot_threads = 0;
  // Snapshot copier (not owned; must outlive the Checkpointer; called from several threads at
  // once when snapshot_threads != 1), e.g. CreateCudaSnapshotCopier (savepoint/cuda.h). Default:
  // nullptr = the built-in copy, which checksums each slice of the source and then streams it to
  // the staging slab.
  SnapshotCopier* copier = nullptr;
};

// A future-like reference to one save. Copyable; all copies refer to the same save.
class SAVEPOINT_API SaveHandle {
 public:
  struct Shared;
  SaveHandle() = default;
  explicit SaveHandle(std::shared_ptr<Shared> s) : s_(std::move(s)) {}

  // True once the save has committed or failed (never blocks).
  bool Poll() const;
  // Blocks until the save finishes; returns its result. OK means committed and durable.
  Status Wait() const;
  // Waits at most `timeout`; true if the save finished within it.
  bool WaitFor(std::chrono::milliseconds timeout) const;
  // The result if finished, else FailedPrecondition("still running").
  Status status() const;
  // Statistics; persist fields are final once Poll() is true.
  SaveStats stats() const;
  // The checkpoint path.
  const std::string& path() const;

 private:
  std::shared_ptr<Shared> s_;
};

class SAVEPOINT_API Checkpointer {
 public:
  virtual ~Checkpointer() = default;  // waits for every save in flight

  // `io` is the Checkpointer's for all its saves: the file system they write through, its
  // background writer threads (io.io_threads) and direct I/O of the data files.
  static Result<std::unique_ptr<Checkpointer>> Create(const CheckpointerOptions& options = {},
                                                      const IoOptions& io = {});

  // Snapshots `state` and returns once the caller may modify its tensors again; the save
  // continues in the background. Errors found before the background phase (bad path, existing
  // checkpoint, bad options) are returned here; later errors through the handle. A failed save
  // never commits; its staging memory returns to the pool. The chunk size is the Checkpointer's
  // slab_bytes: `options.chunk_bytes` must be left at its default (or equal slab_bytes),
  // `options.stats` null (SaveHandle::stats() has the statistics) and `options.progress` empty,
  // else InvalidArgument.
  // `options.compression` is honoured: the snapshot copies each chunk into a slab of its own (so a
  // small tensor takes a whole slab) and the background threads compress and write it; each writer
  // thread then also holds two slab-sized buffers outside the staging cap.
  // `options.key` is honoured (docs/FORMAT.md §10): the key is resolved here, before the copy (its
  // errors are returned here), and the chunks are encrypted into the slabs during the snapshot.
  // A state holding sparse tables (State::PutTable) is saved as SaveSparse saves it, a full
  // save; the rows are sorted into storage order (docs/FORMAT.md §11) on the caller's thread and
  // gathered into the staging slabs by the snapshot, so the caller may change its tables too once
  // this returns.
  virtual Result<SaveHandle> SaveAsync(const State& state, const std::string& path,
                                       const SaveOptions& options = {}) = 0;
  // The same with SaveSparse's options (savepoint/sparse.h): `options.base` makes it a delta (each
  // table holding its rows touched since the base and the ids deleted since, e.g. MakeDelta of a
  // DirtySet), `options.concurrency` threads sort the rows, `options.save` is SaveAsync's
  // options; `options.timeout` must be left at its default (distributed saves only). The base is
  // read here, after the previous save of this Checkpointer has finished (unless
  // allow_concurrent_saves), so it may be that save. Errors: SaveAsync's and SaveSparse's.
  virtual Result<SaveHandle> SaveAsync(const State& state, const std::string& path,
                                       const SparseSaveOptions& options) = 0;

  // Blocks until every save started so far has finished; returns the first error among them.
  virtual Status WaitAll() = 0;

  // Allocates and touches staging memory for `bytes` bytes of state (at most the cap) in a
  // background thread and returns at once, so that the next SaveAsync of that much blocks only
  // for the copy. Calls raise the target; memory already allocated stays. Saves may run meanwhile
  // (they take reserved slabs as they become ready). An allocation failure ends the reservation
  // (logged; the saves allocate as usual). The destructor stops it.
  virtual void Reserve(uint64_t bytes) = 0;

  // Staging memory currently allocated (slabs in use or cached for reuse), and its cap.
  virtual uint64_t staging_allocated_bytes() const = 0;
  virtual uint64_t staging_in_use_bytes() const = 0;
  virtual uint64_t staging_cap_bytes() const = 0;
};

}  // namespace savepoint

#endif  // SAVEPOINT_ASYNC_H_
