// Shared by the binding's files: conversions between Python sequences and
// ckpt's vocabulary types, and the per-file Bind functions module.cc calls.
#ifndef CKPT_PYTHON_BIND_H_
#define CKPT_PYTHON_BIND_H_

#include <pybind11/pybind11.h>

#include <vector>

#include "ckpt/types.h"

namespace ckpt::python {

// A sequence of non-negative ints as Dims (InvalidArgument naming `what`
// for a negative value).
Dims ToDims(const std::vector<int64_t>& v, const char* what);
pybind11::tuple ToTuple(const Dims& d);
// A ckpt.Box or ckpt.FlatRange as a Region (InvalidArgument otherwise).
Region ToRegion(pybind11::handle region);
pybind11::object FromRegion(const Region& region);

void BindWriter(pybind11::module_& m);
void BindReader(pybind11::module_& m);
void BindOps(pybind11::module_& m);

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_BIND_H_
