// Communicators from Python: a Python object with the methods of
// ckpt.Communicator (rank, size, all_gather, broadcast, barrier,
// all_reduce_max, optionally gather and all_to_all) drives a
// ckpt::Communicator, and the C++ communicators (single process, MPI) are
// usable from Python, all_to_all included.
#ifndef CKPT_PYTHON_COMMUNICATOR_H_
#define CKPT_PYTHON_COMMUNICATOR_H_

#include <pybind11/pybind11.h>

#include <memory>

#include "ckpt/communicator.h"

namespace ckpt::python {

// The communicator for `comm`: nullptr for None, the C++ object of a
// ckpt.Communicator, or an adapter over a Python object (owned by *owned).
// Throws StatusError (InvalidArgument) if `comm` lacks a required method.
Communicator* ResolveCommunicator(pybind11::handle comm,
                                  std::unique_ptr<Communicator>* owned);

// Binds ckpt.Communicator, ckpt.SingleProcessCommunicator and (when built
// with MPI) ckpt._MpiCommunicator.
void BindCommunicators(pybind11::module_& m);

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_COMMUNICATOR_H_
