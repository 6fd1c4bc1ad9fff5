// ckpt._ckpt.Writer, SaveOptions and SaveResult. The Writer stores pointers
// into registered arrays (ckpt/writer.h); the binding keeps each borrowed
// view alive until the name is removed, replaced or the Writer is gone.
#include "ckpt/writer.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bind.h"
#include "buffers.h"
#include "communicator.h"
#include "errors.h"
#include "storage.h"

namespace ckpt::python {
namespace py = pybind11;
namespace {

// The handle of one Writer.save_async. Keeps its Writer (and so the
// borrowed views and the communicator) alive until the save is waited for.
class PySaveHandle {
 public:
  PySaveHandle(SaveHandle handle, py::object writer)
      : handle_(std::move(handle)), writer_(std::move(writer)) {}

  SaveResult Wait() {
    absl::StatusOr<SaveResult> r;
    {
      py::gil_scoped_release nogil;
      r = handle_.Wait();
    }
    return ValueOrThrow(std::move(r));
  }
  bool Done() const { return handle_.Done(); }

 private:
  SaveHandle handle_;
  py::object writer_;
};

class PyWriter {
 public:
  PyWriter(py::object comm, uint64_t device_snapshot_bytes,
           std::optional<uint64_t> staging_bytes)
      : comm_obj_(std::move(comm)),
        device_snapshot_bytes_(device_snapshot_bytes) {
    Writer::Options o;
    if (staging_bytes) o.staging_bytes = *staging_bytes;
    staging_bytes_ = o.staging_bytes;
    o.comm = ResolveCommunicator(comm_obj_, &owned_comm_);
    o.device_memory = PythonDeviceMemory();
    o.storage = PythonStorage();
    o.device_snapshot_bytes = device_snapshot_bytes;
    writer_ = ValueOrThrow(Writer::Create(o));
  }
  uint64_t device_snapshot_bytes() const { return device_snapshot_bytes_; }
  uint64_t staging_bytes() const { return staging_bytes_; }
  ~PyWriter() {
    // The C++ writer may hold the communicator adapter's pointer: it goes
    // first (waiting for a save in flight, whose commit may call the
    // adapter: without the GIL), then the adapter (which takes the GIL),
    // then the views.
    py::gil_scoped_release nogil;
    writer_.reset();
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

  // The snapshot is taken before this returns (the GIL released meanwhile);
  // the handle keeps `self` alive.
  PySaveHandle SaveAsync(py::object self, const std::string& root,
                         uint64_t step, const SaveOptions& options) {
    absl::StatusOr<SaveHandle> h;
    {
      py::gil_scoped_release nogil;
      h = writer_->SaveAsync(root, step, options);
    }
    return PySaveHandle(ValueOrThrow(std::move(h)), std::move(self));
  }

 private:
  py::object comm_obj_;
  uint64_t device_snapshot_bytes_ = 0;
  uint64_t staging_bytes_ = 0;
  std::unique_ptr<Communicator> owned_comm_;
  std::unique_ptr<Writer> writer_;
  std::map<std::string, BorrowedBuffer> views_;
};

void BindSaveOptions(py::module_& m) {
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
      .def_readwrite("metadata", &SaveOptions::metadata)
      .def_readwrite("snapshot_threads", &SaveOptions::snapshot_threads)
      .def_readwrite("snapshot_to_device", &SaveOptions::snapshot_to_device);
}

void BindSaveResult(py::module_& m) {
  py::class_<SaveResult>(m, "SaveResult",
                         "What Writer.save did (ckpt/writer.h).")
      .def_readonly("path", &SaveResult::path)
      .def_readonly("logical_bytes", &SaveResult::logical_bytes)
      .def_readonly("stored_bytes", &SaveResult::stored_bytes)
      .def_readonly("local_stored_bytes", &SaveResult::local_stored_bytes)
      .def_readonly("plan_cache_hit", &SaveResult::plan_cache_hit)
      .def_readonly("plan_seconds", &SaveResult::plan_seconds)
      .def_readonly("snapshot_seconds", &SaveResult::snapshot_seconds)
      .def_readonly("write_seconds", &SaveResult::write_seconds)
      .def_readonly("commit_seconds", &SaveResult::commit_seconds)
      .def_readonly("stall_seconds", &SaveResult::stall_seconds)
      .def_readonly("peak_staging_bytes", &SaveResult::peak_staging_bytes)
      .def_readonly("staging_cap_bytes", &SaveResult::staging_cap_bytes)
      .def_readonly("device_snapshot_bytes", &SaveResult::device_snapshot_bytes)
      .def("__repr__", [](const SaveResult& r) {
        return absl::StrCat("SaveResult(path='", r.path,
                            "', logical_bytes=", r.logical_bytes,
                            ", stored_bytes=", r.stored_bytes, ")");
      });
}

// ckpt.Writer and the handle of its asynchronous save. REQUIRES:
// SaveOptions is bound (the default of save's options).
void BindWriterClass(py::module_& m) {
  py::class_<PySaveHandle>(
      m, "SaveHandle",
      "The handle of Writer.save_async (ckpt::SaveHandle): wait() blocks "
      "(without the GIL) until the checkpoint is durable and returns its "
      "SaveResult, or raises the background's error; done() never blocks.")
      .def("wait", &PySaveHandle::Wait)
      .def("done", &PySaveHandle::Done);

  py::class_<PyWriter>(
      m, "Writer",
      "Registers this rank's tensors and objects and saves them "
      "(ckpt/writer.h). Registered arrays are borrowed, not copied: "
      "they must not change during save().")
      .def(py::init<py::object, uint64_t, std::optional<uint64_t>>(),
           py::arg("comm") = py::none(), py::arg("device_snapshot_bytes") = 0,
           py::arg("staging_bytes") = py::none(),
           "device_snapshot_bytes: device memory per device that save_async "
           "with SaveOptions.snapshot_to_device may snapshot CUDA tensors "
           "into (allocated at the first such save, kept with the Writer). "
           "staging_bytes: the cap of the staging memory (None: 4 GiB); "
           "save_async allocates min(cap, the bytes this rank writes) and "
           "blocks for the writes of what exceeds the cap")
      .def_property_readonly("device_snapshot_bytes",
                             &PyWriter::device_snapshot_bytes)
      .def_property_readonly("staging_bytes", &PyWriter::staging_bytes)
      .def("add_tensor", &PyWriter::AddTensor, py::arg("name"),
           py::arg("dtype"), py::arg("shape"), py::arg("region"),
           py::arg("data"), py::arg("replica") = false,
           py::arg("partial") = false)
      .def("set_object", &PyWriter::SetObject, py::arg("name"), py::arg("data"))
      .def("remove", &PyWriter::Remove, py::arg("name"))
      .def("clear", &PyWriter::Clear)
      .def("save", &PyWriter::Save, py::arg("root"), py::arg("step"),
           py::arg("options") = SaveOptions())
      .def(
          "save_async",
          [](py::object self, const std::string& root, uint64_t step,
             const SaveOptions& options) {
            return self.cast<PyWriter&>().SaveAsync(self, root, step, options);
          },
          py::arg("root"), py::arg("step"), py::arg("options") = SaveOptions(),
          "As save, but returns a SaveHandle once every registered array is "
          "snapshotted: the arrays may change afterwards; writing and the "
          "commit go on in the background (ckpt/writer.h, SaveAsync).");
}

}  // namespace

void BindWriter(py::module_& m) {
  // Whether CUDA tensors can be saved and loaded (built with ckpt_gpu).
  m.attr("has_cuda") = PythonBuiltWithCuda();
  BindSaveOptions(m);
  BindSaveResult(m);
  BindWriterClass(m);
}

}  // namespace ckpt::python
