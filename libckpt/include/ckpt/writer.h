// Writer: what a trainer links to save checkpoints.
//
//   ckpt::Writer::Options wo;                  // single process by default
//   auto writer = ckpt::Writer::Create(wo).value();
//   writer->AddTensor("layers.0.w", ckpt::DType::kBFloat16, {4096, 4096},
//                     ckpt::Box{{rank * 1024, 0}, {1024, 4096}}, ptr);
//   writer->SetObject("rng", rng_state_bytes);
//   auto result = writer->Save("/ckpt/run1", step, ckpt::SaveOptions{});
//
// Registration stores pointers, not data: the memory behind every
// registered tensor must stay valid and unmodified for the duration of each
// Save (REQUIRES), or until SaveAsync returns. Objects are copied when set.
//
// A save is atomic (spec/FORMAT.md §4.1): it writes into a hidden temporary
// directory inside the root, fsyncs, writes the manifest last, renames the
// directory to step-NNNNNNNN, fsyncs the root and then replaces `latest`.
// Any failure leaves earlier checkpoints and `latest` untouched and removes
// the temporary directory. Once Save returns OK, its checkpoint, `latest`
// and its pruning survive a power loss (the fsyncs are listed in §4.1). With
// several ranks every rank calls Save with the same arguments; it returns the
// same status on every rank.
//
// Device tensors (TensorOptions::memory = kCuda) are copied into a bounded
// pool of pinned staging buffers while earlier pieces are hashed and
// written; SaveAsync (below) snapshots every tensor through that pool (or
// device tensors into spare device memory, SaveOptions::snapshot_to_device)
// and returns while the save goes on in the background.
//
// Thread safety: a Writer is used by one thread at a time.
#ifndef CKPT_WRITER_H_
#define CKPT_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/communicator.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/storage.h"
#include "ckpt/types.h"

namespace ckpt {

struct TensorOptions {
  // This rank's piece is a copy of data another rank also holds (data
  // parallelism). Replicas are written once; see the multi-rank planner.
  bool replica = false;
  // Where `data` lives. kCuda needs Writer::Options::device_memory.
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  // The ranks' pieces need not cover the whole tensor (e.g. a sparse
  // embedding saved in part). Without it a gap fails the save.
  bool partial = false;
};

// Produces bytes [offset, offset + n) of a registered piece, in the layout
// of its region, into `dst`. Called by Save from its I/O threads, possibly
// concurrently for disjoint ranges, at most once per byte per save, in
// pieces of at most a few MiB (block-aligned). An error fails the save.
using TensorSource =
    std::function<absl::Status(uint64_t offset, void* dst, uint64_t n)>;

struct SaveOptions {
  format::Codec codec = format::Codec::kNone;
  int zstd_level = 3;
  int io_threads = 4;  // >= 1
  uint64_t block_size =
      format::kDefaultBlockSize;                   // power of two, 4 KiB..1 GiB
  uint64_t alignment = format::kDefaultAlignment;  // power of two, 1..1 GiB
  bool direct_io = false;  // O_DIRECT for aligned payload writes
  bool overwrite = false;  // replace an existing checkpoint of this step
  int keep_last = 0;       // > 0: afterwards delete all but the newest K steps
  // With no plan in memory (the first save of a restarted job), reuse the
  // plan recorded in the root's latest checkpoint if every rank's structure
  // fingerprint equals the recorded one. Never affects what is saved.
  bool reuse_recorded_plan = true;
  std::vector<std::pair<std::string, std::string>> metadata;  // user key/values
  // Copies of device tensors start only after this event completed: the
  // caller records it on its stream after the kernels that produce the
  // tensors (ckpt::gpu::CudaDeviceMemory::RecordOn). Not owned; must stay
  // valid until Save returns, or until SaveAsync returns. Null: the
  // tensors are ready when the save is called.
  DeviceEvent* device_ready = nullptr;
  // SaveAsync (and Save) with a save still in flight (not yet Done()):
  // false waits for it (its Wait()), true fails fast with
  // FailedPrecondition. With several ranks the decision is collective
  // (one small all-reduce on Options::comm when fail_if_busy is set): if
  // the save is still in flight on any rank, the call fails on every rank,
  // and the save in flight goes on (its handle's Wait() as before). Every
  // rank passes the same value.
  bool fail_if_busy = false;
  // SaveAsync snapshots device tensors into spare device memory
  // (Writer::Options::device_snapshot_bytes per device; a device-to-device
  // copy, ordered after device_ready) and returns once those copies are
  // complete; their copies to host staging memory and their writes follow
  // in the background. Tensors that do not fit, and every tensor where the
  // DeviceMemory has no device memory to give (DeviceMemory::
  // AllocateDevice), are copied to host staging memory before SaveAsync
  // returns, as without this option. Ignored by Save.
  bool snapshot_to_device = false;
  // Threads that copy host bytes into staging memory for SaveAsync's
  // snapshot (the caller's thread and short-lived helpers); 0:
  // DefaultSnapshotThreads().
  int snapshot_threads = 0;
};

// Half the cores (std::thread::hardware_concurrency), at least 1 and at
// most 4: the snapshot's copies are bound by memory bandwidth, which a few
// threads saturate, and the other cores are left to the trainer and, with
// a state larger than the staging cap, to the writes that overlap the
// snapshot.
int DefaultSnapshotThreads();

struct SaveResult {
  std::string path;                 // the committed checkpoint directory
  uint64_t logical_bytes = 0;       // unique tensor and object bytes saved
  uint64_t stored_bytes = 0;        // payload bytes written by all ranks
  uint64_t local_stored_bytes = 0;  // payload bytes written by this rank
  // Staging (device tensors; every tensor of SaveAsync). stall_seconds:
  // how long SaveAsync blocked its caller (plan, prepare and snapshot);
  // peak_staging_bytes: the most staging memory this rank's save held at
  // once (<= staging_cap_bytes, Writer::Options::staging_bytes).
  double stall_seconds = 0;
  uint64_t peak_staging_bytes = 0;
  uint64_t staging_cap_bytes = 0;
  // SaveAsync with snapshot_to_device: bytes this rank's snapshot copied
  // into device memory (the rest went to host staging memory at once).
  uint64_t device_snapshot_bytes = 0;
  // SaveAsync: the part of stall_seconds spent taking the snapshot (the
  // device snapshot's copies, the staging set up, the copies to staging
  // memory before it returns, its background started); the rest of the
  // stall is plan_seconds and preparing the step's temporary directory.
  double snapshot_seconds = 0;

  bool plan_cache_hit =
      false;                  // the save reused a plan (see Writer: plan cache)
  double plan_seconds = 0;    // agreeing on (or making) the save plan
  double write_seconds = 0;   // writing and fsyncing this rank's shard
  double commit_seconds = 0;  // waiting for all ranks, manifest, rename, latest
};

namespace internal {
class AsyncSave;
}  // namespace internal

// The handle of one Writer::SaveAsync. A movable value; copies share the
// save. Wait() and Done() are called from the trainer's thread (the thread
// that uses the Writer).
class SaveHandle {
 public:
  SaveHandle() = default;  // empty: Wait() is FailedPrecondition
  explicit SaveHandle(std::shared_ptr<internal::AsyncSave> save)
      : save_(std::move(save)) {}

  // Blocks until the save is committed (durable: files, manifest,
  // directory and `latest` fsynced) or failed, and returns its result, the
  // same on every rank. Idempotent: later calls return the same. Without
  // Writer::Options::background_comm in a multi-rank job this runs the
  // commit's collectives, so every rank must call it (or the next save,
  // or destroy its Writer, which call it).
  absl::StatusOr<SaveResult> Wait();
  // True when Wait() would not block on I/O or another rank (it may still
  // run the commit's collectives, see Wait).
  bool Done() const;
  bool valid() const { return save_ != nullptr; }

 private:
  std::shared_ptr<internal::AsyncSave> save_;
};

class Writer {
 public:
  struct Options {
    Communicator* comm = nullptr;           // not owned; null = single process
    Storage* storage = nullptr;             // not owned; null = POSIX
    DeviceMemory* device_memory = nullptr;  // not owned; for kCuda tensors
    // A communicator of the same ranks, in the same order, that the trainer
    // dedicates to the background of SaveAsync (not owned; null: none).
    // With it the commit of an asynchronous save runs in the background;
    // without it (and with more than one rank) the commit's collectives run
    // on the trainer's thread inside SaveHandle::Wait(), so that `comm` is
    // never used by two threads at once. The background never calls `comm`.
    Communicator* background_comm = nullptr;
    // Cap of the staging memory (pinned when device_memory is set), in
    // buffers of staging_buffer_bytes. When memory is committed: the first
    // SaveAsync allocates and faults in min(cap, the bytes this rank
    // writes) before its copies start (so that first call's stall includes
    // the allocation; later ones find the memory ready); a synchronous Save
    // of device tensors takes a few buffers. Buffers are kept for the
    // Writer's lifetime and reused by every save (the pool grows if a later
    // save writes more, never past the cap), and freed only when the Writer
    // is destroyed. A SaveAsync of more than the cap blocks until the rest
    // is staged as written buffers free up. The cap is at least one buffer;
    // a buffer is at least one write granule (2 MiB or a block, whichever
    // is larger).
    uint64_t staging_bytes = 4ull << 30;
    uint64_t staging_buffer_bytes = 64ull << 20;  // rounded up to 4096
    // Device memory, per device, that SaveAsync may snapshot device tensors
    // into (SaveOptions::snapshot_to_device): allocated through
    // device_memory->AllocateDevice at the first such save, kept for the
    // Writer's lifetime and reused (one save in flight), freed when the
    // Writer is destroyed. 0: none.
    uint64_t device_snapshot_bytes = 0;
    // The background of SaveAsync (its writing threads, and the commit when
    // it runs there) runs this many nice levels below the trainer's thread
    // (Linux setpriority of those threads; best effort, at most 19): while
    // the snapshot is taken, and while the trainer computes afterwards, the
    // trainer's threads win the CPU. Where the CPU is otherwise idle it
    // changes nothing. 0: the background runs at the trainer's priority.
    int background_nice = 10;
  };

  // Pointers in `options` must outlive the Writer.
  static absl::StatusOr<std::unique_ptr<Writer>> Create(const Options& options);
  virtual ~Writer() = default;

  // Registers this rank's piece `local` of tensor `name` (global `shape`,
  // element type `dtype`). `data` holds the piece in the layout of `local`
  // (box-local row-major, or the flat range in order). InvalidArgument for a
  // bad name, a region outside `shape`, or a null `data` with a non-empty
  // region; AlreadyExists if `name` is registered on this rank already.
  [[nodiscard]] virtual absl::Status AddTensor(
      const std::string& name, DType dtype, const Shape& shape,
      const Region& local, const void* data,
      const TensorOptions& options = {}) = 0;
  // As AddTensor, but the piece's bytes come from `source` during each Save
  // instead of from memory: for data larger than RAM or produced on demand
  // (ckpt-reshard streams a checkpoint this way). options.memory is ignored.
  // With zstd a chunk's compressed bytes are held in memory while it is
  // written.
  [[nodiscard]] virtual absl::Status AddTensorSource(
      const std::string& name, DType dtype, const Shape& shape,
      const Region& local, TensorSource source,
      const TensorOptions& options = {}) = 0;
  // Adds or replaces an opaque object (RNG state, data-loader position...).
  // An object name is saved by exactly one rank.
  [[nodiscard]] virtual absl::Status SetObject(const std::string& name,
                                               std::string bytes) = 0;
  // NotFound if nothing is registered under `name`.
  [[nodiscard]] virtual absl::Status Remove(const std::string& name) = 0;
  virtual void Clear() = 0;

  // Saves everything registered (on every rank) as checkpoint `step` under
  // `root` (created if missing; its parent must exist). AlreadyExists if the
  // step is committed and !options.overwrite; InvalidArgument for
  // inconsistent registrations (naming the entry and ranks); storage errors
  // as returned by Storage, naming the file.
  [[nodiscard]] virtual absl::StatusOr<SaveResult> Save(
      const std::string& root, uint64_t step, const SaveOptions& options) = 0;

  // As Save, but returns as soon as a consistent snapshot of everything
  // this rank writes (host and device tensors, sources, objects) is in
  // staging memory (or, with SaveOptions::snapshot_to_device, device
  // tensors in the Writer's device snapshot memory): afterwards the caller
  // may modify, free or re-register its buffers, and the checkpoint still
  // holds the values at the call. Writing, fsyncs and the commit continue
  // in the background (Options::background_nice) with Save's atomicity:
  // until SaveHandle::Wait() reports success nothing of this step is
  // visible, and a crash leaves earlier checkpoints intact.
  //
  // Collective like Save (plan and prepare run on the caller's thread with
  // Options::comm). Memory: the snapshot goes into the staging pool
  // (Options::staging_bytes; the first call commits the pool's memory, see
  // there), copied by SaveOptions::snapshot_threads threads; the shard's
  // writer starts once the snapshot is staged, so that the copies do not
  // share the cores with it. A larger state than the pool's cap starts the
  // writer as soon as the snapshot needs a buffer only the writer can free,
  // and keeps this call blocked until the rest has been staged as written
  // buffers free up (SaveResult::stall_seconds, peak_staging_bytes). One save
  // is in flight per Writer: a new Save or SaveAsync first waits for the
  // previous one (or fails fast, SaveOptions::fail_if_busy); destroying the
  // Writer waits for it. Errors before the snapshot (bad options, plan, an
  // existing step) are returned here; errors after it (ENOSPC, EIO, a failing
  // rank or device copy) by Wait() on every rank, with nothing committed.
  [[nodiscard]] virtual absl::StatusOr<SaveHandle> SaveAsync(
      const std::string& root, uint64_t step, const SaveOptions& options) = 0;
};

}  // namespace ckpt

#endif  // CKPT_WRITER_H_
