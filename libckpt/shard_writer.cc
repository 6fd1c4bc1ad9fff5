#include "libckpt/shard_writer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "format/block_codec.h"
#include "format/checksum.h"
#include "format/shard.h"
#include "format/status_macros.h"
#include "libckpt/thread_pool.h"

namespace ckpt::internal {
namespace {

using format::BlockRecord;
using format::ChunkRecord;
using format::Codec;

constexpr uint64_t kTaskBytes = 8ull << 20;   // unit of work per thread
constexpr uint64_t kWriteBytes = 2ull << 20;  // hash-then-write granule

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

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

uint64_t TaskStep(uint64_t bs) { return std::max(kTaskBytes / bs, uint64_t{1}) * bs; }

absl::Status StageIfDevice(const WriteItem& w, uint64_t offset, uint64_t n,
                           DeviceMemory* dm, ThreadScratch* s, const char** out) {
  if (w.staged != nullptr) {
    CKPT_ASSIGN_OR_RETURN(*out, w.staged->Acquire(offset, n));
    return absl::OkStatus();
  }
  if (w.source != nullptr) {
    if (s->stage.size() < n) s->stage.resize(n);
    CKPT_RETURN_IF_ERROR(Annotate((*w.source)(offset, s->stage.data(), n),
                                  absl::StrCat("entry '", w.item->name, "': source at byte ",
                                               offset)));
    *out = s->stage.data();
    return absl::OkStatus();
  }
  const char* src = static_cast<const char*>(w.data) + offset;
  if (w.memory == MemoryKind::kHost) {
    *out = src;
    return absl::OkStatus();
  }
  if (dm == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "entry '", w.item->name,
        "' lives in CUDA memory but Writer::Options::device_memory is not set"));
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

}  // namespace

uint64_t StagingSegmentBytes(const SaveOptions& options) {
  return TaskStep(options.block_size);
}

absl::StatusOr<ShardWriteResult> WriteShardFile(
    Storage* storage, const std::string& path, const format::ShardHeader& header,
    const format::CheckpointInfo& info, const format::Metadata& metadata,
    const std::vector<WriteItem>& items, const SaveOptions& options,
    DeviceMemory* device_memory) {
  OpenOptions oo;
  oo.direct = options.direct_io;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> file,
                        storage->Open(path, OpenMode::kCreateNew, oo));
  CKPT_RETURN_IF_ERROR(file->PWrite(0, format::EncodeShardHeader(header)));

  const uint64_t bs = options.block_size;
  const uint64_t align = std::max<uint64_t>(options.alignment, 1);
  std::vector<ChunkPlan> chunks;
  chunks.reserve(items.size());
  for (const WriteItem& w : items) {
    ChunkPlan c;
    c.w = &w;
    c.raw_bytes = RegionElements(w.item->region) * DTypeSize(w.item->dtype);
    c.rec.region = w.item->region;
    c.rec.shard = header.shard_id;
    c.rec.codec = options.codec;
    c.rec.block_size = bs;
    c.rec.blocks.resize(format::NumBlocks(c.raw_bytes, bs));
    chunks.push_back(std::move(c));
  }
  const int threads = EffectiveIoThreads(options.io_threads, options.direct_io);
  std::vector<ThreadScratch> scratch(threads);
  // Buffered writes to one file serialise on its inode lock in the kernel;
  // threads hash in parallel and take turns to write. Direct I/O keeps
  // several writes in flight. (std::mutex here and below: ThreadSanitizer
  // does not see Debian's uninstrumented absl::Mutex.)
  std::mutex write_mu;
  auto write = [&](uint64_t offset, absl::string_view bytes) {
    if (options.direct_io) return file->PWrite(offset, bytes);
    std::lock_guard<std::mutex> l(write_mu);
    return file->PWrite(offset, bytes);
  };
  uint64_t end = format::kShardHeaderSize;

  if (options.codec == Codec::kNone) {
    // Layout is known up front: payload offsets follow item order.
    struct Task {
      ChunkPlan* c;
      uint64_t begin, end;  // raw byte range, block aligned
    };
    std::vector<Task> tasks;
    for (ChunkPlan& c : chunks) {
      end = AlignUp(end, align);
      c.rec.data_offset = c.raw_bytes ? end : 0;
      c.rec.stored_length = c.raw_bytes;
      end += c.raw_bytes;
      uint64_t step = TaskStep(bs);
      for (uint64_t b = 0; b < c.raw_bytes; b += step) {
        tasks.push_back(Task{&c, b, std::min(c.raw_bytes, b + step)});
      }
    }
    CKPT_RETURN_IF_ERROR(ParallelFor(
        threads, tasks.size(), [&](int t, size_t i) -> absl::Status {
          const Task& task = tasks[i];
          ChunkPlan& c = *task.c;
          uint64_t granule = std::max(kWriteBytes / bs, uint64_t{1}) * bs;
          for (uint64_t off = task.begin; off < task.end; off += granule) {
            uint64_t n = std::min(granule, task.end - off);
            const char* src;
            CKPT_RETURN_IF_ERROR(StageIfDevice(*c.w, off, n, device_memory, &scratch[t], &src));
            for (uint64_t b = 0; b < n; b += bs) {
              uint64_t len = std::min(bs, n - b);
              c.rec.blocks[(off + b) / bs] = BlockRecord{len, format::Checksum(src + b, len)};
            }
            CKPT_RETURN_IF_ERROR(write(c.rec.data_offset + off, absl::string_view(src, n)));
            DoneWith(*c.w, off, n);
          }
          return absl::OkStatus();
        }));
  } else {
    // Stored sizes are known only after compression: each chunk is
    // compressed whole, then given the next aligned offset.
    std::mutex mu;  // guards `end`
    CKPT_RETURN_IF_ERROR(ParallelFor(
        threads, chunks.size(), [&](int t, size_t i) -> absl::Status {
          ChunkPlan& c = chunks[i];
          ThreadScratch& s = scratch[t];
          if (!s.encoder) s.encoder = std::make_unique<format::BlockEncoder>(options.zstd_level);
          std::string payload;
          std::string block;
          for (uint64_t off = 0; off < c.raw_bytes; off += bs) {
            uint64_t n = std::min(bs, c.raw_bytes - off);
            const char* src;
            CKPT_RETURN_IF_ERROR(StageIfDevice(*c.w, off, n, device_memory, &s, &src));
            CKPT_RETURN_IF_ERROR(s.encoder->EncodeZstd(absl::string_view(src, n), &block));
            DoneWith(*c.w, off, n);
            c.rec.blocks[off / bs] = BlockRecord{block.size(), format::Checksum(block)};
            payload += block;
          }
          c.rec.stored_length = payload.size();
          {
            std::lock_guard<std::mutex> l(mu);
            end = AlignUp(end, align);
            c.rec.data_offset = payload.empty() ? 0 : end;
            end += payload.size();
          }
          if (payload.empty()) return absl::OkStatus();
          return write(c.rec.data_offset, payload);
        }));
  }

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
  CKPT_RETURN_IF_ERROR(file->Sync());
  CKPT_RETURN_IF_ERROR(file->Close());
  return result;
}

}  // namespace ckpt::internal
