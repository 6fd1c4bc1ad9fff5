// ckpt._ckpt.Reader, LoadRequest, LoadReport and the entry view of the
// manifest. Load runs without the GIL; completion callbacks and the filter
// take it back, and the first exception one of them raises is raised by
// load() once the C++ load has returned.
#include "ckpt/reader.h"

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
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

// One manifest entry, as Python sees it: a copy of the Reader's EntryView
// (Python may keep it past the Reader).
struct EntryInfo {
  std::string name;
  bool is_object = false;
  DType dtype = DType::kUInt8;
  Shape shape;
  bool partial = false;
  std::vector<std::pair<Region, uint32_t>> chunks;  // region, shard
};

EntryInfo ToEntryInfo(const EntryView& e) {
  EntryInfo info;
  info.name = e.name();
  info.is_object = e.is_object();
  info.dtype = e.dtype();
  info.shape = e.shape();
  info.partial = e.partial();
  for (size_t i = 0; i < e.num_chunks(); ++i) {
    info.chunks.emplace_back(e.chunk_region(i), e.chunk_shard(i));
  }
  return info;
}

// A destination: a tensor region into a borrowed array, or an object.
struct PyLoadRequest {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  Region region;
  py::object data;  // None for an object request
  py::object on_complete;
  std::string object;  // an object request's bytes, after load
  bool is_object = false;
};

// The first Python exception raised by a callback during one load.
class CallbackErrors {
 public:
  template <typename F>
  void Run(const std::string& where, F f) {
    py::gil_scoped_acquire gil;
    try {
      f();
    } catch (py::error_already_set& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!value_) {
        type_ = e.type();
        value_ = e.value();
        trace_ = e.trace();
        if (py::hasattr(value_, "add_note")) value_.attr("add_note")(where);
      }
    }
  }
  // Raises the recorded exception, if any. REQUIRES: the GIL is held.
  void RaiseIfAny() {
    if (!value_) return;
    PyErr_Restore(type_.release().ptr(), value_.release().ptr(),
                  trace_.release().ptr());
    throw py::error_already_set();
  }

 private:
  std::mutex mu_;
  py::object type_, value_, trace_;
};

class PyReader {
 public:
  // With `comm` (a communicator, see ResolveCommunicator), the Reader is
  // cooperative: construction and every load() are collective.
  PyReader(const std::string& path, int io_threads, bool direct_io,
           py::object comm, int max_open_files)
      : comm_obj_(std::move(comm)) {
    ReaderOptions o;
    o.device_memory = PythonDeviceMemory();
    o.storage = PythonStorage();
    o.io_threads = io_threads;
    o.direct_io = direct_io;
    o.max_open_files = max_open_files;
    o.communicator = ResolveCommunicator(comm_obj_, &owned_comm_);
    py::gil_scoped_release nogil;
    reader_ = ValueOrThrow(Reader::Open(path, o));
  }
  ~PyReader() {
    // The reader holds the adapter's pointer: it goes first, then the
    // adapter (which takes the GIL).
    reader_.reset();
    py::gil_scoped_release nogil;
    owned_comm_.reset();
  }

  const std::string& path() const { return reader_->path(); }
  const CheckpointDescription& description() const {
    return reader_->description();
  }
  std::vector<EntryInfo> Entries() const {
    std::vector<EntryInfo> out;
    for (const EntryView& e : reader_->entries()) out.push_back(ToEntryInfo(e));
    return out;
  }
  // The entries' names alone, in manifest order: what a caller that only
  // looks names up needs, without an Entry (and its chunks) per entry.
  py::list EntryNames() const {
    const format::Manifest& m = reader_->manifest();
    py::list out(m.entries.size());
    for (size_t i = 0; i < m.entries.size(); ++i) {
      out[i] = py::str(m.entries[i].name);
    }
    return out;
  }
  std::optional<EntryInfo> Find(const std::string& name) const {
    std::optional<EntryView> e = reader_->FindEntry(name);
    if (!e) return std::nullopt;
    return ToEntryInfo(*e);
  }

  LoadReport Load(std::vector<PyLoadRequest*> requests, py::object filter,
                  bool allow_unrequested, int io_threads,
                  uint64_t exchange_bytes_per_round, bool report_not_loaded,
                  bool shared_memory_exchange) {
    CallbackErrors errors;
    std::vector<BorrowedBuffer> views;  // released with the GIL held
    std::vector<LoadRequest> reqs;
    LoadOptions lo;
    try {
      reqs = Prepare(requests, &errors, &views);
    } catch (const StatusError& e) {
      // A cooperative load must still take part, failing every rank.
      if (owned_comm_ == nullptr && comm_obj_.is_none()) throw;
      reqs.clear();
      lo.local_error = e.status();
    }
    lo.allow_unrequested = allow_unrequested;
    lo.report_not_loaded = report_not_loaded;
    lo.io_threads = io_threads;
    lo.shared_memory_exchange = shared_memory_exchange;
    if (exchange_bytes_per_round > 0) {
      lo.exchange_bytes_per_round = exchange_bytes_per_round;
    }
    if (!filter.is_none()) {
      lo.filter = [&errors, &filter](const std::string& name) {
        bool keep = true;
        errors.Run("raised by the load's filter",
                   [&] { keep = filter(name).cast<bool>(); });
        return keep;
      };
    }
    absl::StatusOr<LoadReport> report;
    {
      py::gil_scoped_release nogil;
      report = reader_->Load(reqs, lo);
    }
    errors.RaiseIfAny();
    return ValueOrThrow(std::move(report));
  }

  py::bytes ReadObject(const std::string& name) {
    std::string bytes;
    {
      py::gil_scoped_release nogil;
      bytes = ValueOrThrow(reader_->ReadObject(name));
    }
    return py::bytes(bytes);
  }

 private:
  static std::vector<LoadRequest> Prepare(
      const std::vector<PyLoadRequest*>& requests, CallbackErrors* errors,
      std::vector<BorrowedBuffer>* views) {
    std::vector<LoadRequest> reqs;
    // Reserved: a LoadRequest is about 180 bytes, and a vector that grows
    // holds its old and new arrays at once.
    reqs.reserve(requests.size());
    views->reserve(requests.size());
    for (PyLoadRequest* p : requests) {
      LoadRequest r;
      r.name = p->name;
      if (p->is_object) {
        r.object = &p->object;
      } else {
        std::string what = absl::StrCat("entry '", p->name, "'");
        BorrowedBuffer buf = Borrow(p->data, /*writable=*/true, what);
        CheckFits(buf, p->dtype, RegionElements(p->region), what);
        r.dtype = p->dtype;
        r.shape = p->shape;
        r.region = p->region;
        r.data = buf.data;
        r.memory = buf.memory;
        r.device = buf.device;
        views->push_back(std::move(buf));
      }
      if (!p->on_complete.is_none()) {
        r.on_complete = [errors, p] {
          errors->Run(absl::StrCat("raised by the on_complete callback of '",
                                   p->name, "'"),
                      [p] { p->on_complete(); });
        };
      }
      reqs.push_back(std::move(r));
    }
    return reqs;
  }

  py::object comm_obj_;  // keeps a Python communicator alive
  std::unique_ptr<Communicator> owned_comm_;
  std::unique_ptr<Reader> reader_;
};

void BindEntry(py::module_& m) {
  py::class_<EntryInfo>(m, "Entry", "One entry of a checkpoint's manifest.")
      .def_readonly("name", &EntryInfo::name)
      .def_property_readonly(
          "kind",
          [](const EntryInfo& e) { return e.is_object ? "object" : "tensor"; })
      .def_readonly("dtype", &EntryInfo::dtype)
      .def_property_readonly(
          "shape", [](const EntryInfo& e) { return ToTuple(e.shape); })
      .def_readonly("partial", &EntryInfo::partial)
      .def_property_readonly(
          "chunks",
          [](const EntryInfo& e) {
            py::list out;
            for (const auto& [region, shard] : e.chunks) {
              out.append(py::make_tuple(FromRegion(region), shard));
            }
            return out;
          },
          "[(region, shard), ...]")
      .def("__repr__", [](const EntryInfo& e) {
        return absl::StrCat("Entry('", e.name, "', ",
                            e.is_object ? "object" : "tensor", ", ",
                            DTypeName(e.dtype), ", ", ShapeToString(e.shape),
                            ", ", e.chunks.size(), " chunks)");
      });
}

void BindLoadRequest(py::module_& m) {
  py::class_<PyLoadRequest>(
      m, "LoadRequest",
      "A destination of Reader.load: region `region` of tensor `name` "
      "into the array `data` (written in place), or, with "
      "LoadRequest.for_object, an object's bytes (in `.value`).")
      .def(py::init([](const std::string& name, DType dtype,
                       const std::vector<int64_t>& shape, py::handle region,
                       py::object data, py::object on_complete) {
             auto r = std::make_unique<PyLoadRequest>();
             r->name = name;
             r->dtype = dtype;
             r->shape = ToDims(shape, ("entry '" + name + "': shape").c_str());
             r->region = region.is_none() ? Region(FullBox(r->shape))
                                          : ToRegion(region);
             r->data = std::move(data);
             r->on_complete = std::move(on_complete);
             return r;
           }),
           py::arg("name"), py::arg("dtype"), py::arg("shape"),
           py::arg("region"), py::arg("data"),
           py::arg("on_complete") = py::none())
      .def_static(
          "for_object",
          [](const std::string& name, py::object on_complete) {
            auto r = std::make_unique<PyLoadRequest>();
            r->name = name;
            r->is_object = true;
            r->data = py::none();
            r->on_complete = std::move(on_complete);
            return r;
          },
          py::arg("name"), py::arg("on_complete") = py::none())
      .def_readonly("name", &PyLoadRequest::name)
      .def_readonly("data", &PyLoadRequest::data)
      .def_property_readonly(
          "value", [](const PyLoadRequest& r) { return py::bytes(r.object); },
          "An object request's bytes after the load.");
}

void BindLoadReport(py::module_& m) {
  py::class_<LoadReport>(m, "LoadReport",
                         "What Reader.load did (ckpt/reader.h).")
      .def(py::init<>())
      .def_readwrite("bytes_read", &LoadReport::bytes_read)
      .def_readwrite("bytes_loaded", &LoadReport::bytes_loaded)
      .def_readwrite("bytes_received", &LoadReport::bytes_received,
                     "Bytes of destinations received from other ranks (a "
                     "cooperative load).")
      .def_readwrite("shared_memory_exchange",
                     &LoadReport::shared_memory_exchange,
                     "Whether those bytes came through shared memory, not "
                     "the communicator's all_to_all.")
      .def_readwrite("blocks_verified", &LoadReport::blocks_verified)
      .def_readwrite("loaded", &LoadReport::loaded)
      .def_readwrite("not_loaded", &LoadReport::not_loaded,
                     "[(name, why), ...]")
      .def("__repr__", [](const LoadReport& r) {
        return absl::StrCat("LoadReport(loaded=", r.loaded.size(),
                            " entries, not_loaded=", r.not_loaded.size(),
                            ", bytes_loaded=", r.bytes_loaded, ")");
      });
}

void BindReaderClass(py::module_& m) {
  py::class_<PyReader>(
      m, "Reader",
      "Opens a committed checkpoint (a directory holding MANIFEST, or a root "
      "whose `latest` is followed) and loads any region of any entry "
      "(ckpt/reader.h).")
      .def(py::init<const std::string&, int, bool, py::object, int>(),
           py::arg("path"), py::arg("io_threads") = 4,
           py::arg("direct_io") = false, py::arg("comm") = py::none(),
           py::arg("max_open_files") = ReaderOptions().max_open_files,
           "With comm (a ckpt.Communicator, or an object with its methods), "
           "every rank of it must construct the Reader and then call each "
           "load() together: rank 0 alone reads the manifest, and each "
           "stored block is read once by one rank and sent to the ranks "
           "that need it (ckpt/reader.h, \"Cooperative loads\"). At most "
           "max_open_files shard files are kept open at once (>= 1).")
      .def_property_readonly("path", &PyReader::path)
      .def_property_readonly(
          "step", [](const PyReader& r) { return r.description().step; })
      .def_property_readonly(
          "world_size",
          [](const PyReader& r) { return r.description().world_size; })
      .def_property_readonly(
          "metadata",
          [](const PyReader& r) { return r.description().metadata; })
      .def_property_readonly(
          "id", [](const PyReader& r) { return r.description().id; })
      .def_property_readonly(
          "created_unix_ns",
          [](const PyReader& r) { return r.description().created_unix_ns; })
      .def_property_readonly(
          "writer", [](const PyReader& r) { return r.description().writer; })
      .def_property_readonly(
          "format_version",
          [](const PyReader& r) { return r.description().format_version; })
      .def("entries", &PyReader::Entries)
      .def("entry_names", &PyReader::EntryNames,
           "The entries' names, in manifest order (as [e.name for e in "
           "entries()], without building the entries).")
      .def("find", &PyReader::Find, py::arg("name"))
      .def("load", &PyReader::Load, py::arg("requests"),
           py::arg("filter") = py::none(), py::arg("allow_unrequested") = false,
           py::arg("io_threads") = 0, py::arg("exchange_bytes_per_round") = 0,
           py::arg("report_not_loaded") = true,
           py::arg("shared_memory_exchange") = true,
           "exchange_bytes_per_round: cooperative loads only; 0 = the "
           "default (LoadOptions::exchange_bytes_per_round). "
           "report_not_loaded=False leaves LoadReport.not_loaded empty "
           "(LoadOptions::report_not_loaded). shared_memory_exchange=False: "
           "ranks on one machine exchange through the communicator's "
           "all_to_all, not shared memory "
           "(LoadOptions::shared_memory_exchange).")
      .def("read_object", &PyReader::ReadObject, py::arg("name"));
}

}  // namespace

void BindReader(py::module_& m) {
  BindEntry(m);
  BindLoadRequest(m);
  BindLoadReport(m);
  BindReaderClass(m);
}

}  // namespace ckpt::python
