#include "communicator.h"

#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/status_macros.h"
#include "errors.h"
#ifdef CKPT_PYTHON_MPI
#include "ckpt/mpi_communicator.h"
#endif

namespace ckpt::python {
namespace py = pybind11;
namespace {

// Adapter over a Python object. ckpt calls it from the thread that called
// Save or Load, with the GIL released; every call takes the GIL back. A
// Python exception becomes an Internal status carrying its message.
class PyCommunicator final : public Communicator {
 public:
  PyCommunicator(py::object obj, int rank, int size, std::string node_name)
      : obj_(std::move(obj)),
        rank_(rank),
        size_(size),
        node_name_(std::move(node_name)) {}
  ~PyCommunicator() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string NodeName() const override { return node_name_; }

  absl::StatusOr<std::vector<std::string>> AllGather(
      absl::string_view mine) override {
    return Call<std::vector<std::string>>("all_gather", [&] {
      return obj_.attr("all_gather")(py::bytes(mine.data(), mine.size()));
    });
  }
  absl::StatusOr<std::vector<std::string>> Gather(absl::string_view mine,
                                                  int root) override {
    bool has_gather;
    {
      py::gil_scoped_acquire gil;
      has_gather = py::hasattr(obj_, "gather");
    }
    if (!has_gather) return Communicator::Gather(mine, root);
    return Call<std::vector<std::string>>("gather", [&] {
      return obj_.attr("gather")(py::bytes(mine.data(), mine.size()), root);
    });
  }
  absl::Status Broadcast(std::string* data, int root) override {
    absl::StatusOr<std::string> got = Call<std::string>("broadcast", [&] {
      return obj_.attr("broadcast")(py::bytes(*data), root);
    });
    if (!got.ok()) return got.status();
    *data = *std::move(got);
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    return Call<py::object>("barrier", [&] { return obj_.attr("barrier")(); })
        .status();
  }
  // The object's all_to_all(list of bytes) -> list of bytes when it has
  // one (host memory only), otherwise the default over all_gather. The
  // arguments are agreed on before the Python call, so that a rank with
  // bad arguments does not leave the others in it, and the sizes after it.
  absl::Status AllToAll(absl::Span<const SendBuffer> send,
                        absl::Span<const RecvBuffer> recv,
                        MemoryKind memory) override {
    bool has_all_to_all, has_into;
    {
      py::gil_scoped_acquire gil;
      has_all_to_all = py::hasattr(obj_, "all_to_all");
      has_into = py::hasattr(obj_, "all_to_all_into");
    }
    if (!has_all_to_all && !has_into) {
      return Communicator::AllToAll(send, recv, memory);
    }
    CKPT_RETURN_IF_ERROR(AgreeOnFirstError(
        CheckAllToAllArguments(send.size(), recv.size(), memory)));
    if (has_into) return AllToAllInto(send, recv);
    absl::StatusOr<py::object> got = Call<py::object>("all_to_all", [&] {
      py::list parts;
      for (const SendBuffer& b : send)
        parts.append(py::bytes(static_cast<const char*>(b.data), b.size));
      return obj_.attr("all_to_all")(parts);
    });
    absl::Status verdict = got.status();
    if (verdict.ok()) verdict = Deliver(*got, recv);
    {
      py::gil_scoped_acquire gil;  // the result is a Python object
      got = absl::StatusOr<py::object>();
    }
    return AgreeOnFirstError(verdict);
  }
  absl::Status AllReduceMax(std::vector<int64_t>* values) override {
    absl::StatusOr<std::vector<int64_t>> got = Call<std::vector<int64_t>>(
        "all_reduce_max", [&] { return obj_.attr("all_reduce_max")(*values); });
    if (!got.ok()) return got.status();
    if (got->size() != values->size()) {
      return absl::InternalError(
          absl::StrCat("Communicator.all_reduce_max (Python): returned ",
                       got->size(), " values for ", values->size()));
    }
    *values = *std::move(got);
    return absl::OkStatus();
  }

 private:
  template <typename T, typename F>
  absl::StatusOr<T> Call(const char* method, F f) {
    py::gil_scoped_acquire gil;
    try {
      return f().template cast<T>();
    } catch (py::error_already_set& e) {
      return absl::InternalError(
          absl::StrCat("Communicator.", method, " (Python): ", e.what()));
    } catch (py::cast_error& e) {
      return absl::InternalError(
          absl::StrCat("Communicator.", method,
                       " (Python): unexpected return type: ", e.what()));
    }
  }

  // The object's all_to_all_into(send, send_sizes, recv, recv_sizes): the
  // parts back to back in one buffer each way (memoryviews, send only read),
  // so that the bytes move from this rank's send buffer into the
  // receiver's buffer with no copy on either side. Buffers that are not
  // back to back (the cooperative load lays them out so) go through one
  // contiguous copy.
  absl::Status AllToAllInto(absl::Span<const SendBuffer> send,
                            absl::Span<const RecvBuffer> recv) {
    Packing s = PackingOf(send), r = PackingOf(recv);
    std::string send_copy, recv_copy;
    if (!s.packed) {
      send_copy.reserve(s.total);
      for (const SendBuffer& b : send) {
        send_copy.append(static_cast<const char*>(b.data), b.size);
      }
      s.base = send_copy.data();
    }
    if (!r.packed) {
      recv_copy.resize(r.total);
      r.base = recv_copy.data();
    }
    absl::Status verdict = CallAllToAllInto(s, r);
    if (verdict.ok() && !r.packed) {
      const char* from = r.base;
      for (const RecvBuffer& b : recv) {
        if (b.size > 0) std::memcpy(b.data, from, b.size);
        from += b.size;
      }
    }
    return AgreeOnFirstError(verdict);
  }

  // Buffers of one side of AllToAllInto: their sizes and total, and where
  // they start when they lie back to back (`packed`; null base: all empty).
  struct Packing {
    std::vector<uint64_t> sizes;
    uint64_t total = 0;
    char* base = nullptr;
    bool packed = true;
  };

  template <typename Buffer>
  static Packing PackingOf(absl::Span<const Buffer> buffers) {
    Packing p;
    for (const Buffer& b : buffers) {
      p.sizes.push_back(b.size);
      if (b.size > 0) {
        // The send side is only read (CallAllToAllInto's contract).
        char* d = static_cast<char*>(const_cast<void*>(b.data));
        if (p.base == nullptr) p.base = d - p.total;
        p.packed = p.packed && d == p.base + p.total;
      }
      p.total += b.size;
    }
    return p;
  }

  // Calls the object's all_to_all_into over one memoryview each way.
  // Writable views both ways (torch.frombuffer warns on a read-only
  // buffer); the send buffer is only read.
  absl::Status CallAllToAllInto(const Packing& s, const Packing& r) {
    static char empty = 0;
    char* send_base = s.base != nullptr ? s.base : &empty;
    char* recv_base = r.base != nullptr ? r.base : &empty;
    py::gil_scoped_acquire gil;
    try {
      obj_.attr("all_to_all_into")(
          py::memoryview::from_memory(send_base, static_cast<ssize_t>(s.total)),
          s.sizes,
          py::memoryview::from_memory(recv_base, static_cast<ssize_t>(r.total)),
          r.sizes);
    } catch (py::error_already_set& e) {
      return absl::InternalError(
          absl::StrCat("Communicator.all_to_all_into (Python): ", e.what()));
    }
    return absl::OkStatus();
  }

  // Copies the parts all_to_all returned into `recv`, checking their
  // number and sizes.
  absl::Status Deliver(const py::object& result,
                       absl::Span<const RecvBuffer> recv) {
    py::gil_scoped_acquire gil;
    try {
      py::list parts = py::list(result);
      if (parts.size() != recv.size()) {
        return absl::InternalError(
            absl::StrCat("Communicator.all_to_all (Python): returned ",
                         parts.size(), " parts for ", recv.size(), " ranks"));
      }
      for (size_t s = 0; s < recv.size(); ++s) {
        py::buffer_info part = parts[s].cast<py::buffer>().request();
        const size_t bytes = static_cast<size_t>(part.size * part.itemsize);
        if (bytes != recv[s].size) {
          return AllToAllSizeMismatch(static_cast<int>(s), bytes, rank_,
                                      recv[s].size);
        }
        if (bytes > 0) std::memcpy(recv[s].data, part.ptr, bytes);
      }
    } catch (py::error_already_set& e) {
      return absl::InternalError(
          absl::StrCat("Communicator.all_to_all (Python): ", e.what()));
    } catch (py::cast_error& e) {
      return absl::InternalError(absl::StrCat(
          "Communicator.all_to_all (Python): not a list of bytes: ", e.what()));
    }
    return absl::OkStatus();
  }

  py::object obj_;
  const int rank_;
  const int size_;
  const std::string node_name_;
};

// obj.name, or obj.name() when it is a method.
py::object Attribute(py::handle obj, const char* name) {
  py::object v = obj.attr(name);
  if (PyCallable_Check(v.ptr())) v = v();
  return v;
}

int IntAttribute(py::handle obj, const char* name) {
  return Attribute(obj, name).cast<int>();
}

// The optional node_name (a str): "" when the object has none.
std::string NodeNameOf(py::handle obj) {
  if (!py::hasattr(obj, "node_name")) return "";
  py::object v = Attribute(obj, "node_name");
  if (!py::isinstance<py::str>(v)) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(
        "communicator: node_name of a ", Py_TYPE(obj.ptr())->tp_name, " is a ",
        Py_TYPE(v.ptr())->tp_name, ", expected a str")));
  }
  return v.cast<std::string>();
}

py::list ToList(const std::vector<std::string>& parts) {
  py::list out;
  for (const std::string& p : parts) out.append(py::bytes(p));
  return out;
}

}  // namespace

Communicator* ResolveCommunicator(py::handle comm,
                                  std::unique_ptr<Communicator>* owned) {
  if (comm.is_none()) return nullptr;
  if (py::isinstance<Communicator>(comm)) return comm.cast<Communicator*>();
  for (const char* m : {"rank", "size", "all_gather", "broadcast", "barrier",
                        "all_reduce_max"}) {
    if (!py::hasattr(comm, m)) {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          "communicator: a ", Py_TYPE(comm.ptr())->tp_name, " has no '", m,
          "' (see ckpt.Communicator for the methods needed)")));
    }
  }
  int rank = IntAttribute(comm, "rank");
  int size = IntAttribute(comm, "size");
  if (size < 1 || rank < 0 || rank >= size) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("communicator: rank ", rank, " of size ", size)));
  }
  *owned = std::make_unique<PyCommunicator>(
      py::reinterpret_borrow<py::object>(comm), rank, size, NodeNameOf(comm));
  return owned->get();
}

namespace {

// all_to_all of Python's protocol (parts[d] for rank d in, the part of
// every rank out) over ckpt's AllToAll, which needs the receive sizes:
// an AllToAll of the 8-byte sizes first, then one of the bytes.
// Runs without the GIL.
absl::StatusOr<std::vector<std::string>> AllToAllBytes(
    Communicator& comm, const std::vector<std::string>& parts) {
  const size_t n = parts.size();
  std::vector<std::string> sizes_out(n), sizes_in(n, std::string(8, '\0'));
  std::vector<SendBuffer> send(n);
  std::vector<RecvBuffer> recv(n);
  for (size_t p = 0; p < n; ++p) {
    format::PutFixed64(&sizes_out[p], parts[p].size());
    send[p] = {sizes_out[p].data(), 8};
    recv[p] = {sizes_in[p].data(), 8};
  }
  CKPT_RETURN_IF_ERROR(comm.AllToAll(send, recv, MemoryKind::kHost));
  std::vector<std::string> out(n);
  for (size_t p = 0; p < n; ++p) {
    out[p].resize(format::LoadFixed64(sizes_in[p].data()));
    send[p] = {parts[p].data(), parts[p].size()};
    recv[p] = {out[p].data(), out[p].size()};
  }
  CKPT_RETURN_IF_ERROR(comm.AllToAll(send, recv, MemoryKind::kHost));
  return out;
}

py::list AllToAllFromPython(Communicator& comm, const py::list& parts) {
  std::vector<std::string> mine;
  for (py::handle part : parts) mine.push_back(part.cast<std::string>());
  std::vector<std::string> theirs;
  {
    py::gil_scoped_release nogil;
    theirs = ValueOrThrow(AllToAllBytes(comm, mine));
  }
  return ToList(theirs);
}

// The methods of ckpt.Communicator: each releases the GIL while the C++
// communicator waits on the other ranks.
py::list AllGatherFromPython(Communicator& c, py::bytes mine) {
  std::string s = mine;
  std::vector<std::string> all;
  {
    py::gil_scoped_release nogil;
    all = ValueOrThrow(c.AllGather(s));
  }
  return ToList(all);
}

py::list GatherFromPython(Communicator& c, py::bytes mine, int root) {
  std::string s = mine;
  std::vector<std::string> all;
  {
    py::gil_scoped_release nogil;
    all = ValueOrThrow(c.Gather(s, root));
  }
  return ToList(all);
}

py::bytes BroadcastFromPython(Communicator& c, py::bytes data, int root) {
  std::string s = data;
  {
    py::gil_scoped_release nogil;
    ThrowIfError(c.Broadcast(&s, root));
  }
  return py::bytes(s);
}

void BarrierFromPython(Communicator& c) {
  py::gil_scoped_release nogil;
  ThrowIfError(c.Barrier());
}

std::vector<int64_t> AllReduceMaxFromPython(Communicator& c,
                                            std::vector<int64_t> values) {
  {
    py::gil_scoped_release nogil;
    ThrowIfError(c.AllReduceMax(&values));
  }
  return values;
}

// ckpt's AllToAll through any communicator, a Python object's adapter
// included: for tests of adapters (the library calls it itself).
py::list AllToAllThroughAny(py::handle comm, const py::list& parts) {
  std::unique_ptr<Communicator> owned;
  Communicator* c = ResolveCommunicator(comm, &owned);
  if (c == nullptr) {
    throw StatusError(
        absl::InvalidArgumentError("_all_to_all: no communicator"));
  }
  py::list out = AllToAllFromPython(*c, parts);
  return out;
}

void BindCommunicatorBase(py::module_& m) {
  py::class_<Communicator>(
      m, "Communicator",
      "A C++ communicator; Python code may pass any object with "
      "these methods instead (gather, all_to_all and node_name are "
      "optional: without the first two ckpt falls back to all_gather, "
      "without node_name each rank counts as a node of its own).")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly(
          "node_name", &Communicator::NodeName,
          "The node (machine) this rank runs on; '' when unknown. A "
          "cooperative load spreads its reads over nodes, then over ranks.")
      .def("all_gather", &AllGatherFromPython)
      .def("gather", &GatherFromPython)
      .def("broadcast", &BroadcastFromPython)
      .def("barrier", &BarrierFromPython)
      .def("all_reduce_max", &AllReduceMaxFromPython)
      .def("all_to_all", &AllToAllFromPython, py::arg("parts"),
           "parts[d] goes to rank d; returns the part of every rank, by "
           "rank (ckpt's AllToAll: each byte moves once over MPI).");
  m.def("_all_to_all", &AllToAllThroughAny, py::arg("comm"), py::arg("parts"));
}

void BindMpiCommunicator(py::module_& m) {
#ifdef CKPT_PYTHON_MPI
  // ckpt.MpiCommunicator (ckpt/__init__.py) passes the MPI_Comm handle of
  // an mpi4py communicator in its Fortran form (Comm.py2f()).
  py::class_<MpiCommunicator, Communicator>(m, "_MpiCommunicator")
      .def(py::init([](int64_t fortran_handle, int64_t max_bytes_per_call) {
             int initialized = 0, finalized = 0;
             MPI_Initialized(&initialized);
             MPI_Finalized(&finalized);
             if (!initialized || finalized) {
               throw StatusError(absl::FailedPreconditionError(
                   "MpiCommunicator: MPI is not initialised (import mpi4py.MPI "
                   "first)"));
             }
             MPI_Comm comm =
                 MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
             MpiCommunicator::Options o;
             o.max_bytes_per_call = max_bytes_per_call;
             std::unique_ptr<MpiCommunicator> c;
             {
               py::gil_scoped_release nogil;
               c = ValueOrThrow(MpiCommunicator::Create(comm, o));
             }
             return c;
           }),
           py::arg("fortran_handle"),
           py::arg("max_bytes_per_call") = int64_t{1} << 30);
  m.attr("_HAS_MPI") = true;
#else
  m.attr("_HAS_MPI") = false;
#endif
}

}  // namespace

void BindCommunicators(py::module_& m) {
  BindCommunicatorBase(m);
  py::class_<SingleProcessCommunicator, Communicator>(
      m, "SingleProcessCommunicator")
      .def(py::init<>());
  BindMpiCommunicator(m);
}

}  // namespace ckpt::python
