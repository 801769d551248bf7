// DefaultFileSystem() (savepoint/filesystem.h): local paths go to the POSIX file system, "s3://"
// URIs to an S3 file system built from the environment on first use, other schemes are refused.
#ifndef SAVEPOINT_IO_DEFAULT_FS_H_
#define SAVEPOINT_IO_DEFAULT_FS_H_

#include <string_view>

#include "savepoint/filesystem.h"

namespace savepoint::io {

// The process-wide POSIX file system (io/posix_fs.cc). Never null; never destroyed.
FileSystem* PosixFileSystemInstance();

// The scheme of `path` ("s3" for "s3://b/k"), or empty when it has none: a scheme is a letter
// followed by letters, digits, '+', '-' or '.', then "://".
std::string_view SchemeOf(std::string_view path);

}  // namespace savepoint::io

#endif  // SAVEPOINT_IO_DEFAULT_FS_H_
