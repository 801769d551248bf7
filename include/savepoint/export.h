// SAVEPOINT_API: marks the public API, the only symbols libsavepoint exports.
//
// The library is compiled with hidden visibility (-fvisibility=hidden, inline functions hidden
// too), so everything under src/ stays internal to libsavepoint.so: `nm -DC` of the installed
// library lists the public API of include/savepoint/ and nothing of savepoint::engine, io,
// format, ... Each public class with out-of-line members and each public free function carries
// SAVEPOINT_API; a public header that declares either includes this file.
#ifndef SAVEPOINT_EXPORT_H_
#define SAVEPOINT_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define SAVEPOINT_API [[gnu::visibility("default")]]
#else
#define SAVEPOINT_API
#endif

#endif  // SAVEPOINT_EXPORT_H_
