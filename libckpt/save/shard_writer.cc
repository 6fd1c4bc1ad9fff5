#include "save/shard_writer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/format/block_codec.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/names.h"
#include "ckpt/format/shard.h"
#include "ckpt/format/status_macros.h"
#include "save/object_store_commit.h"
#include "util/align.h"
#include "util/mutex.h"
#include "util/parallel_for.h"

namespace ckpt::internal {
namespace {

using format::BlockRecord;
using format::ChunkRecord;
using format::Codec;

constexpr uint64_t kTaskBytes = 8ull << 20;   // unit of work per thread
constexpr uint64_t kWriteBytes = 2ull << 20;  // hash-then-write granule

struct ChunkPlan {
  const WriteItem* w;
  uint64_t raw_bytes;
  ChunkRecord rec;
};

// A per-thread host buffer, for staging device memory and compression.
struct ThreadScratch {
  std::string stage;
  std::unique_ptr<format::BlockEncoder> encoder;
};

absl::Status StageIfDevice(const WriteItem& w, uint64_t offset, uint64_t n,
                           DeviceMemory* dm, ThreadScratch* s,
                           const char** out) {
  if (w.staged != nullptr) {
    CKPT_ASSIGN_OR_RETURN(*out, w.staged->Acquire(offset, n));
    return absl::OkStatus();
  }
  if (w.source != nullptr) {
    if (s->stage.size() < n) s->stage.resize(n);
    CKPT_RETURN_IF_ERROR(Annotate(
        (*w.source)(offset, s->stage.data(), n),
        absl::StrCat("entry '", w.item->name, "': source at byte ", offset)));
    *out = s->stage.data();
    return absl::OkStatus();
  }
  const char* src = static_cast<const char*>(w.data) + offset;
  if (w.memory == MemoryKind::kHost) {
    *out = src;
    return absl::OkStatus();
  }
  if (dm == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("entry '", w.item->name,
                     "' lives in CUDA memory but "
                     "Writer::Options::device_memory is not set"));
  }
  if (s->stage.size() < n) s->stage.resize(n);
  CKPT_RETURN_IF_ERROR(dm->CopyToHost(s->stage.data(), src, n, w.device));
  *out = s->stage.data();
  return absl::OkStatus();
}

// Gives staged bytes back once they are written (no-op otherwise).
void DoneWith(const WriteItem& w, uint64_t offset, uint64_t n) {
  if (w.staged != nullptr) w.staged->Release(offset, n);
}

// A failed task leaves its staged bytes unreleased and later tasks are not
// started, so staging could wait forever for space that threads still
// waiting for staged bytes would free: stop it, failing those waits.
// A bool element is stored as 0x00 or 0x01 (spec/FORMAT.md §9) and a reader
// rejects any other byte, so a save of such bytes would commit a checkpoint
// that can never load: it fails here instead, naming the entry and element.
absl::Status CheckBoolSource(const WriteItem& w, uint64_t offset,
                             const char* src, uint64_t n) {
  if (w.item->dtype != DType::kBool) return absl::OkStatus();
  for (uint64_t i = 0; i < n; ++i) {
    const auto v = static_cast<unsigned char>(src[i]);
    if (v > 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "bool tensor '%s': element %d of this rank's region is 0x%02x, not "
          "0x00 or 0x01 (spec/FORMAT.md §9)",
          w.item->name, offset + i, v));
    }
  }
  return absl::OkStatus();
}

absl::Status StopStagingOnError(const WriteItem& w, absl::Status status) {
  if (!status.ok() && w.staged != nullptr) w.staged->Abort(status);
  return status;
}

// The chunk records of `items` in order, with block tables sized but not
// yet filled, and no offsets.
std::vector<ChunkPlan> PlanChunks(const std::vector<WriteItem>& items,
                                  uint32_t shard_id,
                                  const SaveOptions& options) {
  std::vector<ChunkPlan> chunks;
  chunks.reserve(items.size());
  for (const WriteItem& w : items) {
    ChunkPlan c;
    c.w = &w;
    c.raw_bytes = RegionElements(w.item->region) * DTypeSize(w.item->dtype);
    c.rec.region = w.item->region;
    c.rec.shard = shard_id;
    c.rec.codec = options.codec;
    c.rec.block_size = options.block_size;
    c.rec.blocks.resize(format::NumBlocks(c.raw_bytes, options.block_size));
    chunks.push_back(std::move(c));
  }
  return chunks;
}

// Writes the payloads of chunks into one open file with several threads,
// filling each chunk's block table, data_offset and stored_length.
class PayloadWriter {
 public:
  // `file` and `device_memory` (may be null) must outlive the writer.
  // `write_padding`: the alignment padding is written as zeros, not left
  // as holes (Storage::traits(path).sparse_files false).
  PayloadWriter(File* file, const SaveOptions& options,
                DeviceMemory* device_memory, bool write_padding)
      : file_(file),
        options_(options),
        device_memory_(device_memory),
        write_padding_(write_padding),
        threads_(EffectiveIoThreads(options.io_threads, options.direct_io)),
        scratch_(threads_) {}

  // Codec none: the layout is known up front, payload offsets follow chunk
  // order from `begin`; tasks of at most kTaskBytes run in parallel.
  // Returns the end of the last payload.
  absl::StatusOr<uint64_t> WriteRaw(std::vector<ChunkPlan>* chunks,
                                    uint64_t begin);
  // zstd: stored sizes are known only after compression, so each chunk is
  // compressed whole, then given the next aligned offset. Returns the end
  // of the last payload.
  absl::StatusOr<uint64_t> WriteCompressed(std::vector<ChunkPlan>* chunks,
                                           uint64_t begin);

 private:
  struct Task {
    ChunkPlan* c;
    uint64_t begin, end;  // raw byte range, block aligned
  };
  absl::Status WriteRawTask(int thread, const Task& task);
  absl::Status WriteCompressedChunk(int thread, ChunkPlan* c, uint64_t* end);
  uint64_t Align(uint64_t x) const {
    return AlignUp(x, std::max<uint64_t>(options_.alignment, 1));
  }
  // Zeros over [from, to) where padding is written.
  absl::Status Pad(uint64_t from, uint64_t to) {
    static const std::string* const kZeros = new std::string(1 << 20, '\0');
    for (; write_padding_ && from < to;) {
      const uint64_t n = std::min<uint64_t>(to - from, kZeros->size());
      CKPT_RETURN_IF_ERROR(Write(from, absl::string_view(kZeros->data(), n)));
      from += n;
    }
    return absl::OkStatus();
  }

  // Buffered writes to one file serialise on its inode lock in the kernel;
  // threads hash in parallel and take turns to write. Direct I/O keeps
  // several writes in flight.
  absl::Status Write(uint64_t offset, absl::string_view bytes) {
    if (options_.direct_io) return file_->PWrite(offset, bytes);
    MutexLock l(&write_mu_);
    return file_->PWrite(offset, bytes);
  }

  File* const file_;
  const SaveOptions& options_;
  DeviceMemory* const device_memory_;
  const bool write_padding_;
  const int threads_;
  std::vector<ThreadScratch> scratch_;  // one per thread
  Mutex write_mu_;
  Mutex end_mu_;  // guards the running end of WriteCompressed
};

absl::StatusOr<uint64_t> PayloadWriter::WriteRaw(std::vector<ChunkPlan>* chunks,
                                                 uint64_t begin) {
  const uint64_t bs = options_.block_size;
  const uint64_t step = std::max(kTaskBytes / bs, uint64_t{1}) * bs;
  uint64_t end = begin;
  std::vector<Task> tasks;
  for (ChunkPlan& c : *chunks) {
    CKPT_RETURN_IF_ERROR(Pad(end, Align(end)));
    end = Align(end);
    c.rec.data_offset = c.raw_bytes ? end : 0;
    c.rec.stored_length = c.raw_bytes;
    end += c.raw_bytes;
    for (uint64_t b = 0; b < c.raw_bytes; b += step) {
      tasks.push_back(Task{&c, b, std::min(c.raw_bytes, b + step)});
    }
  }
  CKPT_RETURN_IF_ERROR(
      ParallelFor(threads_, tasks.size(), [&](int t, size_t i) {
        return StopStagingOnError(*tasks[i].c->w, WriteRawTask(t, tasks[i]));
      }));
  return end;
}

absl::Status PayloadWriter::WriteRawTask(int thread, const Task& task) {
  ChunkPlan& c = *task.c;
  const uint64_t bs = options_.block_size;
  const uint64_t granule = std::max(kWriteBytes / bs, uint64_t{1}) * bs;
  for (uint64_t off = task.begin; off < task.end; off += granule) {
    uint64_t n = std::min(granule, task.end - off);
    const char* src;
    CKPT_RETURN_IF_ERROR(
        StageIfDevice(*c.w, off, n, device_memory_, &scratch_[thread], &src));
    CKPT_RETURN_IF_ERROR(CheckBoolSource(*c.w, off, src, n));
    for (uint64_t b = 0; b < n; b += bs) {
      uint64_t len = std::min(bs, n - b);
      c.rec.blocks[(off + b) / bs] =
          BlockRecord{len, format::Checksum(src + b, len)};
    }
    CKPT_RETURN_IF_ERROR(
        Write(c.rec.data_offset + off, absl::string_view(src, n)));
    DoneWith(*c.w, off, n);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PayloadWriter::WriteCompressed(
    std::vector<ChunkPlan>* chunks, uint64_t begin) {
  uint64_t end = begin;
  CKPT_RETURN_IF_ERROR(
      ParallelFor(threads_, chunks->size(), [&](int t, size_t i) {
        return StopStagingOnError(*(*chunks)[i].w,
                                  WriteCompressedChunk(t, &(*chunks)[i], &end));
      }));
  return end;
}

absl::Status PayloadWriter::WriteCompressedChunk(int thread, ChunkPlan* c,
                                                 uint64_t* end) {
  const uint64_t bs = options_.block_size;
  ThreadScratch& s = scratch_[thread];
  if (!s.encoder)
    s.encoder = std::make_unique<format::BlockEncoder>(options_.zstd_level);
  std::string payload;
  std::string block;
  for (uint64_t off = 0; off < c->raw_bytes; off += bs) {
    uint64_t n = std::min(bs, c->raw_bytes - off);
    const char* src;
    CKPT_RETURN_IF_ERROR(
        StageIfDevice(*c->w, off, n, device_memory_, &s, &src));
    CKPT_RETURN_IF_ERROR(CheckBoolSource(*c->w, off, src, n));
    CKPT_RETURN_IF_ERROR(
        s.encoder->EncodeZstd(absl::string_view(src, n), &block));
    DoneWith(*c->w, off, n);
    c->rec.blocks[off / bs] =
        BlockRecord{block.size(), format::Checksum(block)};
    payload += block;
  }
  c->rec.stored_length = payload.size();
  uint64_t pad_from;
  {
    MutexLock l(&end_mu_);
    pad_from = *end;
    *end = Align(*end);
    c->rec.data_offset = payload.empty() ? 0 : *end;
    *end += payload.size();
  }
  CKPT_RETURN_IF_ERROR(Pad(pad_from, Align(pad_from)));
  if (payload.empty()) return absl::OkStatus();
  return Write(c->rec.data_offset, payload);
}

// Writes index and tail after the payloads (which end at `end`), then
// fsyncs and closes `file`. Returns the shard's index and sizes.
absl::StatusOr<ShardWriteResult> FinishShard(File* file,
                                             std::vector<ChunkPlan> chunks,
                                             const format::CheckpointInfo& info,
                                             const format::Metadata& metadata,
                                             uint64_t end) {
  ShardWriteResult result;
  result.index.info = info;
  result.index.metadata = metadata;
  for (ChunkPlan& c : chunks) {
    result.stored_bytes += c.rec.stored_length;
    format::EntryRecord e;
    e.name = c.w->item->name;
    e.kind = c.w->item->kind;
    e.dtype = c.w->item->dtype;
    e.flags = c.w->item->partial ? format::kEntryFlagPartial : 0;
    e.shape = c.w->item->shape;
    e.chunks.push_back(std::move(c.rec));
    result.index.entries.push_back(std::move(e));
  }
  std::string index = format::EncodeShardIndex(result.index);
  format::ShardTail tail{end, index.size(), format::Checksum(index)};
  index += format::EncodeShardTail(tail);
  CKPT_RETURN_IF_ERROR(file->PWrite(end, index));
  result.file_size = end + index.size();
  CKPT_RETURN_IF_ERROR(file->Sync());  // F2 of spec/FORMAT.md §4.1
  CKPT_RETURN_IF_ERROR(file->Close());
  return result;
}

}  // namespace

uint64_t StagingSegmentBytes(const SaveOptions& options) {
  // Raw payloads are asked for in granules of whole blocks, inside tasks
  // that start at multiples of the granule; compressed ones block by block.
  const uint64_t bs = options.block_size;
  return std::max(kWriteBytes / bs, uint64_t{1}) * bs;
}

absl::StatusOr<ShardWriteResult> WriteShardFile(
    Storage* storage, const std::string& path,
    const format::ShardHeader& header, const format::CheckpointInfo& info,
    const format::Metadata& metadata, const std::vector<WriteItem>& items,
    const SaveOptions& options, DeviceMemory* device_memory) {
  OpenOptions oo;
  oo.direct = options.direct_io;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                        storage->Open(path, OpenMode::kCreateNew, oo));
  CKPT_RETURN_IF_ERROR(file->PWrite(0, format::EncodeShardHeader(header)));
  std::vector<ChunkPlan> chunks = PlanChunks(items, header.shard_id, options);
  PayloadWriter payloads(file.get(), options, device_memory,
                         !storage->traits(path).sparse_files);
  CKPT_ASSIGN_OR_RETURN(
      uint64_t end,
      options.codec == Codec::kNone
          ? payloads.WriteRaw(&chunks, format::kShardHeaderSize)
          : payloads.WriteCompressed(&chunks, format::kShardHeaderSize));
  return FinishShard(file.get(), std::move(chunks), info, metadata, end);
}

absl::StatusOr<ShardWriteResult> WriteRankShard(
    Storage* storage, const std::string& tmp_dir, uint32_t rank,
    const format::CheckpointInfo& info, const std::vector<WriteItem>& items,
    const SaveOptions& options, DeviceMemory* device_memory) {
  format::ShardHeader header;
  header.checkpoint_id = info.id;
  header.shard_id = rank;
  header.alignment = options.alignment;
  return WriteShardFile(
      storage,
      JoinPath(tmp_dir, ShardFileNameFor(*storage, tmp_dir, rank, info.id)),
      header, info, options.metadata, items, options, device_memory);
}

ShardReport ReportOf(ShardWriteResult written) {
  ShardReport report;
  report.file_size = written.file_size;
  report.entries = std::move(written.index.entries);
  for (auto& e : report.entries) {
    for (auto& c : e.chunks) c.blocks.clear();
  }
  return report;
}

}  // namespace ckpt::internal
