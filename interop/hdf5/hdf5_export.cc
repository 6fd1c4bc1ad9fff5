#include "ckpt/interop/hdf5/hdf5_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/format/names.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/hdf5/hdf5_chunks.h"
#include "ckpt/interop/hdf5/hdf5_names.h"
#include "ckpt/interop/hdf5/hdf5_output.h"
#include "ckpt/interop/hdf5/hdf5_types.h"
#include "ckpt/interop/hdf5/hdf5_util.h"
#include "ckpt/ops/source_shards.h"
#include "ckpt/reader.h"

namespace ckpt::interop {
namespace {

using hdf5::Handle;
using hdf5::Hdf5Error;
using hdf5::Hdf5Lock;

// One slab of one tensor: loaded with one LoadRequest, written with one
// hyperslab.
struct SlabJob {
  size_t entry;  // index into the result's entries
  Box box;
  uint64_t bytes;
};

// The slabs of one tensor, one at a time: an odometer over its grid of
// slabs (one slab, the empty box, for a scalar). Holds one offset, never
// the list: a tensor's slab count is its declared size over the slab size.
class EntrySlabs {
 public:
  EntrySlabs(size_t entry, const Shape& shape, Dims slab, int elem_size)
      : entry_(entry),
        shape_(&shape),
        slab_(std::move(slab)),
        off_(shape.size(), 0),
        elem_size_(elem_size) {}

  // The next slab, or nullopt after the last.
  std::optional<SlabJob> Next() {
    if (done_) return std::nullopt;
    const Shape& shape = *shape_;
    const size_t n = shape.size();
    SlabJob job{entry_, Box{off_, Dims(n, 0)},
                static_cast<uint64_t>(elem_size_)};
    for (size_t d = 0; d < n; ++d) {
      job.box.size[d] = std::min(slab_[d], shape[d] - off_[d]);
      job.bytes *= job.box.size[d];
    }
    done_ = true;
    for (size_t d = n; d > 0 && done_;) {
      --d;
      off_[d] += slab_[d];
      if (off_[d] < shape[d])
        done_ = false;
      else
        off_[d] = 0;
    }
    return job;
  }

 private:
  size_t entry_;
  const Shape* shape_;
  Dims slab_, off_;
  int elem_size_;
  bool done_ = false;
};

std::string UserMetadataAttrName(const std::string& key) {
  if (key.rfind(hdf5::kReservedAttrPrefix, 0) == 0)
    return hdf5::kReservedAttrPrefix + key;
  return key;
}

absl::Status SyncAndRename(const std::string& tmp, const std::string& output) {
  int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    int err = errno;
    if (fd >= 0) ::close(fd);
    return absl::InternalError(
        absl::StrCat(tmp, ": fsync: ", std::strerror(err)));
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), output.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("renaming ", tmp, " to ", output,
                                            ": ", std::strerror(errno)));
  }
  std::string dir = std::filesystem::path(output).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

// Writes the HDF5 file `file_name` through the output driver
// (hdf5_output.h). Errors name `display_name` (the output the user asked
// for, not the temporary file), the dataset, and the errno text of a failed
// write. Each method takes the HDF5 lock itself; the destructor closes
// whatever is still open (after an error the rest of the writes are
// discarded, so the close cannot fail half way).
class FileWriter {
 public:
  FileWriter(std::string file_name, std::string display_name,
             const Hdf5ExportOptions& options)
      : file_name_(std::move(file_name)),
        display_name_(std::move(display_name)),
        options_(options) {}
  ~FileWriter() {
    Hdf5Lock lock;
    lcpl_.Reset();
    file_.Reset();
  }

  absl::Status Create() {
    Hdf5Lock lock;
    if (options_.compression == Hdf5Compression::kDeflate) {
      if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0 ||
          (options_.shuffle && H5Zfilter_avail(H5Z_FILTER_SHUFFLE) <= 0)) {
        return absl::FailedPreconditionError(
            "this HDF5 library has no deflate or shuffle filter; use "
            "--compression none");
      }
    }
    Handle fcpl(H5Pcreate(H5P_FILE_CREATE));
    Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
    // Metadata order survives (attribute creation order); no timestamps, so
    // the same checkpoint always gives the same file; the 1.8 file format
    // (read by every h5py) for attributes over 64 KiB (metadata values).
    if (!fcpl.valid() || !fapl.valid() ||
        H5Pset_attr_creation_order(
            fcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED) < 0 ||
        H5Pset_obj_track_times(fcpl.get(), false) < 0 ||
        H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST) <
            0) {
      return Error(display_name_);
    }
    CKPT_RETURN_IF_ERROR(hdf5::SetOutputDriver(fapl.get(), &state_));
    file_.Reset(
        H5Fcreate(file_name_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()));
    if (!file_.valid()) return Error(display_name_);
    lcpl_.Reset(H5Pcreate(H5P_LINK_CREATE));
    if (!lcpl_.valid() ||
        H5Pset_char_encoding(lcpl_.get(), H5T_CSET_UTF8) < 0) {
      return Error(display_name_);
    }
    return Written(display_name_);
  }

  absl::Status WriteRootAttributes(const format::Manifest& m) {
    Hdf5Lock lock;
    Handle root(H5Gopen2(file_.get(), "/", H5P_DEFAULT));
    if (!root.valid()) return Error(display_name_);
    const hid_t r = root.get();
    absl::Status s = hdf5::WriteStringAttribute(
        r, hdf5::kAttrFormatVersion,
        absl::StrCat(format::kFormatMajor, ".", m.minor_version));
    if (s.ok()) s = hdf5::WriteUInt64Attribute(r, hdf5::kAttrStep, m.info.step);
    if (s.ok())
      s = hdf5::WriteUInt32Attribute(r, hdf5::kAttrWorldSize,
                                     m.info.world_size);
    if (s.ok())
      s = hdf5::WriteStringAttribute(r, hdf5::kAttrCheckpointId,
                                     format::IdToHex(m.info.id));
    if (s.ok())
      s = hdf5::WriteInt64Attribute(r, hdf5::kAttrCreatedUnixNs,
                                    m.info.created_unix_ns);
    if (s.ok())
      s = hdf5::WriteStringAttribute(r, hdf5::kAttrWriter, m.info.writer);
    for (const auto& [k, v] : m.metadata) {
      if (!s.ok()) break;
      s = Annotate(hdf5::WriteStringAttribute(r, UserMetadataAttrName(k), v),
                   absl::StrCat("metadata key '", format::EscapeText(k), "'"));
    }
    CKPT_RETURN_IF_ERROR(
        Written(absl::StrCat(display_name_, ": root attributes")));
    return Annotate(s, display_name_);
  }

  // Creates the dataset of `e` (and the groups above it).
  absl::Status CreateDataset(const Hdf5ExportedEntry& e) {
    Hdf5Lock lock;
    const std::string where =
        absl::StrCat(display_name_, ": dataset '", format::EscapeText(e.path),
                     "' (entry '", format::EscapeText(e.name), "')");
    CKPT_RETURN_IF_ERROR(CreateGroupsOf(e.path, where));
    CKPT_ASSIGN_OR_RETURN(Handle type, hdf5::FileTypeFor(e.dtype));
    Handle space;
    if (e.kind == format::EntryKind::kTensor && e.shape.empty()) {
      space.Reset(H5Screate(H5S_SCALAR));
    } else {
      std::vector<hsize_t> dims(e.shape.begin(), e.shape.end());
      space.Reset(H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                   nullptr));
    }
    Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
    if (!space.valid() || !dcpl.valid() ||
        H5Pset_obj_track_times(dcpl.get(), false) < 0 ||
        H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0) {
      return Error(where);
    }
    if (!e.chunk.empty()) {
      std::vector<hsize_t> chunk(e.chunk.begin(), e.chunk.end());
      if (H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()),
                       chunk.data()) < 0 ||
          (options_.shuffle && DTypeSize(e.dtype) > 1 &&
           H5Pset_shuffle(dcpl.get()) < 0) ||
          H5Pset_deflate(dcpl.get(), static_cast<unsigned>(options_.level)) <
              0) {
        return Error(where);
      }
    }
    Handle ds(H5Dcreate2(file_.get(), e.path.c_str(), type.get(), space.get(),
                         lcpl_.get(), dcpl.get(), H5P_DEFAULT));
    if (!ds.valid()) return Error(where);
    absl::Status s;
    if (e.kind == format::EntryKind::kObject) {
      s = hdf5::WriteStringAttribute(ds.get(), hdf5::kKindAttr,
                                     hdf5::kKindObject);
    } else if (hdf5::StoredRaw(e.dtype)) {
      s = hdf5::WriteStringAttribute(ds.get(), hdf5::kDTypeAttr,
                                     DTypeName(e.dtype));
    }
    CKPT_RETURN_IF_ERROR(Written(where));
    return Annotate(s, absl::StrCat(display_name_, ": dataset '",
                                    format::EscapeText(e.path), "'"));
  }

  // Writes `data` (the ckpt bytes of `box`) into the dataset of `e`.
  absl::Status WriteBox(const Hdf5ExportedEntry& e, const Box& box,
                        const void* data) {
    Hdf5Lock lock;
    const std::string where =
        absl::StrCat(display_name_, ": writing dataset '",
                     format::EscapeText(e.path), "' at ", RegionToString(box));
    Handle ds(H5Dopen2(file_.get(), e.path.c_str(), H5P_DEFAULT));
    if (!ds.valid()) return Error(where);
    CKPT_ASSIGN_OR_RETURN(Handle type, hdf5::FileTypeFor(e.dtype));
    if (box.size.empty()) {
      if (H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) <
          0) {
        return Error(where);
      }
      return Written(where);
    }
    std::vector<hsize_t> start(box.offset.begin(), box.offset.end());
    std::vector<hsize_t> count(box.size.begin(), box.size.end());
    Handle fspace(H5Dget_space(ds.get()));
    Handle mspace(H5Screate_simple(static_cast<int>(count.size()), count.data(),
                                   nullptr));
    if (!fspace.valid() || !mspace.valid() ||
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr,
                            count.data(), nullptr) < 0 ||
        H5Dwrite(ds.get(), type.get(), mspace.get(), fspace.get(), H5P_DEFAULT,
                 data) < 0) {
      return Error(where);
    }
    return Written(where);
  }

  // Stores `chunks` (encoded for the filters of `e`'s dataset) as they are.
  absl::Status WriteChunks(const Hdf5ExportedEntry& e,
                           const hdf5::EncodedChunk* chunks, size_t count) {
    Hdf5Lock lock;
    Handle ds(H5Dopen2(file_.get(), e.path.c_str(), H5P_DEFAULT));
    if (!ds.valid())
      return Error(absl::StrCat(display_name_, ": dataset '",
                                format::EscapeText(e.path), "'"));
    for (size_t i = 0; i < count; ++i) {
      const hdf5::EncodedChunk& c = chunks[i];
      const std::string where = absl::StrCat(
          display_name_, ": writing the chunk of dataset '",
          format::EscapeText(e.path), "' at ", ShapeToString(c.offset));
      std::vector<hsize_t> offset(c.offset.begin(), c.offset.end());
      if (H5Dwrite_chunk(ds.get(), H5P_DEFAULT, 0, offset.data(),
                         c.bytes.size(), c.bytes.data()) < 0) {
        return Error(where);
      }
      CKPT_RETURN_IF_ERROR(Written(where));
    }
    return absl::OkStatus();
  }

  // Closes the file: OK only when every byte of it was written.
  absl::Status Close() {
    Hdf5Lock lock;
    lcpl_.Reset();
    if (!file_.valid()) return absl::OkStatus();
    const std::string where = absl::StrCat(display_name_, ": closing the file");
    if (H5Fclose(file_.Release()) < 0) return Error(where);
    return Written(where);
  }

 private:
  // Creates the groups above dataset `path` that do not exist yet,
  // outermost first. REQUIRES: the Hdf5Lock is held.
  absl::Status CreateGroupsOf(const std::string& path,
                              const std::string& where) {
    for (size_t pos = path.find('/', 1); pos != std::string::npos;
         pos = path.find('/', pos + 1)) {
      std::string group = path.substr(0, pos);
      if (!groups_.insert(group).second) continue;
      Handle gcpl(H5Pcreate(H5P_GROUP_CREATE));
      if (!gcpl.valid() || H5Pset_obj_track_times(gcpl.get(), false) < 0)
        return Error(where);
      Handle g(H5Gcreate2(file_.get(), group.c_str(), lcpl_.get(), gcpl.get(),
                          H5P_DEFAULT));
      if (!g.valid()) return Error(where);
    }
    return absl::OkStatus();
  }

  // OK unless a write of the file failed so far: then "WHERE: <errno
  // text>" (the driver hides write errors from HDF5, see hdf5_output.h).
  absl::Status Written(absl::string_view where) const {
    const int err = state_.error();
    if (err == 0) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(where, ": ", std::strerror(err)));
  }
  // The error of a failed HDF5 call: the failed write behind it, if any,
  // else HDF5's innermost message. REQUIRES: the Hdf5Lock is held.
  absl::Status Error(absl::string_view where) const {
    absl::Status hdf5 =
        Hdf5Error(absl::StatusCode::kInternal, where);  // clears the stack
    absl::Status io = Written(where);
    return io.ok() ? hdf5 : io;
  }

  const std::string file_name_;
  const std::string display_name_;
  const Hdf5ExportOptions& options_;
  hdf5::OutputState state_;  // outlives file_ (declared before it)
  Handle file_;
  Handle lcpl_;
  absl::flat_hash_set<std::string> groups_;
};

// Writes the loaded slabs `jobs[0, count)`, whose bytes follow each other
// from `data`: chunked datasets through EncodeChunks and H5Dwrite_chunk,
// the others (scalars; no compression) as hyperslabs.
absl::Status WriteBatch(FileWriter& w,
                        const std::vector<Hdf5ExportedEntry>& entries,
                        const SlabJob* jobs, size_t count, const char* data,
                        const Hdf5ExportOptions& options) {
  std::vector<hdf5::Slab> slabs;
  std::vector<size_t> slab_job;
  for (size_t j = 0; j < count; ++j) {
    const Hdf5ExportedEntry& e = entries[jobs[j].entry];
    if (e.chunk.empty()) {
      CKPT_RETURN_IF_ERROR(w.WriteBox(e, jobs[j].box, data));
    } else {
      slabs.push_back(
          {&e.shape, &e.chunk, DTypeSize(e.dtype), jobs[j].box, data});
      slab_job.push_back(j);
    }
    data += jobs[j].bytes;
  }
  if (slabs.empty()) return absl::OkStatus();
  hdf5::ChunkFilters filters;
  filters.shuffle = options.shuffle;
  filters.level = options.level;
  int threads = options.compress_threads;
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  CKPT_ASSIGN_OR_RETURN(std::vector<hdf5::EncodedChunk> chunks,
                        hdf5::EncodeChunks(slabs, filters, threads));
  for (size_t c = 0; c < chunks.size();) {
    size_t end = c;
    while (end < chunks.size() && chunks[end].slab == chunks[c].slab) ++end;
    CKPT_RETURN_IF_ERROR(w.WriteChunks(
        entries[jobs[slab_job[chunks[c].slab]].entry], &chunks[c], end - c));
    c = end;
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const Hdf5ExportOptions& o) {
  if (o.level < 0 || o.level > 9) {
    return absl::InvalidArgumentError(
        absl::StrCat("deflate level ", o.level, " is outside 0..9"));
  }
  if (o.chunk_bytes == 0 || o.slab_bytes < o.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slab size ", o.slab_bytes, " must be at least the chunk size ",
        o.chunk_bytes, " (> 0)"));
  }
  if (o.io_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("io_threads ", o.io_threads, " must be >= 1"));
  }
  return absl::OkStatus();
}

absl::Status CheckOutput(const std::string& output, bool overwrite) {
  std::error_code ec;
  auto st = std::filesystem::symlink_status(output, ec);
  if (!ec && std::filesystem::exists(st)) {
    if (std::filesystem::is_directory(st)) {
      return absl::FailedPreconditionError(
          absl::StrCat(output, ": is a directory"));
    }
    if (!overwrite) {
      return absl::AlreadyExistsError(
          absl::StrCat(output, ": already exists (use --force to replace it)"));
    }
  }
  std::filesystem::path parent = std::filesystem::path(output).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    return absl::NotFoundError(absl::StrCat(
        output, ": directory ", parent.string(), " does not exist"));
  }
  return absl::OkStatus();
}

// Plan: the result's header and one Hdf5ExportedEntry per manifest entry
// (dataset path, HDF5 chunk shape, bytes), in manifest order. No I/O.
// FailedPrecondition for a partial entry; the errors of DatasetPaths.
absl::StatusOr<Hdf5ExportResult> PlanExport(const Reader& reader,
                                            const std::string& output,
                                            const Hdf5ExportOptions& options) {
  const format::Manifest& m = reader.manifest();
  Hdf5ExportResult result;
  result.checkpoint_dir = reader.path();
  result.output = output;
  result.info = m.info;
  result.minor_version = m.minor_version;
  result.metadata_count = m.metadata.size();
  std::vector<std::string> names;
  for (const format::EntryRecord& e : m.entries) {
    if (e.flags & format::kEntryFlagPartial) {
      return absl::FailedPreconditionError(absl::StrCat(
          result.checkpoint_dir, ": entry '", format::EscapeText(e.name),
          "' is partial (its chunks need not cover the tensor); "
          "an HDF5 dataset needs every "
          "element"));
    }
    names.push_back(e.name);
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> paths,
                        hdf5::DatasetPaths(names));
  const bool compress = options.compression == Hdf5Compression::kDeflate;
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const format::EntryRecord& e = m.entries[i];
    Hdf5ExportedEntry x;
    x.name = e.name;
    x.kind = e.kind;
    x.dtype = e.kind == format::EntryKind::kObject ? DType::kUInt8 : e.dtype;
    x.shape = e.shape;
    x.path = paths[i];
    if (compress)
      x.chunk = ChunkShape(x.shape, DTypeSize(x.dtype), options.chunk_bytes);
    x.bytes = DTypeSize(x.dtype);
    for (uint64_t d : x.shape) x.bytes *= d;
    result.logical_bytes += x.bytes;
    result.entries.push_back(std::move(x));
  }
  return result;
}

// Creates an empty temporary file next to `output` ("OUT.tmp-PID-N") and
// returns its name. Not mkstemp: its 0600 would become the mode of the
// output; this file gets 0666 less the umask, like any file the user
// creates. InternalError naming both files on failure.
absl::StatusOr<std::string> CreateTempFile(const std::string& output) {
  for (int attempt = 0;; ++attempt) {
    std::string tmp = absl::StrCat(output, ".tmp-", getpid(), "-", attempt);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      ::close(fd);
      return tmp;
    }
    if (errno != EEXIST || attempt == 100) {
      return absl::InternalError(absl::StrCat(output,
                                              ": creating the temporary file ",
                                              tmp, ": ", std::strerror(errno)));
    }
  }
}

// Removes a file when destroyed, unless disarmed.
class RemoveOnFailure {
 public:
  explicit RemoveOnFailure(std::string path) : path_(std::move(path)) {}
  ~RemoveOnFailure() {
    if (armed_) ::unlink(path_.c_str());
  }
  void Disarm() { armed_ = false; }

 private:
  const std::string path_;
  bool armed_ = true;
};

// The most requests in one Reader::Load of an export (a batch of objects or
// of slabs): a request takes a few hundred bytes while it is planned and
// served, so a batch of many small entries takes a few MiB, whatever the
// number of entries.
constexpr size_t kBatchRequests = size_t{1} << 14;

// Reads the objects of `entries` from `first` on that make one batch
// (consecutive objects of at most `budget` bytes together, a larger one
// alone, and at most kBatchRequests) with one Reader::Load into `bytes`,
// in order. One ReadObject per object cost a Load (its planning and its
// threads) per object.
absl::Status LoadObjects(Reader& reader,
                         const std::vector<Hdf5ExportedEntry>& entries,
                         size_t first, uint64_t budget, int io_threads,
                         std::vector<std::string>* bytes) {
  std::vector<LoadRequest> reqs;
  uint64_t total = 0;
  for (size_t j = first; j < entries.size() && reqs.size() < kBatchRequests;
       ++j) {
    const Hdf5ExportedEntry& e = entries[j];
    if (e.kind != format::EntryKind::kObject) continue;
    if (!reqs.empty() && e.bytes > budget - std::min(budget, total)) break;
    total += e.bytes;
    LoadRequest r;
    r.name = e.name;
    reqs.push_back(std::move(r));
  }
  bytes->assign(reqs.size(), std::string());
  for (size_t k = 0; k < reqs.size(); ++k) reqs[k].object = &(*bytes)[k];
  LoadOptions lo;
  lo.allow_unrequested = true;
  lo.report_not_loaded = false;  // loaded batch by batch
  lo.io_threads = io_threads;
  return reader.Load(reqs, lo).status();
}

// Datasets and objects: creates the dataset of every entry and writes each
// object whole (read with `reader`, a batch of objects at a time:
// LoadObjects). Reports the objects' progress.
absl::Status CreateDatasets(FileWriter& w, Reader& reader,
                            const Hdf5ExportResult& result,
                            const Hdf5ExportOptions& options) {
  std::vector<std::string> objects;  // the batch read last
  size_t next = 0;                   // the next of them to write
  for (size_t i = 0; i < result.entries.size(); ++i) {
    const Hdf5ExportedEntry& e = result.entries[i];
    CKPT_RETURN_IF_ERROR(w.CreateDataset(e));
    if (e.kind == format::EntryKind::kObject) {
      if (next == objects.size()) {
        CKPT_RETURN_IF_ERROR(LoadObjects(reader, result.entries, i,
                                         options.slab_bytes, options.io_threads,
                                         &objects));
        next = 0;
      }
      const std::string bytes = std::move(objects[next++]);
      if (!bytes.empty()) {
        CKPT_RETURN_IF_ERROR(w.WriteBox(e, FullBox(e.shape), bytes.data()));
      }
      if (options.progress)
        options.progress(bytes.size(), result.logical_bytes);
    }
  }
  return absl::OkStatus();
}

// The slabs in which the tensors of an export are streamed, in entry
// order, in batches of consecutive slabs of at most `slab_bytes` together
// (a larger slab is alone in its batch) and at most kBatchRequests slabs,
// made as they are needed: memory for one batch, whatever size the tensors
// declare or how many there are.
class SlabBatches {
 public:
  SlabBatches(const Hdf5ExportResult& result, uint64_t slab_bytes)
      : result_(result), slab_bytes_(slab_bytes) {}

  // The next batch; empty after the last.
  std::vector<SlabJob> Next() {
    std::vector<SlabJob> batch;
    uint64_t bytes = 0;
    while (std::optional<SlabJob> slab = Peek()) {
      if (!batch.empty() && (slab->bytes > slab_bytes_ - bytes ||
                             batch.size() == kBatchRequests)) {
        break;
      }
      bytes += slab->bytes;
      batch.push_back(*std::move(slab));
      held_.reset();
      if (bytes >= slab_bytes_) break;
    }
    return batch;
  }

 private:
  // The next slab, kept in held_ until Next takes it; nullopt at the end.
  std::optional<SlabJob> Peek() {
    while (!held_) {
      if (current_) held_ = current_->Next();
      if (held_) break;
      if (!StartNextTensor()) return std::nullopt;
    }
    return held_;
  }

  // Moves current_ to the next entry with elements to write; false after
  // the last.
  bool StartNextTensor() {
    current_.reset();
    while (next_entry_ < result_.entries.size()) {
      const size_t i = next_entry_++;
      const Hdf5ExportedEntry& e = result_.entries[i];
      if (e.kind == format::EntryKind::kObject) continue;
      if (e.bytes == 0 && !e.shape.empty()) continue;  // no elements
      const int es = DTypeSize(e.dtype);
      current_.emplace(i, e.shape, SlabShape(e.shape, e.chunk, es, slab_bytes_),
                       es);
      return true;
    }
    return false;
  }

  const Hdf5ExportResult& result_;
  const uint64_t slab_bytes_;
  size_t next_entry_ = 0;
  std::optional<EntrySlabs> current_;
  std::optional<SlabJob> held_;
};

uint64_t BatchBytes(const std::vector<SlabJob>& batch) {
  uint64_t bytes = 0;
  for (const SlabJob& j : batch) bytes += j.bytes;
  return bytes;
}

// A buffer of at least `bytes`, reallocated only to grow.
struct LoadBuffer {
  std::unique_ptr<char[]> data;
  uint64_t size = 0;
  char* Fit(uint64_t bytes) {
    if (bytes > size) {
      data.reset();
      data.reset(new char[bytes]);
      size = bytes;
    }
    return data.get();
  }
};

// Loads the slabs of `batch` with one Reader::Load into `buffer`, one
// after the other.
absl::Status LoadBatch(Reader& reader, const Hdf5ExportResult& result,
                       const std::vector<SlabJob>& batch, char* buffer,
                       int io_threads) {
  std::vector<LoadRequest> reqs;
  for (const SlabJob& job : batch) {
    const Hdf5ExportedEntry& e = result.entries[job.entry];
    LoadRequest r;
    r.name = e.name;
    r.dtype = e.dtype;
    r.shape = e.shape;
    r.region = job.box;
    r.data = buffer;
    buffer += job.bytes;
    reqs.push_back(std::move(r));
  }
  LoadOptions lo;
  lo.allow_unrequested = true;
  lo.report_not_loaded = false;  // loaded slab batch by slab batch
  lo.io_threads = io_threads;
  return reader.Load(reqs, lo).status();
}

// Tensors: loads their slabs batch by batch (SlabBatches) and writes them,
// the next batch loading (on another thread, into the other of two
// buffers) while this one is written. Returns after the last write, or at
// the first error once no load is running.
absl::Status StreamTensors(FileWriter& w, Reader& reader,
                           const Hdf5ExportResult& result,
                           const Hdf5ExportOptions& options) {
  SlabBatches batches(result, options.slab_bytes);
  std::vector<SlabJob> batch[2];
  LoadBuffer buffers[2];
  auto start_load = [&](int i) {
    char* buffer = buffers[i].Fit(BatchBytes(batch[i]));
    return std::async(std::launch::async, [&, i, buffer] {
      return LoadBatch(reader, result, batch[i], buffer, options.io_threads);
    });
  };
  batch[0] = batches.Next();
  if (batch[0].empty()) return absl::OkStatus();
  std::future<absl::Status> next = start_load(0);
  for (int i = 0;; i ^= 1) {
    CKPT_RETURN_IF_ERROR(next.get());
    batch[i ^ 1] = batches.Next();
    if (!batch[i ^ 1].empty()) next = start_load(i ^ 1);
    absl::Status s =
        WriteBatch(w, result.entries, batch[i].data(), batch[i].size(),
                   buffers[i].data.get(), options);
    if (!s.ok()) {
      if (next.valid()) next.wait();
      return s;
    }
    for (const SlabJob& job : batch[i]) {
      if (options.progress) options.progress(job.bytes, result.logical_bytes);
    }
    if (batch[i ^ 1].empty()) return absl::OkStatus();
  }
}

// Writes the whole HDF5 file `tmp` (named `output` in messages): root
// attributes, datasets and objects, tensors; OK once it is closed with
// every byte written.
absl::Status WriteFile(const std::string& tmp, Reader& reader,
                       const Hdf5ExportResult& result,
                       const Hdf5ExportOptions& options) {
  FileWriter w(tmp, result.output, options);
  CKPT_RETURN_IF_ERROR(w.Create());
  CKPT_RETURN_IF_ERROR(w.WriteRootAttributes(reader.manifest()));
  CKPT_RETURN_IF_ERROR(CreateDatasets(w, reader, result, options));
  CKPT_RETURN_IF_ERROR(StreamTensors(w, reader, result, options));
  return w.Close();
}

}  // namespace

Dims ChunkShape(const Shape& shape, int elem_size, uint64_t target_bytes) {
  if (shape.empty()) return {};
  for (uint64_t d : shape) {
    if (d == 0) return {};
  }
  Dims chunk(shape.size(), 1);
  uint64_t budget = std::max<uint64_t>(1, target_bytes / elem_size);
  for (size_t i = shape.size(); i > 0; --i) {
    const size_t d = i - 1;
    if (shape[d] <= budget) {
      chunk[d] = shape[d];
      budget /= shape[d];
    } else {
      chunk[d] = budget;
      budget = 1;
    }
  }
  return chunk;
}

Dims SlabShape(const Shape& shape, const Dims& chunk, int elem_size,
               uint64_t max_bytes) {
  Dims slab(shape.size(), 1);
  uint64_t chunk_elements = 1;
  for (uint64_t c : chunk) chunk_elements *= c;
  const uint64_t budget =
      std::max<uint64_t>(chunk_elements, max_bytes / elem_size);
  uint64_t inner = 1;
  for (size_t i = shape.size(); i > 0; --i) {
    const size_t d = i - 1;
    if (shape[d] <= budget / inner) {
      slab[d] = shape[d];
      inner *= shape[d];
      continue;
    }
    const uint64_t c = chunk.empty() ? 1 : chunk[d];
    const uint64_t fit = budget / inner;
    slab[d] = std::min(shape[d], std::max<uint64_t>(1, fit / c) * c);
    break;
  }
  return slab;
}

absl::StatusOr<Hdf5ExportResult> ExportHdf5(const std::string& source,
                                            const std::string& output,
                                            const Hdf5ExportOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  Storage* storage =
      options.storage != nullptr ? options.storage : DefaultStorage();
  ReaderOptions ro;
  ro.io_threads = options.io_threads;
  ro.storage = storage;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader,
                        Reader::Open(source, ro));
  CKPT_RETURN_IF_ERROR(
      ops::CheckSourceShards(storage, reader->path(), reader->manifest()));
  CKPT_ASSIGN_OR_RETURN(Hdf5ExportResult result,
                        PlanExport(*reader, output, options));
  CKPT_RETURN_IF_ERROR(CheckOutput(output, options.overwrite));
  CKPT_ASSIGN_OR_RETURN(std::string tmp, CreateTempFile(output));
  RemoveOnFailure cleanup(tmp);
  CKPT_RETURN_IF_ERROR(WriteFile(tmp, *reader, result, options));
  CKPT_RETURN_IF_ERROR(SyncAndRename(tmp, output));
  cleanup.Disarm();
  std::error_code ec;
  result.file_bytes = std::filesystem::file_size(output, ec);
  return result;
}

}  // namespace ckpt::interop
