// Fixtures of the ckpt-convert tests: a multi-rank checkpoint with every
// dtype, a scalar, empty tensors and objects, nested and colliding names,
// and metadata that needs escaping; and a comparison of two checkpoints
// through ckpt::Reader.
#ifndef CKPT_TESTS_TOOLS_CONVERT_CONVERT_FIXTURE_H_
#define CKPT_TESTS_TOOLS_CONVERT_CONVERT_FIXTURE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "libckpt/test_util.h"

namespace ckpt::testing {

struct FixtureTensor {
  std::string name;
  DType dtype;
  Shape shape;
  Layout layout;
  std::string global;  // reference bytes of the whole tensor
};

struct Fixture {
  std::vector<FixtureTensor> tensors;
  std::vector<std::pair<std::string, std::string>> objects;
  format::Metadata metadata;
  uint64_t step = 42;
};

// Every dtype as "dtypes.<name>" [5, 7] under a different layout, a 3-d
// tensor, a scalar, an empty tensor, names that collide ("opt.w" and
// "opt.w.exp_avg"), names that begin or end with '.', two objects (one
// empty), and metadata with a reserved-looking key and a binary value.
inline Fixture MakeFixture() {
  Fixture f;
  uint64_t seed = 1;
  auto add = [&](std::string name, DType dtype, Shape shape, Layout layout) {
    std::string bytes = ReferenceBytes(dtype, shape, seed++);
    f.tensors.push_back(
        {std::move(name), dtype, std::move(shape), layout, std::move(bytes)});
  };
  size_t i = 0;
  for (DType d : kAllDTypes) {
    add(absl::StrCat("dtypes.", DTypeName(d)), d, {5, 7}, kAllLayouts[i++ % 6]);
  }
  add("model.layers.0.attn.qkv", DType::kFloat32, {4, 3, 6}, Layout::kGrid);
  add("model.layers.1.mlp.w", DType::kBFloat16, {6, 10}, Layout::kCols);
  add("scalar.loss_scale", DType::kFloat64, {}, Layout::kWhole);
  add("empty.rows", DType::kFloat32, {0, 4}, Layout::kRows);
  add("opt.w", DType::kFloat32, {4, 4}, Layout::kRows);
  add("opt.w.exp_avg", DType::kFloat32, {4, 4}, Layout::kFlatUneven);
  add(".hidden", DType::kInt32, {3}, Layout::kWhole);
  add("trailing.", DType::kUInt8, {2}, Layout::kWhole);
  f.objects = {{"rng.rank0", std::string("\x00\x01rng-state\xff", 12)},
               {"loader.empty", ""}};
  f.metadata = {{"lr", "0.001"},
                {"ckpt_note", "a user key with the reserved prefix"},
                {"blob", std::string("\x00\x01\xfe", 3)},
                {"empty", ""},
                {"unicode", "h\xc3\xa9llo"},
                {".", "a key that is one dot"}};
  return f;
}

// Saves `f` under `root` on `world` in-process ranks.
inline absl::Status WriteFixture(const Fixture& f, const std::string& root,
                                 int world,
                                 format::Codec codec = format::Codec::kNone) {
  InProcessWorld w(world);
  std::vector<std::vector<std::string>> bufs(
      world, std::vector<std::string>(f.tensors.size()));
  return RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const int rank = comm.rank();
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    for (size_t i = 0; i < f.tensors.size(); ++i) {
      const FixtureTensor& t = f.tensors[i];
      Piece p = PieceOf(t.layout, t.shape, rank, world);
      bufs[rank][i] = Extract(t.global, t.dtype, t.shape, p.region);
      TensorOptions to;
      to.replica = p.replica;
      CKPT_RETURN_IF_ERROR(writer->AddTensor(t.name, t.dtype, t.shape, p.region,
                                             bufs[rank][i].data(), to));
    }
    if (rank == 0) {
      for (const auto& [name, bytes] : f.objects) {
        CKPT_RETURN_IF_ERROR(writer->SetObject(name, bytes));
      }
    }
    SaveOptions so;
    so.codec = codec;
    so.metadata = f.metadata;
    return writer->Save(root, f.step, so).status();
  });
}

// The whole content of entry `e` of `reader`.
inline absl::StatusOr<std::string> ReadWhole(Reader& reader,
                                             const format::EntryRecord& e) {
  if (e.kind == format::EntryKind::kObject) return reader.ReadObject(e.name);
  std::string bytes(RegionElements(FullBox(e.shape)) * DTypeSize(e.dtype),
                    '\0');
  for (uint64_t d : e.shape) {
    if (d == 0) bytes.clear();
  }
  LoadRequest r;
  r.name = e.name;
  r.dtype = e.dtype;
  r.shape = e.shape;
  r.region = FullBox(e.shape);
  r.data = bytes.data();
  LoadOptions lo;
  lo.allow_unrequested = true;
  CKPT_RETURN_IF_ERROR(reader.Load({r}, lo).status());
  return bytes;
}

// OK iff the checkpoints at `a` and `b` hold the same entries (name, kind,
// dtype, shape, bytes), the same metadata in the same order, and the same
// step. World size and sharding may differ.
inline absl::Status SameContent(const std::string& a, const std::string& b) {
  CKPT_ASSIGN_OR_RETURN(auto ra, Reader::Open(a));
  CKPT_ASSIGN_OR_RETURN(auto rb, Reader::Open(b));
  const format::Manifest& ma = ra->manifest();
  const format::Manifest& mb = rb->manifest();
  if (ma.info.step != mb.info.step) {
    return absl::InternalError(
        absl::StrCat("step ", ma.info.step, " != ", mb.info.step));
  }
  if (ma.metadata != mb.metadata) return absl::InternalError("metadata differ");
  if (ma.entries.size() != mb.entries.size()) {
    return absl::InternalError(
        absl::StrCat(ma.entries.size(), " entries != ", mb.entries.size()));
  }
  for (const format::EntryRecord& ea : ma.entries) {
    const format::EntryRecord* eb = rb->Find(ea.name);
    if (eb == nullptr)
      return absl::InternalError(absl::StrCat("'", ea.name, "' missing"));
    if (ea.kind != eb->kind || ea.dtype != eb->dtype || ea.shape != eb->shape) {
      return absl::InternalError(absl::StrCat(
          "'", ea.name, "': kind, dtype or shape differ: ", DTypeName(ea.dtype),
          ShapeToString(ea.shape), " vs ", DTypeName(eb->dtype),
          ShapeToString(eb->shape)));
    }
    CKPT_ASSIGN_OR_RETURN(std::string ba, ReadWhole(*ra, ea));
    CKPT_ASSIGN_OR_RETURN(std::string bb, ReadWhole(*rb, *eb));
    if (ba != bb)
      return absl::InternalError(absl::StrCat("'", ea.name, "': bytes differ"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TOOLS_CONVERT_CONVERT_FIXTURE_H_
