#include "communicator.h"

#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
  PyCommunicator(py::object obj, int rank, int size)
      : obj_(std::move(obj)), rank_(rank), size_(size) {}
  ~PyCommunicator() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

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

  py::object obj_;
  const int rank_;
  const int size_;
};

int IntAttribute(py::handle obj, const char* name) {
  py::object v = obj.attr(name);
  if (PyCallable_Check(v.ptr())) v = v();
  return v.cast<int>();
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
      py::reinterpret_borrow<py::object>(comm), rank, size);
  return owned->get();
}

namespace {

void BindCommunicatorBase(py::module_& m) {
  py::class_<Communicator>(
      m, "Communicator",
      "A C++ communicator; Python code may pass any object with "
      "these methods instead.")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def("all_gather",
           [](Communicator& c, py::bytes mine) {
             std::string s = mine;
             std::vector<std::string> all;
             {
               py::gil_scoped_release nogil;
               all = ValueOrThrow(c.AllGather(s));
             }
             return ToList(all);
           })
      .def("gather",
           [](Communicator& c, py::bytes mine, int root) {
             std::string s = mine;
             std::vector<std::string> all;
             {
               py::gil_scoped_release nogil;
               all = ValueOrThrow(c.Gather(s, root));
             }
             return ToList(all);
           })
      .def("broadcast",
           [](Communicator& c, py::bytes data, int root) {
             std::string s = data;
             {
               py::gil_scoped_release nogil;
               ThrowIfError(c.Broadcast(&s, root));
             }
             return py::bytes(s);
           })
      .def("barrier",
           [](Communicator& c) {
             py::gil_scoped_release nogil;
             ThrowIfError(c.Barrier());
           })
      .def("all_reduce_max", [](Communicator& c, std::vector<int64_t> values) {
        {
          py::gil_scoped_release nogil;
          ThrowIfError(c.AllReduceMax(&values));
        }
        return values;
      });
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
