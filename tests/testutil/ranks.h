// Runs a function on every rank of an in-process thread communicator group (tests only).
#ifndef SAVEPOINT_TESTUTIL_RANKS_H_
#define SAVEPOINT_TESTUTIL_RANKS_H_

#include <functional>
#include <thread>
#include <vector>

#include "savepoint/comm.h"

namespace savepoint::testing {

// Runs fn(comm) on one thread per rank of a new group of `n`; returns each rank's status.
inline std::vector<Status> OnRanks(int n, const std::function<Status(Communicator&)>& fn) {
  auto comms = NewThreadCommunicators(n);
  std::vector<Status> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { out[r] = fn(*comms[r]); });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace savepoint::testing

#endif  // SAVEPOINT_TESTUTIL_RANKS_H_
