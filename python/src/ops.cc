// ckpt._ckpt's operations on whole checkpoints (ops/): validate, diff and
// reshard. Each returns a dict with the members of the matching tool's
// --json report (tools/README.md), which ckpt/ops.py turns into
// dataclasses; and the committed steps of a root. The GIL is released while
// the operation runs. Paths are local or s3:// (PythonStorage). And
// _copy_for_later, the copy of an async save's snapshot, for benchmarks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bind.h"
#include "buffers.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/ops/checkpoint_root.h"
#include "ckpt/ops/diff.h"
#include "ckpt/ops/reshard.h"
#include "ckpt/ops/validate.h"
#include "errors.h"
#include "storage.h"
#include "util/copy.h"

namespace ckpt::python {
namespace py = pybind11;
namespace {

// `s`, or None when empty (the reports' "absent").
py::object StrOrNone(const std::string& s) {
  return s.empty() ? py::object(py::none()) : py::object(py::str(s));
}

py::object IndexOrNone(int64_t i) {
  return i < 0 ? py::object(py::none()) : py::object(py::int_(i));
}

py::list DimsList(const Dims& d) {
  py::list l;
  for (uint64_t x : d) l.append(x);
  return l;
}

py::dict FindingDict(const ops::Finding& f) {
  py::dict d;
  d["severity"] = std::string(ops::SeverityName(f.severity));
  d["file"] = StrOrNone(f.file);
  d["entry"] = StrOrNone(f.entry);
  d["chunk"] = IndexOrNone(f.chunk);
  d["region"] = StrOrNone(f.region);
  d["block"] = IndexOrNone(f.block);
  d["message"] = f.message;
  d["text"] = ops::FindingText(f);
  return d;
}

py::dict ValidateDict(const ops::ValidateReport& r) {
  py::dict d;
  d["valid"] = r.valid();
  d["root"] = StrOrNone(r.root);
  d["checkpoint"] = StrOrNone(r.checkpoint_dir);
  for (const char* k :
       {"format_version", "step", "world_size", "checkpoint_id"})
    d[k] = py::none();
  if (r.manifest_ok) {
    d["format_version"] =
        absl::StrCat(format::kFormatMajor, ".", r.format_minor);
    d["step"] = r.info.step;
    d["world_size"] = r.info.world_size;
    d["checkpoint_id"] = format::IdToHex(r.info.id);
  }
  d["quick"] = r.quick;
  d["check_finite"] = r.check_finite;
  d["shards"] = r.shards;
  d["shards_ok"] = r.shards_ok;
  d["entries"] = r.entries;
  d["chunks"] = r.chunks;
  d["payload_bytes"] = r.payload_bytes;
  d["blocks_verified"] = r.blocks_verified;
  d["bytes_verified"] = r.bytes_verified;
  d["seconds"] = r.seconds;
  d["errors"] = r.errors();
  d["warnings"] = r.warnings();
  d["findings_dropped"] = r.findings_dropped;
  py::list findings;
  for (const ops::Finding& f : r.findings) findings.append(FindingDict(f));
  d["findings"] = findings;
  return d;
}

py::dict SideDict(const ops::DiffSide& s) {
  py::dict d;
  d["path"] = s.path;
  d["step"] = s.step;
  d["world_size"] = s.world_size;
  d["entries"] = s.entries;
  return d;
}

py::dict ValueDiffDict(const ops::ValueDiff& v) {
  py::dict d;
  d["entry"] = v.entry;
  d["kind"] = v.object ? "object" : "tensor";
  d["differing"] = v.differing;
  d["total"] = v.total;
  for (const char* k :
       {"size_a", "size_b", "max_abs_diff", "first_at", "first_a", "first_b"})
    d[k] = py::none();
  if (v.object) {
    d["size_a"] = v.size_a;
    d["size_b"] = v.size_b;
  } else {
    d["max_abs_diff"] = v.max_abs_diff;  // may be inf
    d["first_at"] = DimsList(v.first_at);
    d["first_a"] = v.first_a;
    d["first_b"] = v.first_b;
  }
  return d;
}

py::dict DiffDict(const ops::DiffReport& r) {
  py::dict d;
  d["a"] = SideDict(r.a);
  d["b"] = SideDict(r.b);
  d["atol"] = r.tolerance.atol;
  d["rtol"] = r.tolerance.rtol;
  d["equal"] = r.equal();
  py::list notes, structural, values;
  for (const ops::DiffNote& n : r.notes) {
    py::dict x;
    x["what"] = n.what;
    x["a"] = n.a;
    x["b"] = n.b;
    notes.append(x);
  }
  for (const ops::StructuralDiff& s : r.structural) {
    const bool sided = s.change != "added" && s.change != "removed";
    py::dict x;
    x["entry"] = s.entry;
    x["change"] = s.change;
    x["a"] = sided ? py::object(py::str(s.a)) : py::object(py::none());
    x["b"] = sided ? py::object(py::str(s.b)) : py::object(py::none());
    structural.append(x);
  }
  for (const ops::ValueDiff& v : r.values) values.append(ValueDiffDict(v));
  d["notes"] = notes;
  d["structural"] = structural;
  d["values"] = values;
  d["entries_compared"] = r.entries_compared;
  d["bytes_compared"] = r.bytes_compared;
  d["loads"] = r.loads;
  return d;
}

py::dict ReshardDict(const ops::ReshardReport& r) {
  py::dict d, src, dst;
  src["path"] = r.src_dir;
  src["step"] = r.src_step;
  src["world_size"] = r.from;
  dst["path"] = r.dst_dir;
  dst["step"] = r.step;
  dst["world_size"] = r.to;
  d["src"] = src;
  d["dst"] = dst;
  d["step"] = r.step;
  d["codec"] = r.codec;
  py::list entries;
  for (const ops::ReshardedEntry& e : r.entries) {
    py::dict x;
    x["name"] = e.name;
    x["kind"] = e.object ? "object" : "tensor";
    x["dtype"] = e.object
                     ? py::object(py::none())
                     : py::object(py::str(std::string(DTypeName(e.dtype))));
    x["shape"] =
        e.object ? py::object(py::none()) : py::object(DimsList(e.shape));
    x["source"] = e.source;
    x["layout"] = e.layout;
    x["override"] = e.from_override;
    entries.append(x);
  }
  d["entries"] = entries;
  d["tensor_bytes"] = r.tensor_bytes;
  d["object_bytes"] = r.object_bytes;
  d["stored_bytes"] = r.stored_bytes;
  d["largest_read"] = r.largest_read;
  d["seconds"] = r.seconds;
  d["verify"] =
      r.verify ? py::object(DiffDict(*r.verify)) : py::object(py::none());
  return d;
}

py::dict Validate(const std::string& path, bool quick, bool check_finite,
                  bool strict, int threads, size_t max_findings) {
  ops::ValidateOptions o;
  o.path = path;
  o.quick = quick;
  o.check_finite = check_finite;
  o.strict = strict;
  o.threads = threads;
  o.max_findings = max_findings;
  o.storage = PythonStorage();
  absl::StatusOr<ops::ValidateReport> r;
  {
    py::gil_scoped_release release;
    r = ops::Validate(o);
  }
  return ValidateDict(ValueOrThrow(std::move(r)));
}

py::dict Diff(const std::string& a, const std::string& b, double atol,
              double rtol, uint64_t window_bytes, int io_threads) {
  ops::DiffOptions o;
  o.a = a;
  o.b = b;
  o.tolerance.atol = atol;
  o.tolerance.rtol = rtol;
  o.window_bytes = window_bytes;
  o.io_threads = io_threads;
  o.storage = PythonStorage();
  absl::StatusOr<ops::DiffReport> r;
  {
    py::gil_scoped_release release;
    r = ops::Diff(o);
  }
  return DiffDict(ValueOrThrow(std::move(r)));
}

// `layout`: (pattern, split) pairs in order, split as ops::ParseSplit reads
// it ("dim0", "flat", "replicated").
py::dict Reshard(const std::string& src, const std::string& dst, int to,
                 int from,
                 const std::vector<std::pair<std::string, std::string>>& layout,
                 std::optional<std::string> codec, std::optional<uint64_t> step,
                 int threads, bool verify) {
  ops::ReshardOptions o;
  o.src = src;
  o.dst = dst;
  o.to = to;
  o.from = from;
  o.threads = threads;
  o.step = step;
  o.verify = verify;
  o.storage = PythonStorage();
  if (codec) {
    if (*codec != "none" && *codec != "zstd") {
      throw StatusError(absl::InvalidArgumentError(absl::StrCat(
          "codec: expected \"none\" or \"zstd\", got \"", *codec, "\"")));
    }
    o.codec = *codec == "zstd" ? format::Codec::kZstd : format::Codec::kNone;
  }
  if (!layout.empty()) {
    ops::Overrides rules;
    for (const auto& [pattern, split] : layout) {
      absl::StatusOr<ops::Split> s = ops::ParseSplit(split);
      if (!s.ok()) {
        throw StatusError(absl::InvalidArgumentError(
            absl::StrCat("layout[", ops::QuotedForMessage(pattern),
                         "]: ", s.status().message())));
      }
      rules.rules.push_back({pattern, *s});
    }
    o.overrides_source = "layout";
    o.read_overrides = [rules](Storage*) { return rules; };
  }
  absl::StatusOr<ops::ReshardReport> r;
  {
    py::gil_scoped_release release;
    r = ops::Reshard(o);
  }
  return ReshardDict(ValueOrThrow(std::move(r)));
}

std::vector<uint64_t> CommittedSteps(const std::string& root) {
  absl::StatusOr<std::vector<uint64_t>> steps;
  {
    py::gil_scoped_release release;
    steps = ops::CommittedSteps(PythonStorage(), root);
  }
  return ValueOrThrow(std::move(steps));
}

// util/copy.h's CopyForLater of `src`'s bytes into `dst` (host memory of
// the same size), the GIL released: what an async save's snapshot does
// with each tensor, alone (bench/peers measures its bound with it).
void CopyForLater(py::handle dst, py::handle src) {
  BorrowedBuffer d = Borrow(dst, /*writable=*/true, "dst");
  BorrowedBuffer s = Borrow(src, /*writable=*/false, "src");
  if (d.memory != MemoryKind::kHost || s.memory != MemoryKind::kHost) {
    ThrowIfError(absl::InvalidArgumentError(
        "_copy_for_later: dst and src must be host memory"));
  }
  if (d.nbytes != s.nbytes) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "_copy_for_later: dst has ", d.nbytes, " bytes, src ", s.nbytes)));
  }
  py::gil_scoped_release release;
  internal::CopyForLater(d.data, s.data, d.nbytes);
}

}  // namespace

void BindOps(py::module_& m) {
  m.def("_validate", &Validate, py::arg("path"), py::arg("quick"),
        py::arg("check_finite"), py::arg("strict"), py::arg("threads"),
        py::arg("max_findings"),
        "ops::Validate; the report as ckpt-validate --json's members.");
  m.def("_diff", &Diff, py::arg("a"), py::arg("b"), py::arg("atol"),
        py::arg("rtol"), py::arg("window_bytes"), py::arg("io_threads"),
        "ops::Diff; the report as ckpt-diff --json's members.");
  m.def("_reshard", &Reshard, py::arg("src"), py::arg("dst"), py::arg("to"),
        py::arg("from_"), py::arg("layout"), py::arg("codec"), py::arg("step"),
        py::arg("threads"), py::arg("verify"),
        "ops::Reshard; the report as ckpt-reshard --json's members.");
  m.def("_committed_steps", &CommittedSteps, py::arg("root"),
        "ops::CommittedSteps: the steps of the committed checkpoints under "
        "root, ascending.");
  m.def("_copy_for_later", &CopyForLater, py::arg("dst"), py::arg("src"),
        "The copy of an async save's snapshot (streaming stores where the "
        "CPU has AVX2) of src's bytes into dst, host buffers or tensors of "
        "one size; for benchmarks.");
}

}  // namespace ckpt::python
