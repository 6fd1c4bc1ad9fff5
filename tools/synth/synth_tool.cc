#include "synth/synth_tool.h"

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/status_macros.h"
#include "common/escaped_output.h"
#include "common/tool_util.h"
#include "util/mutex.h"

namespace ckpt::synth {
namespace {

using tools::HumanBytes;

// A Progress shared by several threads.
class SharedProgress {
 public:
  SharedProgress(std::string label, uint64_t total)
      : progress_(std::move(label), total) {}
  void Add(uint64_t n) {
    MutexLock l(&mu_);
    progress_.Add(n);
  }

 private:
  Mutex mu_;
  tools::Progress progress_ ABSL_GUARDED_BY(mu_);
};

nlohmann::ordered_json ModelJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["layers"] = c.layers;
  j["hidden"] = c.hidden;
  j["ffn"] = c.ffn;
  j["vocab"] = c.vocab;
  return j;
}

std::string ModelText(const ModelConfig& c, DType dtype) {
  return absl::StrFormat(
      "  model: %d layers, hidden %d, ffn %d, vocab %d; %s parameters, float32 "
      "Adam states\n",
      c.layers, c.hidden, c.ffn, c.vocab, DTypeName(dtype));
}

}  // namespace

std::string WriteText(const SynthResult& r) {
  std::string s = absl::StrCat("wrote ", r.path, "\n");
  absl::StrAppendFormat(&s, "  step %d, %d %s, layout %s, seed %d\n", r.step,
                        r.ranks, r.ranks == 1 ? "rank" : "ranks",
                        LayoutName(r.layout), r.seed);
  s += ModelText(r.config, r.dtype);
  absl::StrAppendFormat(
      &s, "  %d tensors (%d elements), %d objects: %s, %s stored\n", r.tensors,
      r.elements, r.objects, HumanBytes(r.logical_bytes),
      HumanBytes(r.stored_bytes));
  return s;
}

nlohmann::ordered_json WriteJson(const SynthResult& r) {
  nlohmann::ordered_json j;
  j["command"] = "write";
  j["path"] = r.path;
  j["step"] = r.step;
  j["ranks"] = r.ranks;
  j["layout"] = std::string(LayoutName(r.layout));
  j["seed"] = r.seed;
  j["dtype"] = std::string(DTypeName(r.dtype));
  j["model"] = ModelJson(r.config);
  j["tensors"] = r.tensors;
  j["objects"] = r.objects;
  j["elements"] = r.elements;
  j["logical_bytes"] = r.logical_bytes;
  j["stored_bytes"] = r.stored_bytes;
  j["generate_seconds"] = r.generate_seconds;
  j["save_seconds"] = r.save_seconds;
  return j;
}

std::string VerifyText(const VerifyResult& r, size_t max_listed) {
  std::string s = absl::StrCat("verified ", r.path, "\n");
  absl::StrAppendFormat(
      &s,
      "  step %d, written by %d %s (layout %s), loaded as %d %s (layout %s), "
      "seed %d\n",
      r.step, r.written_ranks, r.written_ranks == 1 ? "rank" : "ranks",
      LayoutName(r.written_layout), r.ranks, r.ranks == 1 ? "rank" : "ranks",
      LayoutName(r.layout), r.seed);
  s += ModelText(r.config, r.dtype);
  absl::StrAppendFormat(
      &s, "  %d of %d entries checked, %d elements compared, %s loaded\n",
      r.entries_checked, r.entries, r.elements_checked,
      HumanBytes(r.bytes_loaded));
  if (r.ok()) return s + "OK: every entry matches the generator\n";
  size_t metadata = 0;
  for (const Mismatch& m : r.mismatches)
    metadata += m.kind == Mismatch::Kind::kMetadata;
  for (size_t i = 0; i < r.mismatches.size() && i < max_listed; ++i) {
    absl::StrAppend(&s, "MISMATCH ", tools::EscapeText(r.mismatches[i].message),
                    "\n");
  }
  if (r.mismatches.size() > max_listed) {
    absl::StrAppendFormat(&s, "... and %d more\n",
                          r.mismatches.size() - max_listed);
  }
  const size_t entries = r.mismatches.size() - metadata;
  std::string what;
  if (metadata != 0)
    absl::StrAppend(&what, metadata, " metadata value",
                    metadata == 1 ? "" : "s");
  if (metadata != 0 && entries != 0) what += " and ";
  if (entries != 0)
    absl::StrAppend(&what, entries, " ", entries == 1 ? "entry" : "entries");
  absl::StrAppend(&s, "FAILED: ", what, " differ",
                  (metadata + entries == 1 ? "s" : ""),
                  " from the generator\n");
  return s;
}

nlohmann::ordered_json VerifyJson(const VerifyResult& r) {
  nlohmann::ordered_json j;
  j["command"] = "verify";
  j["path"] = r.path;
  j["step"] = r.step;
  j["written_ranks"] = r.written_ranks;
  j["written_layout"] = std::string(LayoutName(r.written_layout));
  j["ranks"] = r.ranks;
  j["layout"] = std::string(LayoutName(r.layout));
  j["seed"] = r.seed;
  j["dtype"] = std::string(DTypeName(r.dtype));
  j["model"] = ModelJson(r.config);
  j["entries"] = r.entries;
  j["entries_checked"] = r.entries_checked;
  j["elements_checked"] = r.elements_checked;
  j["bytes_loaded"] = r.bytes_loaded;
  j["seconds"] = r.seconds;
  j["ok"] = r.ok();
  j["mismatches"] = nlohmann::ordered_json::array();
  for (const Mismatch& m : r.mismatches) {
    nlohmann::ordered_json x;
    x["kind"] = std::string(MismatchKindName(m.kind));
    x["entry"] = m.entry;
    if (m.kind == Mismatch::Kind::kValue) {
      x["index"] = m.index;
      if (!m.coords.empty()) x["coords"] = m.coords;
    }
    if (!m.expected.empty() || !m.actual.empty()) {
      x["expected"] = m.expected;
      x["actual"] = m.actual;
    }
    x["message"] = m.message;
    j["mismatches"].push_back(std::move(x));
  }
  return j;
}

absl::StatusOr<int> RunWrite(const WriteArgs& args, std::ostream& out) {
  SynthOptions o;
  o.dir = args.dir;
  o.ranks = args.ranks;
  CKPT_ASSIGN_OR_RETURN(o.layout, ParseLayout(args.layout));
  o.seed = args.seed;
  o.size_mb = args.size_mb;
  CKPT_ASSIGN_OR_RETURN(o.dtype, DTypeFromName(args.dtype));
  o.step = args.step;
  if (args.codec == "none") {
    o.codec = format::Codec::kNone;
  } else if (args.codec == "zstd") {
    o.codec = format::Codec::kZstd;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown codec '", args.codec, "' (expected none or zstd)"));
  }
  o.zstd_level = args.zstd_level;
  if (args.io_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--io-threads must be >= 1, got ", args.io_threads));
  }
  o.io_threads = args.io_threads;
  o.overwrite = args.overwrite;
  std::unique_ptr<SharedProgress> progress;
  if (o.ranks >= 1 && (o.size_mb > 0)) {
    const Model m = DescribeModel(ConfigForSize(o.size_mb, o.dtype), o.dtype);
    uint64_t total = m.total_bytes;
    if (o.layout == SynthLayout::kReplicated) total *= o.ranks;
    progress = std::make_unique<SharedProgress>("generating", total);
    o.progress = [&](uint64_t n) { progress->Add(n); };
  }
  absl::StatusOr<SynthResult> written = WriteSynth(o);
  progress.reset();
  CKPT_ASSIGN_OR_RETURN(SynthResult r, std::move(written));
  if (args.json) {
    out << tools::JsonText(WriteJson(r)) << "\n";
  } else {
    out << WriteText(r);
  }
  return tools::kExitOk;
}

absl::StatusOr<int> RunVerify(const VerifyArgs& args, std::ostream& out) {
  VerifyOptions o;
  o.path = args.path;
  if (args.ranks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks must be >= 1, got ", args.ranks));
  }
  o.ranks = args.ranks;
  if (!args.layout.empty()) {
    CKPT_ASSIGN_OR_RETURN(o.layout, ParseLayout(args.layout));
  }
  o.seed = args.seed;
  if (args.io_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--io-threads must be >= 1, got ", args.io_threads));
  }
  o.io_threads = args.io_threads;
  std::unique_ptr<SharedProgress> progress;
  o.progress_start = [&](uint64_t total) {
    progress = std::make_unique<SharedProgress>("verifying", total);
  };
  o.progress = [&](uint64_t n) { progress->Add(n); };
  absl::StatusOr<VerifyResult> verified = VerifySynth(o);
  progress.reset();
  CKPT_ASSIGN_OR_RETURN(VerifyResult r, std::move(verified));
  if (args.json) {
    out << tools::JsonText(VerifyJson(r)) << "\n";
  } else {
    out << VerifyText(r);
  }
  return r.ok() ? tools::kExitOk : tools::kExitFindings;
}

}  // namespace ckpt::synth
