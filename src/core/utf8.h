// UTF-8 validation (RFC 3629: no overlongs, no surrogates, at most U+10FFFF).
#ifndef SAVEPOINT_CORE_UTF8_H_
#define SAVEPOINT_CORE_UTF8_H_

#include <string_view>

namespace savepoint {

bool IsValidUtf8(std::string_view s);

}  // namespace savepoint

#endif  // SAVEPOINT_CORE_UTF8_H_
