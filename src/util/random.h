// Random 64-bit values for checkpoint ids and unique hidden names.
#ifndef SAVEPOINT_UTIL_RANDOM_H_
#define SAVEPOINT_UTIL_RANDOM_H_

#include <cstdint>

namespace savepoint {

// A random 64-bit value from a per-thread generator seeded from the OS and the process id.
// Thread-safe (each thread has its own generator). Not for cryptographic use.
uint64_t RandomU64();

}  // namespace savepoint

#endif  // SAVEPOINT_UTIL_RANDOM_H_
