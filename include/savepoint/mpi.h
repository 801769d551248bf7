// The OpenMPI Communicator (library savepoint_mpi; libsavepoint itself does not link MPI).
//
// Jobs are launched with `mpirun -np N prog`; each process creates one communicator. It works on a
// duplicate of MPI_COMM_WORLD, so it never mixes with the application's own MPI traffic.
// Collectives are built from non-blocking point-to-point messages polled against the deadline, so
// a timeout names the ranks that did not arrive (as seen by the coordinating rank) and no call
// blocks past its timeout. Abort() and timeouts send an abort message to every other rank, whose
// pending and later collectives then fail with the reason.
//
// Thread safety: MPI is initialised with MPI_THREAD_SERIALIZED when this creates it; use each
// communicator from one thread at a time.
#ifndef SAVEPOINT_MPI_H_
#define SAVEPOINT_MPI_H_

#include <memory>

#include "savepoint/comm.h"
#include "savepoint/export.h"

namespace savepoint {

// A communicator over all processes of the MPI job (MPI_COMM_WORLD). Initialises MPI when it is
// not initialised yet, and then finalises it when the communicator is destroyed.
SAVEPOINT_API Result<std::unique_ptr<Communicator>> NewMpiCommunicator();

}  // namespace savepoint

#endif  // SAVEPOINT_MPI_H_
