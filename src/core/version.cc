// The library's version (savepoint/savepoint.h), from the project version CMake passes in.
#include "savepoint/savepoint.h"

namespace savepoint {

const char* Version() { return SAVEPOINT_VERSION; }

}  // namespace savepoint
