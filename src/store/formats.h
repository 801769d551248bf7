// The stores behind the seam (store.h), one factory per format; OpenRead and OpenWrite
// (store.cc) check the options that every store shares and call these.
#ifndef SAVEPOINT_STORE_FORMATS_H_
#define SAVEPOINT_STORE_FORMATS_H_

#include <memory>
#include <optional>
#include <string>

#include "store/store.h"

namespace savepoint::store {

// native.cc
Result<std::unique_ptr<Reader>> OpenNative(const std::string& path, const LoadOptions& options,
                                           const IoOptions& io);
std::unique_ptr<Writer> NativeWriter(const engine::WriteRequest& request);
// files.cc
Result<std::unique_ptr<Reader>> OpenSafetensors(const std::string& path, const LoadOptions& options,
                                                const IoOptions& io);
Result<std::unique_ptr<Reader>> OpenCkpt(const std::string& path, const LoadOptions& options,
                                         const IoOptions& io, std::optional<Cipher> cipher);
std::unique_ptr<Writer> FileWriter(const engine::WriteRequest& request, Format format,
                                   const FileOptions& file);
// foreign.cc: read whole at open.
Result<std::unique_ptr<Reader>> OpenDcp(const std::string& path, const LoadOptions& options,
                                        const IoOptions& io);
Result<std::unique_ptr<Reader>> OpenRecis(const std::string& path, const LoadOptions& options,
                                          const IoOptions& io);

// The entries of a State, in name order (tensors with dtype and shape; values as non-tensors).
std::vector<Entry> EntriesOf(const State& state);
// The entries of `state` that `names` selects (MatchesName; empty = all), as views `state` keeps
// alive, with its metadata. NotFound naming `where` for a name that matches nothing.
Result<State> Select(std::shared_ptr<const State> state, const std::vector<std::string>& names,
                     const std::string& where);

}  // namespace savepoint::store

#endif  // SAVEPOINT_STORE_FORMATS_H_
