// ckpt._ckpt.Writer, SaveOptions and SaveResult. The Writer stores pointers
// into registered arrays (ckpt/writer.h); the binding keeps each borrowed
// view alive until the name is removed, replaced or the Writer is gone.
#include "ckpt/writer.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bind.h"
#include "buffers.h"
#include "communicator.h"
#include "errors.h"

namespace ckpt::python {
namespace py = pybind11;
namespace {

class PyWriter {
 public:
  explicit PyWriter(py::object comm) : comm_obj_(std::move(comm)) {
    Writer::Options o;
    o.comm = ResolveCommunicator(comm_obj_, &owned_comm_);
    writer_ = ValueOrThrow(Writer::Create(o));
  }
  ~PyWriter() {
    // The C++ writer may hold the communicator adapter's pointer: it goes
    // first, then the adapter (which takes the GIL), then the views.
    writer_.reset();
    py::gil_scoped_release nogil;
    owned_comm_.reset();
  }

  void AddTensor(const std::string& name, DType dtype,
                 const std::vector<int64_t>& shape, py::handle region,
                 py::handle data, bool replica, bool partial) {
    Shape s = ToDims(shape, ("entry '" + name + "': shape").c_str());
    Region r = ToRegion(region);
    std::string what = absl::StrCat("entry '", name, "'");
    if (absl::Status rs = ValidateRegion(r, s); !rs.ok()) {
      throw StatusError(
          absl::InvalidArgumentError(absl::StrCat(what, ": ", rs.message())));
    }
    BorrowedBuffer buf = Borrow(data, /*writable=*/false, what);
    CheckFits(buf, dtype, RegionElements(r), what);
    TensorOptions to;
    to.replica = replica;
    to.partial = partial;
    to.memory = buf.memory;
    to.device = buf.device;
    ThrowIfError(writer_->AddTensor(name, dtype, s, r, buf.data, to));
    views_[name] = std::move(buf);
  }

  void SetObject(const std::string& name, py::bytes bytes) {
    ThrowIfError(writer_->SetObject(name, std::string(bytes)));
  }

  void Remove(const std::string& name) {
    ThrowIfError(writer_->Remove(name));
    views_.erase(name);
  }

  void Clear() {
    writer_->Clear();
    views_.clear();
  }

  SaveResult Save(const std::string& root, uint64_t step,
                  const SaveOptions& options) {
    py::gil_scoped_release nogil;
    return ValueOrThrow(writer_->Save(root, step, options));
  }

 private:
  py::object comm_obj_;
  std::unique_ptr<Communicator> owned_comm_;
  std::unique_ptr<Writer> writer_;
  std::map<std::string, BorrowedBuffer> views_;
};

}  // namespace

void BindWriter(py::module_& m) {
  py::class_<SaveOptions>(m, "SaveOptions",
                          "Options of Writer.save (ckpt/writer.h).")
      .def(py::init<>())
      .def_readwrite("codec", &SaveOptions::codec)
      .def_readwrite("zstd_level", &SaveOptions::zstd_level)
      .def_readwrite("io_threads", &SaveOptions::io_threads)
      .def_readwrite("block_size", &SaveOptions::block_size)
      .def_readwrite("alignment", &SaveOptions::alignment)
      .def_readwrite("direct_io", &SaveOptions::direct_io)
      .def_readwrite("overwrite", &SaveOptions::overwrite)
      .def_readwrite("keep_last", &SaveOptions::keep_last)
      .def_readwrite("reuse_recorded_plan", &SaveOptions::reuse_recorded_plan)
      .def_readwrite("metadata", &SaveOptions::metadata);

  py::class_<SaveResult>(m, "SaveResult",
                         "What Writer.save did (ckpt/writer.h).")
      .def_readonly("path", &SaveResult::path)
      .def_readonly("logical_bytes", &SaveResult::logical_bytes)
      .def_readonly("stored_bytes", &SaveResult::stored_bytes)
      .def_readonly("local_stored_bytes", &SaveResult::local_stored_bytes)
      .def_readonly("plan_cache_hit", &SaveResult::plan_cache_hit)
      .def_readonly("plan_seconds", &SaveResult::plan_seconds)
      .def_readonly("write_seconds", &SaveResult::write_seconds)
      .def_readonly("commit_seconds", &SaveResult::commit_seconds)
      .def("__repr__", [](const SaveResult& r) {
        return absl::StrCat("SaveResult(path='", r.path,
                            "', logical_bytes=", r.logical_bytes,
                            ", stored_bytes=", r.stored_bytes, ")");
      });

  py::class_<PyWriter>(
      m, "Writer",
      "Registers this rank's tensors and objects and saves them "
      "(ckpt/writer.h). Registered arrays are borrowed, not copied: "
      "they must not change during save().")
      .def(py::init<py::object>(), py::arg("comm") = py::none())
      .def("add_tensor", &PyWriter::AddTensor, py::arg("name"),
           py::arg("dtype"), py::arg("shape"), py::arg("region"),
           py::arg("data"), py::arg("replica") = false,
           py::arg("partial") = false)
      .def("set_object", &PyWriter::SetObject, py::arg("name"), py::arg("data"))
      .def("remove", &PyWriter::Remove, py::arg("name"))
      .def("clear", &PyWriter::Clear)
      .def("save", &PyWriter::Save, py::arg("root"), py::arg("step"),
           py::arg("options") = SaveOptions());
}

}  // namespace ckpt::python
