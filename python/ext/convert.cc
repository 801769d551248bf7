// savepoint.convert: the library's Convert (savepoint/checkpoint.h), any readable format into any
// writable one, with the GIL released.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "common.h"
#include "savepoint/checkpoint.h"
#include "savepoint/mindspore.h"

namespace savepoint::python {
namespace {

Format FormatOf(const std::optional<std::string>& name) {
  return name ? Take(ParseFormat(*name)) : Format::kAuto;
}

nb::dict Convert(const std::string& src, const std::string& dst,
                 const std::optional<std::string>& from, const std::optional<std::string>& to,
                 bool overwrite, nb::handle source_key,
                 const std::optional<std::string>& source_cipher, nb::handle key,
                 const std::string& cipher, bool file_checksum, bool mindspore_flavour,
                 int io_threads) {
  ConvertOptions o{.from = FormatOf(from),
                   .to = FormatOf(to),
                   .overwrite = overwrite,
                   .source_key = KeyFromPython(source_key, "source_key"),
                   .key = KeyFromPython(key, "key"),
                   .cipher = Take(ParseMindSporeCipher(cipher)),
                   .file_checksum = file_checksum,
                   .mindspore_flavour = mindspore_flavour};
  if (source_cipher) o.source_cipher = Take(ParseMindSporeCipher(*source_cipher));
  Result<ConvertReport> r = InternalError("not converted");
  {
    nb::gil_scoped_release release;
    r = savepoint::Convert(src, dst, o, {.io_threads = io_threads});
  }
  const ConvertReport report = Take(std::move(r));
  nb::dict d;
  d["from"] = std::string(FormatName(report.from));
  d["to"] = std::string(FormatName(report.to));
  d["tensors"] = report.tensors;
  d["values"] = report.values;
  d["tables"] = report.tables;
  d["table_rows"] = report.table_rows;
  d["tensor_bytes"] = report.tensor_bytes;
  nb::list notes;
  for (const std::string& n : report.notes) notes.append(n);
  d["notes"] = notes;
  return d;
}

}  // namespace

void BindConvert(nb::module_& m) {
  m.def("convert", &Convert, nb::arg("src"), nb::arg("dst"), nb::arg("from_").none(),
        nb::arg("to").none(), nb::arg("overwrite"), nb::arg("source_key").none(),
        nb::arg("source_cipher").none(), nb::arg("key").none(), nb::arg("cipher"),
        nb::arg("file_checksum"), nb::arg("mindspore_flavour"), nb::arg("io_threads"));
}

}  // namespace savepoint::python
