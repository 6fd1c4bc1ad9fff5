// ckpt._ckpt: the extension module. Vocabulary types (DType, Codec, Box,
// FlatRange), the status -> exception translator and the version; the
// Writer, Reader and communicators are bound in their own files.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <new>
#include <string>

#include "absl/strings/str_cat.h"
#include "bind.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/types.h"
#include "ckpt/version.h"
#include "communicator.h"
#include "errors.h"

namespace ckpt::python {
namespace py = pybind11;

Dims ToDims(const std::vector<int64_t>& v, const char* what) {
  Dims d;
  for (int64_t x : v) {
    if (x < 0) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat(what, ": negative value ", x)));
    }
    d.push_back(static_cast<uint64_t>(x));
  }
  return d;
}

py::tuple ToTuple(const Dims& d) {
  py::tuple t(d.size());
  for (size_t i = 0; i < d.size(); ++i) t[i] = py::int_(d[i]);
  return t;
}

Region ToRegion(py::handle region) {
  if (py::isinstance<Box>(region)) return region.cast<Box>();
  if (py::isinstance<FlatRange>(region)) return region.cast<FlatRange>();
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("region: expected a ckpt.Box or ckpt.FlatRange, got a ",
                   Py_TYPE(region.ptr())->tp_name)));
}

py::object FromRegion(const Region& region) {
  if (const Box* b = std::get_if<Box>(&region)) return py::cast(*b);
  return py::cast(std::get<FlatRange>(region));
}

namespace {

void BindDTypeAndCodec(py::module_& m) {
  py::enum_<DType> dtype(m, "DType",
                         "Element types of format v1 (spec/FORMAT.md §9).");
  for (DType d : kAllDTypes) dtype.value(std::string(DTypeName(d)).c_str(), d);
  dtype.def_property_readonly("itemsize", [](DType d) { return DTypeSize(d); })
      .def_property_readonly("is_floating_point",
                             [](DType d) { return IsFloatingPoint(d); })
      .def_static(
          "from_name",
          [](const std::string& name) {
            return ValueOrThrow(DTypeFromName(name));
          },
          "The DType of a canonical name ('float32', 'bfloat16', ...).")
      .def("__str__", [](DType d) { return std::string(DTypeName(d)); });

  py::enum_<format::Codec>(m, "Codec")
      .value("none", format::Codec::kNone)
      .value("zstd", format::Codec::kZstd);
}

void BindBox(py::module_& m) {
  py::class_<Box>(m, "Box",
                  "An n-d box: offset[d] <= x[d] < offset[d] + size[d].")
      .def(py::init([](const std::vector<int64_t>& offset,
                       const std::vector<int64_t>& size) {
             if (offset.size() != size.size()) {
               throw StatusError(absl::InvalidArgumentError(
                   absl::StrCat("Box: offset has ", offset.size(),
                                " dims, size ", size.size())));
             }
             return Box{ToDims(offset, "Box offset"), ToDims(size, "Box size")};
           }),
           py::arg("offset"), py::arg("size"))
      .def_static(
          "full",
          [](const std::vector<int64_t>& shape) {
            return FullBox(ToDims(shape, "shape"));
          },
          "The whole tensor of `shape` as a box.")
      .def_property_readonly("offset",
                             [](const Box& b) { return ToTuple(b.offset); })
      .def_property_readonly("size",
                             [](const Box& b) { return ToTuple(b.size); })
      .def_property_readonly("numel",
                             [](const Box& b) { return RegionElements(b); })
      .def("__eq__", [](const Box& a, const Box& b) { return a == b; })
      .def("__repr__", [](const Box& b) { return "Box" + RegionToString(b); });
}

void BindFlatRange(py::module_& m) {
  py::class_<FlatRange>(
      m, "FlatRange",
      "Elements [start, start + length) of the row-major flattening.")
      .def(
          py::init([](int64_t start, int64_t length) {
            if (start < 0 || length < 0) {
              throw StatusError(absl::InvalidArgumentError(absl::StrCat(
                  "FlatRange: negative start ", start, " or length ", length)));
            }
            return FlatRange{static_cast<uint64_t>(start),
                             static_cast<uint64_t>(length)};
          }),
          py::arg("start"), py::arg("length"))
      .def_readonly("start", &FlatRange::start)
      .def_readonly("length", &FlatRange::length)
      .def_property_readonly("numel",
                             [](const FlatRange& f) { return f.length; })
      .def("__eq__",
           [](const FlatRange& a, const FlatRange& b) { return a == b; })
      .def("__repr__",
           [](const FlatRange& f) { return "FlatRange" + RegionToString(f); });
}

void BindTypes(py::module_& m) {
  BindDTypeAndCodec(m);
  BindBox(m);
  BindFlatRange(m);
}

// Raises the ckpt.Error subclass of a status code (ckpt._errors) with the
// library's message.
void TranslateStatusError(const StatusError& e) {
  py::object cls =
      py::module_::import("ckpt._errors")
          .attr("error_class")(static_cast<int>(e.status().code()));
  PyErr_SetObject(cls.ptr(), py::str(std::string(e.status().message())).ptr());
}

// An allocation the library could not bound by what is on disk failed:
// ckpt.ResourceExhaustedError (a MemoryError), never a bare
// "MemoryError: std::bad_alloc".
void TranslateBadAlloc() {
  TranslateStatusError(StatusError(absl::ResourceExhaustedError(
      "out of memory: an allocation failed (std::bad_alloc)")));
}

}  // namespace
}  // namespace ckpt::python

PYBIND11_MODULE(_ckpt, m) {
  namespace py = pybind11;
  using namespace ckpt::python;
  m.doc() = "ckpt's C++ API (thin binding; use the ckpt package).";
  m.attr("__version__") = CKPT_VERSION_STRING;
#ifdef CKPT_PYTHON_S3
  m.attr("has_s3") = true;
#else
  m.attr("has_s3") = false;
#endif
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      TranslateStatusError(e);
    } catch (const std::bad_alloc&) {
      TranslateBadAlloc();
    }
  });
  BindTypes(m);
  BindCommunicators(m);
  BindWriter(m);
  BindReader(m);
  BindOps(m);
}
