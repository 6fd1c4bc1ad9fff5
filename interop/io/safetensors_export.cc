#include "ckpt/interop/io/safetensors_export.h"

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/io/file_io.h"
#include "ckpt/interop/io/safetensors_meta.h"
#include "ckpt/interop/safetensors.h"
#include "ckpt/ops/source_shards.h"
#include "ckpt/reader.h"
#include "util/mutex.h"

namespace ckpt::interop {
namespace fs = std::filesystem;
namespace {

struct Selected {
  const format::EntryRecord* entry;
  uint64_t bytes;
};

uint64_t EntryBytes(const format::EntryRecord& e) {
  uint64_t n = e.kind == format::EntryKind::kObject ? 1 : DTypeSize(e.dtype);
  for (uint64_t d : e.shape) n *= d;
  return n;
}

absl::StatusOr<std::vector<Selected>> SelectEntries(
    const format::Manifest& m, const SafetensorsExportOptions& o,
    size_t* excluded) {
  std::vector<Selected> out;
  for (const format::EntryRecord& e : m.entries) {
    if (!SelectedByGlobs(e.name, o.include, o.exclude)) {
      ++*excluded;
      continue;
    }
    if (e.flags & format::kEntryFlagPartial) {
      return absl::FailedPreconditionError(absl::StrCat(
          "entry '", format::EscapeText(e.name),
          "' is partial: its chunks do not cover the tensor, so there is no "
          "whole tensor to export (leave it out with --exclude)"));
    }
    out.push_back({&e, EntryBytes(e)});
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        "--include/--exclude select no entry of the checkpoint");
  }
  return out;
}

// Shards as transformers' save_pretrained plans them (huggingface_hub's
// split_state_dict_into_shards_factory): in order, a new shard when the
// next entry would take the current one past `max`; an entry larger than
// `max` is a shard of its own, placed when it is reached, while the current
// shard stays open for the entries after it. 0: one shard.
std::vector<std::vector<Selected>> PlanShards(
    const std::vector<Selected>& entries, uint64_t max) {
  if (max == 0) return {entries};
  std::vector<std::vector<Selected>> shards;
  std::vector<Selected> current;
  uint64_t size = 0;
  for (const Selected& s : entries) {
    if (s.bytes > max) {
      shards.push_back({s});
      continue;
    }
    if (s.bytes > max - size) {  // size <= max: no overflow
      shards.push_back(std::move(current));
      current.clear();
      size = 0;
    }
    current.push_back(s);
    size += s.bytes;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

// Windows of a few MiB: the buffers that carry them between the reads and
// the writes stay few and small (touched once, then reused), and the
// writes start soon. 2-4 MiB were the fastest of 1-64 MiB for 352 MiB on
// /dev/shm (bench/peers/single.py --consolidate).
constexpr uint64_t kWindowBytes = 4ull << 20;

// A run of the data section of an output file: elements [start, start +
// len) of tensor `entry`, or (object) the whole bytes of an object.
struct Piece {
  const format::EntryRecord* entry;
  uint64_t start = 0, len = 0;
};

// Consecutive pieces of a data section loaded together into one buffer:
// tensor pieces of at most `slab` bytes in all, or one object alone.
struct Window {
  std::vector<Piece> pieces;
  uint64_t bytes = 0;
  bool object = false;
};

// The flat element index at which the row-major box `b` of a tensor of
// `shape` starts, if its elements are one run of the tensor's flattening
// (dims before some d of size 1, dims after it whole); nullopt if not.
std::optional<uint64_t> ContiguousStart(const Shape& shape, const Box& b) {
  size_t d = 0;
  while (d < b.size.size() && b.size[d] == 1) ++d;
  for (size_t i = d + 1; i < b.size.size(); ++i) {
    if (b.offset[i] != 0 || b.size[i] != shape[i]) return std::nullopt;
  }
  uint64_t start = 0;
  for (size_t i = 0; i < shape.size(); ++i)
    start = start * shape[i] + b.offset[i];
  return start;
}

// The element indices of tensor `e` at which a window may end without
// cutting a stored block in two, ascending: the block boundaries of chunks
// that are one run of the flattening (a Shard(0) piece). A block cut by a
// window is read and verified once per window it reaches. Empty when a
// chunk is not one run (a window then cuts where it fills) or a block does
// not hold whole elements.
std::vector<uint64_t> BlockCuts(const format::EntryRecord& e) {
  const uint64_t es = DTypeSize(e.dtype);
  std::vector<uint64_t> cuts;
  for (const format::ChunkRecord& c : e.chunks) {
    std::optional<uint64_t> start;
    if (const auto* f = std::get_if<FlatRange>(&c.region)) {
      start = f->start;
    } else {
      start = ContiguousStart(e.shape, std::get<Box>(c.region));
    }
    if (!start || c.block_size == 0 || c.block_size % es != 0) return {};
    const uint64_t per_block = c.block_size / es, n = RegionElements(c.region);
    for (uint64_t at = 0; at < n; at += per_block) cuts.push_back(*start + at);
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// The largest cut in (start, limit], or 0 if none.
uint64_t LastCutIn(const std::vector<uint64_t>& cuts, uint64_t start,
                   uint64_t limit) {
  auto it = std::upper_bound(cuts.begin(), cuts.end(), limit);
  if (it == cuts.begin() || *std::prev(it) <= start) return 0;
  return *std::prev(it);
}

// Cuts the data section of `entries` into windows of whole elements, each
// ending at a block boundary of the tensor where one fits (BlockCuts); a
// window holds one element at least, so it may pass `slab` when an element
// does.
std::vector<Window> PlanWindows(const std::vector<Selected>& entries,
                                uint64_t slab) {
  std::vector<Window> windows(1);
  for (const Selected& s : entries) {
    if (s.entry->kind == format::EntryKind::kObject) {
      windows.push_back({{{s.entry, 0, s.bytes}}, s.bytes, true});
      windows.emplace_back();
      continue;
    }
    const uint64_t es = DTypeSize(s.entry->dtype);
    const uint64_t n = s.bytes / es;
    const std::vector<uint64_t> cuts = BlockCuts(*s.entry);
    // Where a piece from `start` of at most `fit` elements ends; 0: none.
    auto end_of = [&](uint64_t start, uint64_t fit) -> uint64_t {
      if (fit >= n - start) return n;
      if (cuts.empty()) return fit == 0 ? 0 : start + fit;
      return LastCutIn(cuts, start, start + fit);
    };
    for (uint64_t start = 0; start < n;) {
      Window* w = &windows.back();
      uint64_t fit = (slab - std::min(slab, w->bytes)) / es;
      uint64_t cut = end_of(start, fit);
      if (cut == 0 && !w->pieces.empty()) {  // none fits: a window of its own
        windows.emplace_back();
        w = &windows.back();
        fit = slab / es;
        cut = end_of(start, fit);
      }
      const uint64_t len =
          cut != 0 ? cut - start
                   : std::min(n - start, std::max<uint64_t>(1, fit));
      w->pieces.push_back({s.entry, start, len});
      w->bytes += len * es;
      start += len;
    }
  }
  windows.erase(std::remove_if(windows.begin(), windows.end(),
                               [](const Window& w) { return w.bytes == 0; }),
                windows.end());
  return windows;
}

// Appends what the loading thread hands it to an output file on a thread
// of its own, so that the file's writes (on tmpfs, the allocation of its
// pages and a copy) run while the next windows are read and verified.
// Buffers are allocated once and reused: no zero fill, no page faults per
// window.
class WriteBehind {
 public:
  // `file` must outlive the WriteBehind; nothing else writes to it until
  // Finish returned.
  WriteBehind(OutputFile& file, uint64_t buffer_bytes, int buffers)
      : file_(file) {
    for (int i = 0; i < buffers; ++i) {
      owned_.emplace_back(new char[buffer_bytes]);  // not zeroed
      free_.push_back(owned_.back().get());
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~WriteBehind() { (void)Finish(); }

  // A buffer of `buffer_bytes` that no pending write uses, waiting for one
  // if need be; null once the writer failed (Finish returns why).
  char* Acquire() {
    MutexLock l(&mu_);
    while (free_.empty() && status_.ok()) changed_.Wait(&mu_);
    if (!status_.ok()) return nullptr;
    char* b = free_.back();
    free_.pop_back();
    return b;
  }
  // Appends bytes [buffer, buffer + n) of a buffer of Acquire after those
  // handed over before; the buffer is free again once written.
  void Push(char* buffer, uint64_t n) {
    MutexLock l(&mu_);
    queue_.push_back({buffer, n, {}});
    changed_.SignalAll();
  }
  // Appends `bytes` (an object's) after those handed over before, once the
  // object handed over before this one is written: one at a time in memory.
  void Push(std::string bytes) {
    MutexLock l(&mu_);
    while (object_pending_ && status_.ok()) changed_.Wait(&mu_);
    object_pending_ = true;
    queue_.push_back({nullptr, 0, std::move(bytes)});
    changed_.SignalAll();
  }
  // Waits for every byte pushed to be written and stops the thread; the
  // writer's first error.
  absl::Status Finish() {
    {
      MutexLock l(&mu_);
      done_ = true;
      changed_.SignalAll();
    }
    if (thread_.joinable()) thread_.join();
    MutexLock l(&mu_);
    return status_;
  }

 private:
  struct Pending {
    char* buffer;
    uint64_t n;
    std::string bytes;  // buffer == null: these
  };

  void Run() {
    for (;;) {
      Pending p;
      {
        MutexLock l(&mu_);
        while (queue_.empty() && !done_) changed_.Wait(&mu_);
        if (queue_.empty() || !status_.ok()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Status st = p.buffer != nullptr
                            ? file_.Append(absl::string_view(p.buffer, p.n))
                            : file_.Append(p.bytes);
      MutexLock l(&mu_);
      if (p.buffer != nullptr) {
        free_.push_back(p.buffer);
      } else {
        object_pending_ = false;
      }
      if (!st.ok()) status_ = st;
      changed_.SignalAll();
      if (!status_.ok()) return;
    }
  }

  OutputFile& file_;
  std::vector<std::unique_ptr<char[]>> owned_;
  Mutex mu_;
  CondVar changed_;
  std::vector<char*> free_ ABSL_GUARDED_BY(mu_);
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool object_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Loads the tensor pieces of window `w` into `buf`, in one Load so that
// its reads run on the reader's I/O threads.
absl::Status LoadWindow(Reader& reader, const Window& w, char* buf) {
  std::vector<LoadRequest> reqs;
  uint64_t at = 0;
  for (const Piece& p : w.pieces) {
    const format::EntryRecord& e = *p.entry;
    LoadRequest r;
    r.name = e.name;
    r.dtype = e.dtype;
    r.shape = e.shape;
    const uint64_t bytes = p.len * DTypeSize(e.dtype);
    r.region = bytes == EntryBytes(e) ? Region(FullBox(e.shape))
                                      : Region(FlatRange{p.start, p.len});
    r.data = buf + at;
    at += bytes;
    reqs.push_back(std::move(r));
  }
  LoadOptions lo;
  lo.allow_unrequested = true;
  lo.report_not_loaded = false;
  return reader.Load(reqs, lo).status();
}

// Streams the data section: loads window after window (this thread, on
// the reader's I/O threads) while the WriteBehind appends the ones loaded
// before.
absl::Status StreamData(Reader& reader, const std::vector<Selected>& entries,
                        OutputFile& file, const SafetensorsExportOptions& o,
                        uint64_t total) {
  const std::vector<Window> windows =
      PlanWindows(entries, std::clamp<uint64_t>(o.slab_bytes, 1, kWindowBytes));
  uint64_t largest = 0;
  for (const Window& w : windows) {
    if (!w.object) largest = std::max(largest, w.bytes);
  }
  // Three buffers: one loading, one writing, one ready in between.
  WriteBehind writer(file, largest,
                     std::min<int>(3, static_cast<int>(windows.size())));
  for (const Window& w : windows) {
    if (w.object) {
      CKPT_ASSIGN_OR_RETURN(std::string bytes,
                            reader.ReadObject(w.pieces[0].entry->name));
      writer.Push(std::move(bytes));
    } else {
      char* buf = writer.Acquire();
      if (buf == nullptr) break;  // the writer failed: Finish says why
      CKPT_RETURN_IF_ERROR(LoadWindow(reader, w, buf));
      writer.Push(buf, w.bytes);
    }
    if (o.progress) o.progress(w.bytes, total);
  }
  return writer.Finish();
}

absl::Status WriteShard(Reader& reader, const std::string& path,
                        const std::vector<Selected>& entries,
                        const StringPairs& metadata,
                        const SafetensorsExportOptions& o, uint64_t total) {
  std::vector<interop::SafetensorsTensor> tensors;
  uint64_t offset = 0;
  for (const Selected& s : entries) {
    interop::SafetensorsTensor t;
    t.name = s.entry->name;
    const bool object = s.entry->kind == format::EntryKind::kObject;
    t.dtype = object ? DType::kUInt8 : s.entry->dtype;
    t.shape = s.entry->shape;
    t.begin = offset;
    t.end = offset += s.bytes;
    tensors.push_back(std::move(t));
  }
  CKPT_ASSIGN_OR_RETURN(std::string header,
                        interop::EncodeSafetensorsHeader(tensors, metadata));
  CKPT_ASSIGN_OR_RETURN(OutputFile file, OutputFile::Create(path));
  CKPT_RETURN_IF_ERROR(file.Append(header));
  CKPT_RETURN_IF_ERROR(StreamData(reader, entries, file, o, total));
  return file.Commit();
}

// True for the names a sharded export writes into its directory:
// "model-00001-of-00003.safetensors" (interop::HfShardName: at least five
// digits each) and the index.
bool IsShardSetName(absl::string_view name) {
  if (name == interop::kHfIndexName) return true;
  auto digits = [&](size_t n) {
    size_t k = 0;
    while (k < name.size() && absl::ascii_isdigit(name[k])) ++k;
    if (k < n) return false;
    name.remove_prefix(k);
    return true;
  };
  return absl::ConsumePrefix(&name, "model-") && digits(5) &&
         absl::ConsumePrefix(&name, "-of-") && digits(5) &&
         name == ".safetensors";
}

// --force replaces the directory of a sharded export whole, so it must hold
// nothing but a previous export's files: FailedPrecondition naming the
// first other entry (in name order) otherwise.
absl::Status CheckOnlyShardSet(const std::string& output) {
  std::error_code ec;
  std::vector<std::string> others;
  for (fs::directory_iterator it(output, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!IsShardSetName(name) || !it->is_regular_file())
      others.push_back(std::move(name));
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(output, ": cannot list: ", ec.message()));
  }
  if (others.empty()) return absl::OkStatus();
  std::sort(others.begin(), others.end());
  return absl::FailedPreconditionError(absl::StrCat(
      output, ": holds '", format::EscapeText(others[0]), "'",
      others.size() > 1 ? absl::StrCat(" and ", others.size() - 1, " more")
                        : "",
      ", not written by ckpt-convert; --force replaces only a directory of "
      "model-NNNNN-of-NNNNN.safetensors shards and ",
      interop::kHfIndexName,
      " (move the other files or choose another "
      "directory)"));
}

absl::Status CheckOutput(const std::string& output, bool sharded,
                         bool overwrite) {
  std::error_code ec;
  auto st = fs::symlink_status(output, ec);
  if (!ec && fs::exists(st)) {
    if (!sharded && fs::is_directory(st)) {
      return absl::FailedPreconditionError(
          absl::StrCat(output, ": is a directory"));
    }
    if (sharded && !fs::is_directory(st)) {
      return absl::FailedPreconditionError(absl::StrCat(
          output,
          ": exists and is not a directory (shards go into a directory)"));
    }
    if (!overwrite) {
      return absl::AlreadyExistsError(
          absl::StrCat(output, ": already exists (use --force to replace it)"));
    }
    if (sharded) CKPT_RETURN_IF_ERROR(CheckOnlyShardSet(output));
  }
  fs::path parent = fs::path(output).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    return absl::NotFoundError(absl::StrCat(
        output, ": directory ", parent.string(), " does not exist"));
  }
  return absl::OkStatus();
}

// Moves the finished directory `tmp` to `output`, replacing what is there.
absl::Status PublishDir(const std::string& tmp, const std::string& output) {
  std::error_code ec;
  const std::string old = absl::StrCat(output, ".old-", ::getpid());
  const bool replace = fs::exists(output, ec);
  if (replace) {
    fs::rename(output, old, ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat("renaming ", output, ": ", ec.message()));
  }
  fs::rename(tmp, output, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("renaming ", tmp, ": ", ec.message()));
  if (replace) fs::remove_all(old, ec);
  std::string dir = fs::path(output).parent_path().string();
  return SyncDir(dir.empty() ? "." : dir);
}

// Opens the checkpoint `source` and checks its shard files against its
// manifest: what the export plans (shards, header offsets) follows the
// manifest's declared sizes, so only once the shard files vouch for them.
absl::StatusOr<std::unique_ptr<Reader>> OpenSource(const std::string& source,
                                                   int io_threads,
                                                   Storage* storage) {
  if (storage == nullptr) storage = DefaultStorage();
  ReaderOptions ro;
  ro.io_threads = std::max(1, io_threads);
  ro.storage = storage;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader,
                        Reader::Open(source, ro));
  CKPT_RETURN_IF_ERROR(
      ops::CheckSourceShards(storage, reader->path(), reader->manifest()));
  return reader;
}

// The directory the shards are written into before they are published,
// removed on destruction unless released. Empty: no directory (one file).
class ShardDir {
 public:
  static absl::StatusOr<ShardDir> Create(const std::string& output,
                                         bool sharded) {
    ShardDir d;
    if (!sharded) return d;
    d.path_ = absl::StrCat(output, ".tmp-", ::getpid());
    std::error_code ec;
    if (!fs::create_directory(d.path_, ec)) {
      const std::string path = std::move(d.path_);
      d.path_.clear();
      return absl::InternalError(
          absl::StrCat(path, ": cannot create: ", ec.message()));
    }
    return d;
  }
  ShardDir(ShardDir&& o) noexcept : path_(std::move(o.path_)) {
    o.path_.clear();
  }
  ShardDir& operator=(ShardDir&&) = delete;
  ~ShardDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  void Release() { path_.clear(); }

 private:
  ShardDir() = default;
  std::string path_;
};

// Writes each of `shards` as a safetensors file: `output` itself, or
// (sharded) the shard files in `dir`. Lists them and their entries in `r`
// and the entries' files in `index`.
absl::Status WriteShards(Reader& reader, const std::string& output,
                         const std::string& dir,
                         const std::vector<std::vector<Selected>>& shards,
                         const StringPairs& metadata,
                         const SafetensorsExportOptions& o,
                         SafetensorsExportResult& r, interop::HfIndex& index) {
  const bool sharded = !dir.empty();
  std::error_code ec;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = sharded ? interop::HfShardName(i, shards.size())
                                     : fs::path(output).filename().string();
    const std::string path = sharded ? (fs::path(dir) / name).string() : output;
    CKPT_RETURN_IF_ERROR(
        WriteShard(reader, path, shards[i], metadata, o, r.total_size));
    r.files.emplace_back(name, fs::file_size(path, ec));
    for (const Selected& s : shards[i]) {
      r.entries.push_back({s.entry->name, s.entry->kind,
                           s.entry->kind == format::EntryKind::kObject
                               ? DType::kUInt8
                               : s.entry->dtype,
                           s.entry->shape, name, s.bytes});
      index.weight_map.emplace_back(s.entry->name, name);
    }
  }
  return absl::OkStatus();
}

// Writes the index into the shard directory `dir`, then moves it to
// `output`.
absl::Status PublishShardSet(const std::string& dir, const std::string& output,
                             const interop::HfIndex& index) {
  CKPT_ASSIGN_OR_RETURN(
      OutputFile idx,
      OutputFile::Create((fs::path(dir) / interop::kHfIndexName).string()));
  CKPT_RETURN_IF_ERROR(idx.Append(interop::EncodeHfIndex(index)));
  CKPT_RETURN_IF_ERROR(idx.Commit());
  return PublishDir(dir, output);
}

}  // namespace

bool SelectedByGlobs(const std::string& name,
                     const std::vector<std::string>& include,
                     const std::vector<std::string>& exclude) {
  bool in = include.empty();
  for (const std::string& g : include)
    in = in || fnmatch(g.c_str(), name.c_str(), 0) == 0;
  for (const std::string& g : exclude)
    in = in && fnmatch(g.c_str(), name.c_str(), 0) != 0;
  return in;
}

absl::StatusOr<SafetensorsExportResult> ExportSafetensors(
    const std::string& source, const std::string& output,
    const SafetensorsExportOptions& o) {
  const bool sharded = o.max_shard_bytes > 0;
  CKPT_RETURN_IF_ERROR(CheckOutput(output, sharded, o.overwrite));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader,
                        OpenSource(source, o.io_threads, o.storage));
  const format::Manifest& m = reader->manifest();
  SafetensorsExportResult r;
  r.checkpoint_dir = reader->path();
  r.output = output;
  r.info = m.info;
  r.metadata_count = m.metadata.size();
  // Plan: the entries selected, the metadata, the shards.
  CKPT_ASSIGN_OR_RETURN(std::vector<Selected> selected,
                        SelectEntries(m, o, &r.excluded));
  std::vector<std::string> objects;
  for (const Selected& s : selected) {
    if (s.entry->kind == format::EntryKind::kObject)
      objects.push_back(s.entry->name);
    r.total_size += s.bytes;
  }
  const StringPairs metadata = ExportMetadata(m.info, m.metadata, objects);
  const auto shards = PlanShards(selected, o.max_shard_bytes);
  // Write, then publish the shard set.
  CKPT_ASSIGN_OR_RETURN(ShardDir dir, ShardDir::Create(output, sharded));
  interop::HfIndex index;
  index.total_size = r.total_size;
  CKPT_RETURN_IF_ERROR(
      WriteShards(*reader, output, dir.path(), shards, metadata, o, r, index));
  if (!sharded) return r;
  CKPT_RETURN_IF_ERROR(PublishShardSet(dir.path(), output, index));
  dir.Release();
  return r;
}

}  // namespace ckpt::interop
