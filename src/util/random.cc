#include "util/random.h"

#include <unistd.h>

#include <random>

namespace savepoint {

uint64_t RandomU64() {
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   (static_cast<uint64_t>(::getpid()) << 32)};
  return rng();
}

}  // namespace savepoint
