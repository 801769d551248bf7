// KeyFromPython (common.h): Python keys as EncryptionKey.
#include <nanobind/stl/string.h>

#include "common.h"

namespace savepoint::python {

EncryptionKey KeyFromPython(nb::handle key, const char* what) {
  if (key.is_none()) return {};
  if (nb::isinstance<nb::bytes>(key)) {
    nb::bytes b = nb::borrow<nb::bytes>(key);
    return EncryptionKey::FromBytes(
        std::span(static_cast<const std::byte*>(static_cast<const void*>(b.c_str())), b.size()));
  }
  if (nb::isinstance<nb::str>(key)) return EncryptionKey::FromFile(nb::cast<std::string>(key));
  if (PyCallable_Check(key.ptr())) {
    nb::object fn = nb::borrow(key);
    // The provider runs on a C++ thread with the GIL released; it takes the GIL to call Python.
    // The callable is kept alive by the EncryptionKey (released with the GIL taken).
    auto holder = std::shared_ptr<nb::object>(new nb::object(fn), [](nb::object* o) {
      nb::gil_scoped_acquire gil;
      delete o;
    });
    auto provider = [holder]() -> Result<std::string> {
      nb::gil_scoped_acquire gil;
      try {
        nb::object out = (*holder)();
        if (!nb::isinstance<nb::bytes>(out)) {
          return InvalidArgumentError("the key provider returned something other than bytes");
        }
        nb::bytes b = nb::borrow<nb::bytes>(out);
        return std::string(b.c_str(), b.size());
      } catch (const nb::python_error& e) {
        return InvalidArgumentError(std::string("the key provider raised ") + e.what());
      }
    };
    return EncryptionKey::FromProvider(provider, nb::cast<std::string>(nb::repr(key)));
  }
  throw nb::type_error((std::string(what) +
                        ": a key is bytes (the raw key), a str or os.PathLike (a key file) or a "
                        "callable returning bytes")
                           .c_str());
}

}  // namespace savepoint::python
