// Reader: opens a committed checkpoint and loads any region of any entry,
// whatever sharding it was saved with.
//
//   auto reader = ckpt::Reader::Open("/ckpt/run1").value();  // follows latest
//   std::vector<ckpt::LoadRequest> reqs;
//   reqs.push_back({"layers.0.w", ckpt::DType::kBFloat16, {4096, 4096},
//                   ckpt::Box{{0, rank * 2048}, {4096, 2048}}, ptr});
//   reqs.back().on_complete = [&] { RefreshLowPrecisionCopy(); };
//   ckpt::LoadReport report = reader->Load(reqs).value();
//
// Guarantees of a successful Load: every byte of every destination was
// written from the checkpoint, and every block read was verified against its
// checksum. On error the contents of destinations are unspecified.
//
// Thread safety: Load may be called from several threads at once; the
// Reader must outlive all calls. With ReaderOptions::communicator, Open and
// Load are collective (see there) and one Load runs at a time per rank.
//
// Cooperative loads. With a communicator, the ranks of a job read the
// checkpoint between them instead of each reading what it needs: each
// shard index the job needs, and each needed stored block, is read once per
// job, by one rank, which verifies it and delivers its bytes to every rank
// whose requests need them (how: docs/cooperative-load.md). Except where
// sharing would save less than 1% of the job's reads: when the stored
// chunks that two or more ranks need hold at most 1% of the stored bytes
// the job reads (counting each extra rank; e.g. a load in the layout of
// the save, whose only shared chunks are replicated scalars), every rank
// reads what it needs alone, after one collective, and the outcome is
// agreed by one more.
//  * Open is collective: rank 0 alone resolves `latest` and reads MANIFEST;
//    every rank decodes and checks the bytes as a single-rank Open does,
//    with the same errors.
//  * Load is collective: every rank first checks its own requests as a
//    single-rank Load does. Per rank, the guarantees of a single-rank Load
//    hold: strictness (LoadOptions), completeness, verification (by the
//    rank that read the block), on_complete once per destination. When the
//    ranks share one address space (Communicator::SharesAddressSpace) and
//    every rank's destinations are host memory, each rank's on_complete
//    callbacks run on the thread that called Load, once every rank's reads
//    succeeded.
//  * Memory: the bytes exchanged between ranks go in rounds of at most
//    LoadOptions::exchange_bytes_per_round bytes sent and received per rank.
//    With a communicator that SupportsDeviceMemory() (e.g. ckpt::gpu::
//    NcclCommunicator), bytes for device destinations may travel in device
//    buffers allocated with DeviceMemory::AllocateDevice, within a round's
//    bytes, and freed when the Load returns. Processes of one machine
//    exchange host bytes through POSIX shared memory instead
//    (LoadOptions::shared_memory_exchange): each rank maps a segment of
//    twice its largest round's sends (reserved in /dev/shm), unlinked as
//    soon as every rank has mapped it and unmapped when the Load returns.
//  * A failure on any rank (a bad request, a missing or corrupt shard, a
//    read error, a checksum mismatch) fails the Load on every rank with
//    the same code and message, "rank R of N: " followed by the failing
//    rank's message (the lowest failing rank's); every rank goes through
//    the same collectives, so none is left waiting.
#ifndef CKPT_READER_H_
#define CKPT_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/communicator.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"
#include "ckpt/types.h"

namespace ckpt {

// One destination: region `region` of entry `name` into `data`.
struct LoadRequest {
  std::string name;
  DType dtype = DType::kFloat32;  // must equal the stored dtype
  Shape shape;                    // global shape; must equal the stored one
  Region region;                  // any box or flat range of the tensor
  void* data = nullptr;           // region-sized buffer, not owned
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  // For an object entry: set `object` instead of the tensor fields; it
  // receives the bytes. Not owned.
  std::string* object = nullptr;
  // Called once, from an I/O thread, as soon as this destination is
  // completely written and verified (before Load returns; in a cooperative
  // load without exchange, see "Cooperative loads", from the calling thread
  // once all ranks' reads succeeded), so a trainer can
  // refresh derived copies (docs/FAILURE-MODES.md §1, §2). Not called on
  // failure.
  std::function<void()> on_complete;
};

struct LoadOptions {
  // Entries for which filter(name) is false are skipped on purpose: they
  // need not be requested and are reported as "excluded by filter".
  // Without a filter every entry of the checkpoint must be requested.
  std::function<bool(const std::string&)> filter;
  // Report unrequested entries instead of failing (for one rank of many
  // that loads only its own part, e.g. ckpt-synth verify).
  bool allow_unrequested = false;
  // LoadReport::not_loaded lists every entry excluded by the filter or not
  // requested. False leaves it empty, so that a Load of a few entries of a
  // checkpoint of many (a tool serving byte ranges, one object at a time)
  // costs nothing per entry it does not touch.
  bool report_not_loaded = true;
  int io_threads = 0;  // 0 = ReaderOptions::io_threads
  // Copies into device memory start only after this event completed (the
  // caller's work that still uses the destinations, recorded on its stream,
  // e.g. by ckpt::gpu::CudaDeviceMemory::RecordOn). Not owned; must stay
  // valid until Load returns. Null: no ordering.
  DeviceEvent* device_ready = nullptr;
  // Cooperative loads (ReaderOptions::communicator): the most bytes a rank
  // sends, and the most it receives, in one exchange round; a rank holds
  // about twice this in buffers, reused from round to round. A read (at
  // most 8 MiB) whose bytes for other ranks exceed it goes alone into a
  // round. Must be equal on every rank. Small rounds keep the buffers in
  // cache and cheap to allocate: with the shared-memory exchange below,
  // every rank faults in the pages of every segment it maps, twice a
  // round's bytes each. 16 MiB: a 1 GiB state saved on 4 processes and
  // loaded on 3 (2 cores, /dev/shm) took 0.37 s by column bands and 0.22 s
  // by row bands, 0.40 s and 0.25 s at 32 MiB; 8 MiB was no faster.
  uint64_t exchange_bytes_per_round = 16ull << 20;
  // Cooperative loads between processes: when every rank can map every
  // other rank's POSIX shared-memory segment (all on one machine, with
  // room in /dev/shm for twice a round's bytes per rank), host bytes are
  // exchanged through them, each receiver copying straight out of the
  // sender's buffer, instead of through Communicator::AllToAll (two more
  // copies of every byte). False on any rank: AllToAll on every rank.
  bool shared_memory_exchange = true;
  // Not OK: this rank's Load fails with this status without looking at
  // its requests. In a cooperative load the rank still takes part, and
  // every rank fails with it (see "Cooperative loads"): for a binding that
  // rejects a destination itself (e.g. a buffer of the wrong size) and
  // must not leave the other ranks waiting.
  absl::Status local_error;
};

struct LoadReport {
  uint64_t bytes_read = 0;    // stored bytes this rank read from files
  uint64_t bytes_loaded = 0;  // bytes written to destinations
  // Raw bytes of destinations received from other ranks (cooperative
  // loads; 0 otherwise).
  uint64_t bytes_received = 0;
  // Whether those bytes came through shared memory
  // (LoadOptions::shared_memory_exchange), not AllToAll.
  bool shared_memory_exchange = false;
  uint64_t blocks_verified = 0;
  std::vector<std::string> loaded;  // entry names, sorted, unique
  // (name, why), sorted by name (LoadOptions::report_not_loaded).
  std::vector<std::pair<std::string, std::string>> not_loaded;
};

struct ReaderOptions {
  Storage* storage = nullptr;  // not owned; null = POSIX
  // Not owned; for kCuda requests. Those are loaded through pinned buffers
  // (DeviceMemory::AllocateHost; two per I/O thread, made on first need and
  // kept for the Reader's lifetime), with the copies to the device
  // running while the next blocks are read.
  DeviceMemory* device_memory = nullptr;
  int io_threads = 4;
  bool direct_io = false;
  // Not owned; must outlive the Reader. Null: every rank reads alone.
  // Otherwise every rank of it must call Open (with the same path) and
  // then each Load collectively, in the same order (see "Cooperative
  // loads" above); ReadObject stays local to the calling rank.
  Communicator* communicator = nullptr;
  // Shard files kept open at once (at least 1): a shard's index is kept
  // once read, but its file is closed when this many others are open and
  // it is the least recently used idle one, and reopened when needed
  // again. Loads wait for a file to become idle when every one is in use
  // by an I/O thread. Opening fails with InvalidArgument for less than 1.
  int max_open_files = 64;
};

// Why views: the public Reader describes a checkpoint with the types below,
// not with the on-disk records of format/records.h. Those records follow
// the bytes of the format (block tables, data offsets, codec fields, flag
// bits) and change when it does; a trainer needs names, dtypes, shapes and
// where the pieces are, which stay the same across format versions. The
// records remain reachable through manifest() and Find() for the tools
// that work on the stored layout itself (ckpt-reshard, ckpt-convert,
// ckpt-synth) and for tests; code outside this repository should use the
// views.

// A tensor or object of the checkpoint, without copying it: valid as long
// as the Reader that returned it. Cheap to copy.
class EntryView {
 public:
  // For the library: a view of `e`, which must outlive it.
  explicit EntryView(const format::EntryRecord& e) : e_(&e) {}
  const std::string& name() const { return e_->name; }
  // An object is a byte string, loaded with LoadRequest::object; its
  // shape is {byte length} and its dtype uint8.
  bool is_object() const { return e_->kind == format::EntryKind::kObject; }
  DType dtype() const { return e_->dtype; }
  const Shape& shape() const { return e_->shape; }
  // Saved partially on purpose: the chunks need not cover the tensor.
  bool partial() const { return (e_->flags & format::kEntryFlagPartial) != 0; }
  // The stored pieces, in manifest order: which elements (a box or a flat
  // range of the global tensor), in which shard file (the writing rank),
  // and how many bytes they take there (after compression).
  size_t num_chunks() const { return e_->chunks.size(); }
  const Region& chunk_region(size_t i) const { return e_->chunks[i].region; }
  uint32_t chunk_shard(size_t i) const { return e_->chunks[i].shard; }
  uint64_t chunk_stored_bytes(size_t i) const {
    return e_->chunks[i].stored_length;
  }

 private:
  const format::EntryRecord* e_;
};

// What identifies and describes a checkpoint as a whole.
struct CheckpointDescription {
  uint64_t step = 0;
  uint32_t world_size = 0;  // ranks that saved it (= shard files)
  std::string id;           // 32 lower-case hex digits, unique per save
  int64_t created_unix_ns = 0;
  std::string writer;          // e.g. "ckpt 0.1.0"; informational
  std::string format_version;  // e.g. "1.0"
  std::vector<std::pair<std::string, std::string>> metadata;  // as saved
};

class Reader {
 public:
  // `path` is a checkpoint directory (holding MANIFEST) or a root, in which
  // case `latest` is followed. Reads and checks the manifest, including
  // coverage of every entry. NotFound if neither; DataLoss for corruption;
  // FailedPrecondition for a newer format version.
  static absl::StatusOr<std::unique_ptr<Reader>> Open(
      const std::string& path, const ReaderOptions& options = {});
  virtual ~Reader() = default;

  virtual const std::string& path() const = 0;  // the checkpoint directory
  virtual const CheckpointDescription& description() const = 0;
  // Every entry, in manifest order (sorted by name). O(entries) per call.
  virtual std::vector<EntryView> entries() const = 0;
  // The entry named `name`, or nullopt.
  virtual std::optional<EntryView> FindEntry(const std::string& name) const = 0;

  // The on-disk records (see "Why views" above): for tools that work on the
  // stored layout. They follow the format and may change with it.
  virtual const format::Manifest& manifest() const = 0;
  // nullptr if absent.
  virtual const format::EntryRecord* Find(const std::string& name) const = 0;

  // Serves all requests, reading only the blocks that intersect them, with
  // several threads. Fails before any I/O, naming the entry and both values,
  // for: a missing entry (NotFound), a dtype or global shape mismatch
  // (InvalidArgument), a region outside the tensor, an uncovered region
  // (DataLoss), an unrequested entry without a filter (FailedPrecondition).
  [[nodiscard]] virtual absl::StatusOr<LoadReport> Load(
      const std::vector<LoadRequest>& requests,
      const LoadOptions& options = {}) = 0;

  // Convenience: the bytes of object `name`. Never collective: this rank
  // reads it alone, with or without a communicator.
  [[nodiscard]] virtual absl::StatusOr<std::string> ReadObject(
      const std::string& name) = 0;
};

}  // namespace ckpt

#endif  // CKPT_READER_H_
