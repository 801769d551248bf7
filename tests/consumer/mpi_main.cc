// Links the installed savepoint::savepoint_mpi: one process's communicator (run without mpirun,
// MPI starts a singleton job).
#include <savepoint/mpi.h>

#include <cstdio>

int main() {
  auto comm = savepoint::NewMpiCommunicator();
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  std::printf("consumer_mpi OK: rank %d of %d\n", (*comm)->rank(), (*comm)->size());
  return 0;
}
