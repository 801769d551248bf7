// Communicator: the collective operations a multi-rank save or load needs, shaped like PyTorch's
// c10d ProcessGroup (rank, size, barrier, broadcast, gather and all-gather of bytes).
//
// Every collective must be called by every rank of the group, in the same order (the k-th
// collective of one rank meets the k-th collective of every other rank). Every call takes a
// timeout; when it passes, the call fails with DeadlineExceeded naming the operation and, where the
// implementation can tell, the ranks that did not arrive, and the group is then broken: the other
// ranks' pending and later collectives fail too, instead of hanging.
//
// Abort(reason) breaks the group on purpose: a rank that cannot continue calls it so that the
// others return an error (reason, naming the aborting rank) instead of waiting for it.
//
// Implementations:
//  - NewSingleProcessCommunicator(): one rank; every collective is immediate.
//  - NewThreadCommunicators(n): n ranks inside one process (one per thread), for tests.
//  - NewMpiCommunicator() (savepoint/mpi.h, library savepoint_mpi): OpenMPI, one rank per process.
// A Python front end can wrap a torch process group behind the same interface.
//
// Thread safety: one Communicator object is used by one thread at a time (its rank's thread).
// Distinct Communicators of a thread group may be used concurrently from distinct threads.
#ifndef SAVEPOINT_COMM_H_
#define SAVEPOINT_COMM_H_

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/export.h"
#include "savepoint/status.h"

namespace savepoint {

using Timeout = std::chrono::milliseconds;

class SAVEPOINT_API Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's (or thread's) rank in [0, size()).
  virtual int rank() const = 0;
  // Number of ranks in the group (>= 1).
  virtual int size() const = 0;

  // Returns once every rank has entered the barrier.
  virtual Status Barrier(Timeout timeout) = 0;
  // On `root`, sends *bytes to every rank; elsewhere replaces *bytes with root's bytes.
  virtual Status Broadcast(std::string* bytes, int root, Timeout timeout) = 0;
  // Every rank contributes `bytes` (sizes may differ); on `root` the result holds size() entries,
  // entry r from rank r; on other ranks it is empty.
  virtual Result<std::vector<std::string>> Gather(std::string_view bytes, int root,
                                                  Timeout timeout) = 0;
  // Every rank contributes `bytes` (sizes may differ) and receives all contributions, entry r from
  // rank r.
  virtual Result<std::vector<std::string>> AllGather(std::string_view bytes, Timeout timeout) = 0;

  // Breaks the group: pending and later collectives on the other ranks fail with `reason` (with
  // this rank named in the message). Never blocks. Later collectives on this rank fail too.
  virtual void Abort(const Status& reason) = 0;
};

// A group of one.
SAVEPOINT_API std::unique_ptr<Communicator> NewSingleProcessCommunicator();

// `n` communicators (1 <= n <= 4096) sharing in-process state: element r is rank r. Each is meant
// to be driven by its own thread. They may be destroyed in any order.
SAVEPOINT_API std::vector<std::unique_ptr<Communicator>> NewThreadCommunicators(int n);

}  // namespace savepoint

#endif  // SAVEPOINT_COMM_H_
