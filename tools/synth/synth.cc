#include "synth/synth.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/ops/local_range.h"
#include "ckpt/ops/source_shards.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "save/world_save.h"
#include "util/mutex.h"
#include "util/parallel_for.h"

namespace ckpt::synth {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr char kStepObject[] = "step";
// Bounds on the model that synth.* metadata may describe: every dim, and
// all elements together, below 2^62 (so that no count overflows).
constexpr uint64_t kMaxModelDim = uint64_t{1} << 62;
constexpr uint64_t kMaxModelElements = uint64_t{1} << 62;
// How many more entries than it holds synth.* metadata may describe.
constexpr uint64_t kEntriesSlack = 1024;

absl::Status ValidateConfig(const ModelConfig& c) {
  if (c.layers < 1 || c.hidden < 1 || c.ffn < 1 || c.vocab < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad model config: layers ", c.layers, ", hidden ", c.hidden, ", ffn ",
        c.ffn, ", vocab ", c.vocab, " (each must be >= 1)"));
  }
  return absl::OkStatus();
}

std::string Coords(const Shape& shape, uint64_t index) {
  std::vector<uint64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = index % shape[d];
    index /= shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(c, ", "), "]");
}

std::string ByteHex(absl::string_view s, uint64_t i) {
  if (i >= s.size()) return "(end)";
  return absl::StrFormat("0x%02x", static_cast<unsigned char>(s[i]));
}

// What the model says an entry is.
struct Expected {
  const SynthTensor* tensor = nullptr;  // null for an object
  std::string object;                   // an object's bytes
};

// One destination of one rank.
struct Work {
  const std::string* name;
  const SynthTensor* tensor;  // null for an object
  const std::string* object;  // expected bytes
  Region region;
  uint64_t bytes;
};

// What one loading rank found.
struct RankOutcome {
  Mutex mu;
  std::map<std::string, Mismatch> mismatches ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, bool> done
      ABSL_GUARDED_BY(mu);  // fully compared
  uint64_t elements ABSL_GUARDED_BY(mu) = 0;
  uint64_t bytes_loaded = 0;
};

void Record(RankOutcome& out, Mismatch m)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(out.mu) {
  auto it = out.mismatches.find(m.entry);
  if (it == out.mismatches.end() || m.index < it->second.index) {
    out.mismatches[m.entry] = std::move(m);
  }
}

// Compares a loaded destination with the generator.
void Check(uint64_t seed, const Work& w, const char* data,
           const std::string* loaded, RankOutcome& out) {
  Mismatch m;
  m.kind = Mismatch::Kind::kValue;
  m.entry = *w.name;
  bool differs = false;
  uint64_t count = 0;
  if (w.tensor != nullptr) {
    const SynthTensor& t = *w.tensor;
    Difference d = FirstDifference(seed, t, w.region, data);
    count = RegionElements(w.region);
    if (d.found) {
      differs = true;
      const int es = DTypeSize(t.dtype);
      std::string expected(es, '\0');
      ElementValue(seed, t.name, t.dtype, t.kind, d.global_index,
                   expected.data());
      m.index = d.global_index;
      m.coords = Coords(t.shape, d.global_index);
      m.expected = ElementText(t.dtype, expected.data());
      m.actual = ElementText(t.dtype, data + d.local_index * es);
      m.message =
          absl::StrCat("entry '", format::EscapeText(t.name), "': element ",
                       m.coords, " (index ", m.index, ") differs: expected ",
                       m.expected, ", actual ", m.actual);
    }
  } else {
    const std::string& want = *w.object;
    const std::string& got = *loaded;
    count = got.size();
    if (want != got) {
      differs = true;
      uint64_t i = 0;
      while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
      m.index = i;
      if (*w.name == kStepObject) {
        m.expected = absl::StrCat("\"", want, "\"");
        m.actual = absl::StrCat("\"", absl::CHexEscape(got), "\"");
        m.message = absl::StrCat("object '", *w.name, "' differs: expected ",
                                 m.expected,
                                 " (the checkpoint's step), actual ", m.actual);
      } else {
        m.expected = ByteHex(want, i);
        m.actual = ByteHex(got, i);
        m.message = absl::StrCat(
            "object '", *w.name, "': byte ", i, " differs: expected ",
            m.expected, ", actual ", m.actual,
            want.size() != got.size()
                ? absl::StrCat(" (", want.size(), " bytes expected, ",
                               got.size(), " stored)")
                : "");
      }
    }
  }
  MutexLock l(&out.mu);
  out.elements += count;
  out.done[*w.name] = true;
  if (differs) Record(out, std::move(m));
}

// Loads `batch` (one rank's destinations) and checks each as it completes.
// A DataLoss is a finding: the batch is retried one entry at a time so that
// each failing entry is named.
absl::Status LoadAndCheck(Reader& reader, uint64_t seed,
                          const std::vector<const Work*>& batch,
                          const VerifyOptions& o, RankOutcome& out) {
  std::vector<std::unique_ptr<char[]>> buffers(batch.size());
  std::vector<std::string> objects(batch.size());
  std::vector<LoadRequest> reqs(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const Work& w = *batch[i];
    LoadRequest& r = reqs[i];
    r.name = *w.name;
    if (w.tensor == nullptr) {
      r.object = &objects[i];
      r.on_complete = [&, i] {
        Check(seed, *batch[i], nullptr, &objects[i], out);
        if (o.progress) o.progress(batch[i]->bytes);
      };
    } else {
      buffers[i].reset(new char[w.bytes]);
      r.dtype = w.tensor->dtype;
      r.shape = w.tensor->shape;
      r.region = w.region;
      r.data = buffers[i].get();
      r.on_complete = [&, i] {
        Check(seed, *batch[i], buffers[i].get(), nullptr, out);
        if (o.progress) o.progress(batch[i]->bytes);
      };
    }
  }
  LoadOptions lo;
  lo.allow_unrequested = true;
  lo.report_not_loaded = false;  // loaded batch by batch
  lo.io_threads = o.io_threads;
  absl::StatusOr<LoadReport> report = reader.Load(reqs, lo);
  if (report.ok()) {
    out.bytes_loaded += report->bytes_loaded;
    return absl::OkStatus();
  }
  if (!absl::IsDataLoss(report.status())) return report.status();
  if (batch.size() == 1) {
    Mismatch m;
    m.kind = Mismatch::Kind::kLoad;
    m.entry = *batch[0]->name;
    m.message = std::string(report.status().message());
    MutexLock l(&out.mu);
    out.done[m.entry] = false;
    Record(out, std::move(m));
    return absl::OkStatus();
  }
  for (const Work* w : batch) {
    {
      MutexLock l(&out.mu);
      if (out.done[*w->name]) continue;
    }
    CKPT_RETURN_IF_ERROR(LoadAndCheck(reader, seed, {w}, o, out));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> MetaInt(const std::map<std::string, std::string>& meta,
                                 const std::string& dir, const char* key) {
  auto it = meta.find(key);
  uint64_t v = 0;
  if (it == meta.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": metadata '", key, "' is missing (written by ckpt-synth?)"));
  }
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": metadata '", key, "' = '",
                     format::EscapeText(it->second), "' is not a number"));
  }
  return v;
}

}  // namespace

absl::string_view MismatchKindName(Mismatch::Kind kind) {
  switch (kind) {
    case Mismatch::Kind::kMetadata:
      return "metadata";
    case Mismatch::Kind::kMissing:
      return "missing";
    case Mismatch::Kind::kUnexpected:
      return "unexpected";
    case Mismatch::Kind::kType:
      return "type";
    case Mismatch::Kind::kValue:
      return "value";
    case Mismatch::Kind::kLoad:
      return "load";
  }
  return "?";
}

namespace {

// How a synthetic checkpoint is saved: the codec and threads of `o`, and
// the synth.* metadata that let `verify` regenerate every value.
SaveOptions SynthSaveOptions(const SynthOptions& o, const ModelConfig& config,
                             const Model& model) {
  SaveOptions so;
  so.codec = o.codec;
  so.zstd_level = o.zstd_level;
  so.io_threads = o.io_threads;
  so.overwrite = o.overwrite;
  so.metadata = {
      {kMetaVersion, absl::StrCat(kValueVersion)},
      {kMetaLayout, std::string(LayoutName(o.layout))},
      {kMetaSeed, absl::StrCat(o.seed)},
      {kMetaDType, std::string(DTypeName(o.dtype))},
      {kMetaRanks, absl::StrCat(o.ranks)},
      {kMetaLayers, absl::StrCat(config.layers)},
      {kMetaHidden, absl::StrCat(config.hidden)},
      {kMetaFfn, absl::StrCat(config.ffn)},
      {kMetaVocab, absl::StrCat(config.vocab)},
      {kMetaSizeMb, o.config
                        ? absl::StrFormat("%.3f", model.total_bytes / 1048576.0)
                        : absl::StrFormat("%g", o.size_mb)},
  };
  return so;
}

// Rank r's piece `piece` of tensor `t`, generated as the shard writer asks
// for byte ranges of it (nothing is generated ahead or held).
TensorSource GeneratedPiece(uint64_t seed, const SynthTensor* t, Region piece,
                            const ProgressFn* progress) {
  return [seed, t, piece = std::move(piece), progress](
             uint64_t offset, void* dst, uint64_t n) -> absl::Status {
    const uint64_t es = DTypeSize(t->dtype);
    if (offset % es != 0 || n % es != 0) {
      return absl::InternalError(absl::StrCat(
          "entry '", format::EscapeText(t->name), "': byte range [", offset,
          ", ", offset + n, ") is not a whole number of elements"));
    }
    char* out = static_cast<char*>(dst);
    for (const Region& sub :
         ops::LocalRangeToRegions(piece, offset / es, (offset + n) / es)) {
      FillRegion(seed, *t, sub, out);
      out += RegionElements(sub) * es;
    }
    if (*progress) (*progress)(n);
    return absl::OkStatus();
  };
}

// Registers rank `r`'s piece of every tensor (generated while its shard is
// written), its RNG object and, on rank 0, the step object.
absl::Status RegisterSynthRank(internal::RankContents& contents,
                               const Model& model, const SynthOptions& o,
                               int r) {
  for (const SynthTensor& t : model.tensors) {
    const SynthPiece p = PieceOf(model, t, o.layout, r, o.ranks);
    TensorOptions to;
    to.replica = p.replica;
    CKPT_RETURN_IF_ERROR(contents.AddTensorSource(
        t.name, t.dtype, t.shape, p.region,
        GeneratedPiece(o.seed, &t, p.region, &o.progress), to));
  }
  const std::string rng = RngObjectName(r);
  CKPT_RETURN_IF_ERROR(
      contents.SetObject(rng, ObjectBytes(o.seed, rng, kRngStateSize)));
  if (r == 0) {
    CKPT_RETURN_IF_ERROR(contents.SetObject(kStepObject, absl::StrCat(o.step)));
  }
  return absl::OkStatus();
}

// Ranks written at once: enough to keep a few writers busy, few enough that
// memory does not depend on the number of ranks.
constexpr int kParallelRanks = 8;

}  // namespace

absl::StatusOr<SynthResult> WriteSynth(const SynthOptions& o) {
  if (o.ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks must be >= 1, got ", o.ranks));
  }
  if (!o.config && !(o.size_mb > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--size-mb must be > 0, got ", o.size_mb));
  }
  const ModelConfig config =
      o.config ? *o.config : ConfigForSize(o.size_mb, o.dtype);
  CKPT_RETURN_IF_ERROR(ValidateConfig(config));
  const Model model = DescribeModel(config, o.dtype);
  for (const SynthTensor& t : model.tensors) {
    CKPT_RETURN_IF_ERROR(
        Annotate(ValidateShape(t.shape, DTypeSize(t.dtype)), t.name));
  }
  const SaveOptions so = SynthSaveOptions(o, config, model);

  internal::WorldSaveOptions bo;
  bo.save = so;
  bo.storage = o.storage;
  bo.parallel_ranks = std::min(o.ranks, kParallelRanks);
  CKPT_ASSIGN_OR_RETURN(
      SaveResult saved,
      internal::SaveWorld(
          o.dir, o.step, o.ranks,
          [&](int r, internal::RankContents& c, std::shared_ptr<void>&) {
            return RegisterSynthRank(c, model, o, r);
          },
          bo));

  SynthResult res;
  res.path = saved.path;
  res.step = o.step;
  res.ranks = o.ranks;
  res.layout = o.layout;
  res.seed = o.seed;
  res.dtype = o.dtype;
  res.config = config;
  res.tensors = model.tensors.size();
  res.objects = 1 + o.ranks;
  for (const SynthTensor& t : model.tensors) res.elements += t.numel;
  res.logical_bytes = saved.logical_bytes;
  res.stored_bytes = saved.stored_bytes;
  res.generate_seconds = 0;  // values are generated while writing
  res.save_seconds =
      saved.plan_seconds + saved.write_seconds + saved.commit_seconds;
  return res;
}

absl::StatusOr<SynthResult> WriteTestCheckpoint(const std::string& dir,
                                                int ranks, SynthLayout layout,
                                                uint64_t seed, uint64_t step) {
  SynthOptions o;
  o.dir = dir;
  o.ranks = ranks;
  o.layout = layout;
  o.seed = seed;
  o.step = step;
  o.config = ConfigFor(2, 16);
  o.io_threads = 2;
  return WriteSynth(o);
}

namespace {

using Meta = std::map<std::string, std::string>;
using MismatchMap = std::map<std::string, Mismatch>;

// A string metadata value; InvalidArgument naming `dir` when it is missing.
absl::StatusOr<std::string> MetaString(const Meta& meta, const std::string& dir,
                                       const char* key) {
  auto it = meta.find(key);
  if (it == meta.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": metadata '", key, "' is missing"));
  }
  return it->second;
}

// What the checkpoint says about itself: checks that ckpt-synth wrote it
// (FailedPrecondition if not, or for a newer value version) and fills the
// written layout, dtype, ranks and model config of `res`. Returns the
// recorded seed. InvalidArgument for missing or bad values.
absl::StatusOr<uint64_t> ReadSynthMetadata(const Meta& meta,
                                           const std::string& dir,
                                           VerifyResult& res) {
  if (meta.find(kMetaVersion) == meta.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": not written by ckpt-synth (no '", kMetaVersion,
                     "' in its metadata)"));
  }
  CKPT_ASSIGN_OR_RETURN(uint64_t version, MetaInt(meta, dir, kMetaVersion));
  if (version != static_cast<uint64_t>(kValueVersion)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": written by ckpt-synth value version ", version,
                     ", this one implements ", kValueVersion));
  }
  CKPT_ASSIGN_OR_RETURN(std::string layout, MetaString(meta, dir, kMetaLayout));
  absl::StatusOr<SynthLayout> written_layout = ParseLayout(layout);
  if (!written_layout.ok()) return Annotate(written_layout.status(), dir);
  res.written_layout = *written_layout;
  CKPT_ASSIGN_OR_RETURN(std::string dtype_name,
                        MetaString(meta, dir, kMetaDType));
  absl::StatusOr<DType> dtype = DTypeFromName(dtype_name);
  if (!dtype.ok()) return Annotate(dtype.status(), dir);
  res.dtype = *dtype;
  CKPT_ASSIGN_OR_RETURN(uint64_t recorded_seed, MetaInt(meta, dir, kMetaSeed));
  CKPT_ASSIGN_OR_RETURN(uint64_t written_ranks, MetaInt(meta, dir, kMetaRanks));
  CKPT_ASSIGN_OR_RETURN(uint64_t layers, MetaInt(meta, dir, kMetaLayers));
  CKPT_ASSIGN_OR_RETURN(res.config.hidden, MetaInt(meta, dir, kMetaHidden));
  CKPT_ASSIGN_OR_RETURN(res.config.ffn, MetaInt(meta, dir, kMetaFfn));
  CKPT_ASSIGN_OR_RETURN(res.config.vocab, MetaInt(meta, dir, kMetaVocab));
  if (written_ranks < 1 || written_ranks > (1u << 20) || layers > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": metadata ranks ",
                                                   written_ranks, " or layers ",
                                                   layers, " out of range"));
  }
  res.config.layers = static_cast<int>(layers);
  CKPT_RETURN_IF_ERROR(Annotate(ValidateConfig(res.config), dir));
  res.written_ranks = static_cast<int>(written_ranks);
  return recorded_seed;
}

// The checkpoint's own records bound what its synth.* metadata may ask
// verify to plan (issue 28: layers or ranks of 2^20 in a 1 MB checkpoint
// made it plan 2^20 layers' tensors and ranks' objects and loads): the
// entries the metadata describes (the model's tensors, the step object and
// an RNG object per writing rank) are at most twice the checkpoint's
// entries + 1024, so that missing entries are still reported one by one;
// and every tensor of the model has a shape the format allows, whose
// elements all fit in 2^62 together. InvalidArgument naming the metadata
// and the values otherwise.
absl::Status CheckMetadataAgainstCheckpoint(const format::Manifest& m,
                                            const VerifyResult& res) {
  // 3 x (embedding, final norm and 7 tensors a layer): parameters and the
  // two optimizer states.
  const uint64_t described =
      3 * (2 + 7 * static_cast<uint64_t>(res.config.layers)) + 1 +
      static_cast<uint64_t>(res.written_ranks);
  if (described > 2 * m.entries.size() + kEntriesSlack) {
    return absl::InvalidArgumentError(absl::StrCat(
        res.path, ": metadata '", kMetaLayers, "' ", res.config.layers,
        " and '", kMetaRanks, "' ", res.written_ranks, " describe ", described,
        " entries, more than twice the checkpoint's ", m.entries.size(), " + ",
        kEntriesSlack));
  }
  const ModelConfig& c = res.config;
  if (c.hidden > (kMaxModelDim / 3) || c.ffn > kMaxModelDim ||
      c.vocab > kMaxModelDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(res.path, ": metadata hidden ", c.hidden, ", ffn ", c.ffn,
                     ", vocab ", c.vocab, " make a tensor dim past 2^62"));
  }
  const Model model = DescribeModel(c, res.dtype);
  uint64_t elements = 0;
  for (const SynthTensor& t : model.tensors) {
    absl::Status shape = ValidateShape(t.shape, DTypeSize(t.dtype));
    if (!shape.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          res.path, ": the model of its synth.* metadata has tensor '", t.name,
          "' of ", shape.message()));
    }
    if (t.numel > kMaxModelElements - elements) {
      return absl::InvalidArgumentError(
          absl::StrCat(res.path,
                       ": the model of its synth.* metadata has more "
                       "than 2^62 elements"));
    }
    elements += t.numel;
  }
  return absl::OkStatus();
}

// The finding for a --seed other than the recorded one.
Mismatch SeedMismatch(uint64_t given, uint64_t recorded) {
  Mismatch m;
  m.kind = Mismatch::Kind::kMetadata;
  m.entry = kMetaSeed;
  m.expected = absl::StrCat(given);
  m.actual = absl::StrCat(recorded);
  m.message = absl::StrCat("metadata '", kMetaSeed, "': expected ", m.expected,
                           " (--seed), the checkpoint records ", m.actual);
  return m;
}

// Every entry the generator makes for `res` (model tensors, the step
// object, one RNG object per written rank), by name.
std::map<std::string, Expected> ExpectedEntries(const Model& model,
                                                const VerifyResult& res) {
  std::map<std::string, Expected> expected;
  for (const SynthTensor& t : model.tensors) expected[t.name].tensor = &t;
  expected[kStepObject].object = absl::StrCat(res.step);
  for (int r = 0; r < res.written_ranks; ++r) {
    expected[RngObjectName(r)].object =
        ObjectBytes(res.seed, RngObjectName(r), kRngStateSize);
  }
  return expected;
}

// The kType finding when stored entry `e` is not of the kind, dtype or
// shape the generator makes; nullopt when it is.
std::optional<Mismatch> TypeMismatch(const format::EntryRecord& e,
                                     const Expected& exp) {
  const bool is_object = exp.tensor == nullptr;
  const bool stored_object = e.kind == format::EntryKind::kObject;
  std::string what, want, got;
  if (is_object != stored_object) {
    what = "kind";
    want = is_object ? "object" : "tensor";
    got = stored_object ? "object" : "tensor";
  } else if (!is_object && e.dtype != exp.tensor->dtype) {
    what = "dtype";
    want = std::string(DTypeName(exp.tensor->dtype));
    got = std::string(DTypeName(e.dtype));
  } else if (!is_object && e.shape != exp.tensor->shape) {
    what = "shape";
    want = ShapeToString(exp.tensor->shape);
    got = ShapeToString(e.shape);
  } else {
    return std::nullopt;
  }
  Mismatch m;
  m.kind = Mismatch::Kind::kType;
  m.entry = e.name;
  m.expected = std::move(want);
  m.actual = std::move(got);
  m.message =
      absl::StrCat("entry '", format::EscapeText(e.name), "': ", what, " ",
                   m.expected, " expected, the checkpoint has ", m.actual);
  return m;
}

// Matches the checkpoint's entries with the expected ones: returns the
// names whose values can be compared (in manifest order) and adds a
// finding to `found` for every unexpected, missing or mistyped entry.
std::vector<std::string> MatchEntries(
    const format::Manifest& manifest, const Reader& reader,
    const std::map<std::string, Expected>& expected, MismatchMap& found) {
  std::vector<std::string> checkable;
  for (const format::EntryRecord& e : manifest.entries) {
    auto it = expected.find(e.name);
    if (it == expected.end()) {
      Mismatch m;
      m.kind = Mismatch::Kind::kUnexpected;
      m.entry = e.name;
      m.message =
          absl::StrCat("entry '", format::EscapeText(e.name),
                       "' is in the checkpoint but not in the synthetic model");
      found[e.name] = std::move(m);
    } else if (std::optional<Mismatch> m = TypeMismatch(e, it->second)) {
      found[e.name] = *std::move(m);
    } else {
      checkable.push_back(e.name);
    }
  }
  for (const auto& [name, exp] : expected) {
    if (reader.Find(name) != nullptr) continue;
    Mismatch m;
    m.kind = Mismatch::Kind::kMissing;
    m.entry = name;
    m.message =
        absl::StrCat("entry '", name, "' is missing from the checkpoint");
    found[name] = std::move(m);
  }
  return checkable;
}

// Rank `rank`'s destinations, in model order: its piece of every checkable
// tensor under `res.layout` for `res.ranks` ranks, and its share of the
// objects, spread over the ranks in turn (the step object on rank 0). The
// Work items point into `checkable` and `expected`. Planned one rank at a
// time, as it is loaded: what all ranks load together is ranks x tensors.
std::vector<Work> PlanRank(const Model& model,
                           const std::map<std::string, Expected>& expected,
                           const std::vector<std::string>& checkable,
                           const VerifyResult& res, int rank) {
  std::vector<Work> work;
  int next_object_rank = 0;
  for (const std::string& name : checkable) {
    const Expected& exp = expected.at(name);
    if (exp.tensor == nullptr) {
      const int r = name == kStepObject ? 0 : next_object_rank++ % res.ranks;
      if (r == rank) {
        work.push_back(
            Work{&name, nullptr, &exp.object, FlatRange{}, exp.object.size()});
      }
      continue;
    }
    SynthPiece p = PieceOf(model, *exp.tensor, res.layout, rank, res.ranks);
    const uint64_t bytes =
        RegionElements(p.region) * DTypeSize(exp.tensor->dtype);
    if (bytes == 0) continue;
    work.push_back(Work{&name, exp.tensor, nullptr, p.region, bytes});
  }
  return work;
}

// The bytes that all `res.ranks` ranks load together.
uint64_t TotalWorkBytes(const Model& model,
                        const std::map<std::string, Expected>& expected,
                        const std::vector<std::string>& checkable,
                        const VerifyResult& res) {
  uint64_t total = 0;
  for (int r = 0; r < res.ranks; ++r) {
    for (const Work& w : PlanRank(model, expected, checkable, res, r)) {
      total += w.bytes;
    }
  }
  return total;
}

constexpr int kRanksPerReader = 64;

// Loads and checks the destinations of `plan` (a rank's, by PlanRank) as
// `outcomes.size()` ranks, up to kParallelRanks at a time: each thread
// opens the checkpoint `dir` itself (as a separate process would; again
// every kRanksPerReader ranks), plans its rank and loads its destinations
// in batches of about `o.batch_bytes`. What each rank finds goes to its
// RankOutcome; the first error is returned.
absl::Status LoadAllRanks(
    const std::string& dir, const ReaderOptions& ro,
    const std::function<std::vector<Work>(int rank)>& plan, uint64_t seed,
    const VerifyOptions& o,
    std::vector<std::unique_ptr<RankOutcome>>& outcomes) {
  std::vector<std::unique_ptr<Reader>> readers(kParallelRanks);
  std::vector<int> uses(kParallelRanks, 0);
  return internal::ParallelFor(
      kParallelRanks, outcomes.size(), [&](int t, size_t r) -> absl::Status {
        // A Reader keeps open every shard it has read: reopened every
        // kRanksPerReader ranks, so that open files stay bounded.
        if (uses[t]++ % kRanksPerReader == 0) {
          readers[t].reset();
          CKPT_ASSIGN_OR_RETURN(readers[t], Reader::Open(dir, ro));
        }
        const std::vector<Work> work = plan(static_cast<int>(r));
        std::vector<const Work*> batch;
        uint64_t batch_bytes = 0;
        for (size_t i = 0; i < work.size(); ++i) {
          batch.push_back(&work[i]);
          batch_bytes += work[i].bytes;
          if (batch_bytes >= o.batch_bytes || i + 1 == work.size()) {
            CKPT_RETURN_IF_ERROR(
                LoadAndCheck(*readers[t], seed, batch, o, *outcomes[r]));
            batch.clear();
            batch_bytes = 0;
          }
        }
        return absl::OkStatus();
      });
}

// Merges what the ranks found into `res` and `found`: the lowest differing
// index of each entry (a load failure wins over a value); an entry is
// checked when every rank compared all of its piece.
void MergeOutcomes(const std::vector<std::unique_ptr<RankOutcome>>& outcomes,
                   const std::vector<std::string>& checkable, VerifyResult& res,
                   MismatchMap& found) {
  std::map<std::string, bool> incomplete;
  for (const auto& oc : outcomes) {
    MutexLock l(&oc->mu);
    res.elements_checked += oc->elements;
    res.bytes_loaded += oc->bytes_loaded;
    for (const auto& [name, m] : oc->mismatches) {
      auto it = found.find(name);
      if (it == found.end() ||
          (it->second.kind == Mismatch::Kind::kValue &&
           m.kind == Mismatch::Kind::kValue && m.index < it->second.index) ||
          m.kind == Mismatch::Kind::kLoad) {
        found[name] = m;
      }
    }
    for (const auto& [name, done] : oc->done) {
      if (!done) incomplete[name] = true;
    }
  }
  for (const std::string& name : checkable) {
    if (!incomplete.count(name)) ++res.entries_checked;
  }
}

}  // namespace

absl::StatusOr<VerifyResult> VerifySynth(const VerifyOptions& o) {
  const auto t0 = Clock::now();
  if (o.ranks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks must be >= 1, got ", o.ranks));
  }
  ReaderOptions ro;
  ro.storage = o.storage;
  ro.io_threads = std::max(1, o.io_threads);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader,
                        Reader::Open(o.path, ro));
  const format::Manifest& manifest = reader->manifest();
  // The loads below are sized by the manifest's shapes: only once the
  // shard files vouch for them.
  CKPT_RETURN_IF_ERROR(ops::CheckSourceShards(
      o.storage != nullptr ? o.storage : DefaultStorage(), reader->path(),
      manifest));
  VerifyResult res;
  res.path = reader->path();
  res.step = manifest.info.step;
  res.entries = manifest.entries.size();
  const Meta meta(manifest.metadata.begin(), manifest.metadata.end());
  CKPT_ASSIGN_OR_RETURN(uint64_t recorded_seed,
                        ReadSynthMetadata(meta, res.path, res));
  CKPT_RETURN_IF_ERROR(CheckMetadataAgainstCheckpoint(manifest, res));
  res.ranks = o.ranks > 0 ? o.ranks : res.written_ranks;
  res.layout = o.layout.value_or(res.written_layout);
  res.seed = o.seed.value_or(recorded_seed);

  // Plan: the entries the model has against those in the checkpoint, and
  // each loading rank's destinations.
  const Model model = DescribeModel(res.config, res.dtype);
  const std::map<std::string, Expected> expected = ExpectedEntries(model, res);
  MismatchMap found;
  const std::vector<std::string> checkable =
      MatchEntries(manifest, *reader, expected, found);
  auto plan = [&](int rank) {
    return PlanRank(model, expected, checkable, res, rank);
  };
  if (o.progress_start) {
    o.progress_start(TotalWorkBytes(model, expected, checkable, res));
  }

  // Load and compare, then merge what the ranks found.
  std::vector<std::unique_ptr<RankOutcome>> outcomes(res.ranks);
  for (auto& oc : outcomes) oc = std::make_unique<RankOutcome>();
  CKPT_RETURN_IF_ERROR(LoadAllRanks(res.path, ro, plan, res.seed, o, outcomes));
  MergeOutcomes(outcomes, checkable, res, found);
  if (o.seed && *o.seed != recorded_seed) {
    res.mismatches.push_back(SeedMismatch(*o.seed, recorded_seed));
  }
  for (auto& [name, m] : found) res.mismatches.push_back(std::move(m));
  res.seconds = Since(t0);
  return res;
}

}  // namespace ckpt::synth
