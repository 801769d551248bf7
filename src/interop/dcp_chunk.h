// One tensor chunk of a DCP FileSystemWriter directory (see savepoint/dcp.h): the torch names of
// dtypes, and the decoding of a torch.save archive (an uncompressed zip holding `data.pkl` and the
// raw storage `data/<key>`) into a contiguous box.
#ifndef SAVEPOINT_INTEROP_DCP_CHUNK_H_
#define SAVEPOINT_INTEROP_DCP_CHUNK_H_

#include <optional>
#include <string_view>

#include "interop/pickle.h"
#include "savepoint/dtype.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"

namespace savepoint::interop {

// The dtype of a torch global: a dtype ("torch.float32") or a typed storage
// ("torch.FloatStorage"); nullopt for anything else.
std::optional<DType> DTypeOfTorchGlobal(std::string_view global);

// Adds the torch dtype names to `o` as constants (what DCP's metadata and data.pkl refer to).
void AllowTorchDTypes(PickleOptions* o);

// Decodes chunk bytes into `out` (C order, `sizes`, `dtype`; NumBytes(dtype, sizes) bytes): a
// torch.save archive of a tensor of that dtype and sizes (any strides and storage offset within
// its storage), or, when the bytes are not a zip archive, exactly the raw bytes (DCP's
// safetensors serialization). Errors name `what` and the byte offset.
Status DecodeTensorChunk(std::string_view bytes, DType dtype, const Shape& sizes, std::byte* out,
                         std::string_view what);

}  // namespace savepoint::interop

#endif  // SAVEPOINT_INTEROP_DCP_CHUNK_H_
