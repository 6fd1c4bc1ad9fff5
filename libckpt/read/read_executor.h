// The execution of a load's block reads (read_plan.h's BlockRead), shared
// by the single-rank and the cooperative loads (load/reader.cc,
// load/coop/): reading, verifying and decoding blocks and copying their raw
// bytes out to the destinations.
#ifndef CKPT_LIBCKPT_READ_READ_EXECUTOR_H_
#define CKPT_LIBCKPT_READ_READ_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "ckpt/format/block_codec.h"
#include "ckpt/format/records.h"
#include "ckpt/reader.h"
#include "read/read_plan.h"
#include "read/shard_file.h"
#include "read/shard_set.h"
#include "staging/load_stager.h"
#include "staging/staging_pool.h"

namespace ckpt::internal {

constexpr uint64_t kTaskBytes = 8ull << 20;     // largest read of one task
constexpr uint64_t kGranuleBytes = 1ull << 20;  // read-then-verify granule

// The requests of one Load after CheckRequest, objects turned into 1-d
// uint8 requests into their strings: a copy in `reqs`, or, for a
// single-rank load without object requests, the caller's own requests
// (`borrowed`, not copied: a LoadRequest is about 180 bytes, a 2^20-entry
// load's copy 190 MB). all() is the one to read; the cooperative load
// always copies (it appends requests of its own).
struct Prepared {
  std::vector<LoadRequest> reqs;
  const std::vector<LoadRequest>* borrowed = nullptr;
  std::vector<uint32_t> entry;  // manifest entry of each request
  const std::vector<LoadRequest>& all() const {
    return borrowed != nullptr ? *borrowed : reqs;
  }
};

// The state of one Load while its reads run on several threads. With a
// staging `pool` (device destinations), a read with device destinations
// goes through pinned buffers of its thread's LoadStager: the copies to
// the device of one granule run while the next is read, after `after` (the
// caller's event, may be null).
class ReadExecutor {
 public:
  ReadExecutor(const Prepared& p, DeviceMemory* dm, internal::StagingPool* pool,
               DeviceEvent* after, int threads)
      : reqs_(p.all()), dm_(dm), remaining_(p.all().size()), scratch_(threads) {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      const LoadRequest& r = reqs_[i];
      remaining_[i] = RegionElements(r.region) * DTypeSize(r.dtype);
    }
    if (pool == nullptr) return;
    for (Scratch& s : scratch_) {
      s.uploader = std::make_unique<internal::LoadStager>(
          pool, dm, after,
          [this](size_t request, uint64_t bytes) { Finish(request, bytes); });
    }
  }

  // Calls on_complete of the requests with nothing to load.
  void CompleteEmpty() {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (remaining_[i] == 0 && reqs_[i].on_complete) reqs_[i].on_complete();
    }
  }

  // Reads, verifies and copies out one read of the plan from `file`,
  // shard's open file; thread `t`.
  absl::Status Run(int t, const OpenShard& shard, File& file,
                   const format::EntryRecord& e, const BlockRead& read);

  // Bytes written to requests, counted towards their completion (and
  // on_complete called) by Flush or the destructor, once per request: a
  // column band is copied a row at a time, and an atomic update of the
  // request's count per row cost more than the row's copy (and contended
  // between threads). Holds the counts of a few requests at once; a new
  // one past those flushes them. One per thread; the bytes must be
  // written before they are added.
  class Tally {
   public:
    explicit Tally(ReadExecutor* run) : run_(run) {}
    Tally(const Tally&) = delete;
    Tally& operator=(const Tally&) = delete;
    ~Tally() { Flush(); }
    void Add(uint32_t request, uint64_t bytes);
    void Flush();

   private:
    static constexpr int kRequests = 8;
    ReadExecutor* run_;
    uint32_t request_[kRequests];
    uint64_t bytes_[kRequests];
    int used_ = 0;
  };

  // Writes `n` bytes that another rank read (a cooperative load) to bytes
  // [dst, dst + n) of request `request`'s destination (memcpy, or a
  // synchronous copy to device memory) and adds them to `tally`.
  // Thread-safe for disjoint destination bytes and a tally per thread.
  absl::Status Deliver(uint32_t request, uint64_t dst, const char* bytes,
                       uint64_t n, Tally* tally);

  // Counts `n` bytes that the caller wrote to request `request`'s
  // destination itself (a cooperative load's device-to-device copies,
  // load/coop/device_exchange.h) towards its completion, once they landed.
  void Delivered(uint32_t request, uint64_t n) { Finish(request, n); }

  // InternalError naming a request that was not completely written.
  absl::Status CheckAllWritten() const;
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t blocks_verified() const { return blocks_verified_; }

 private:
  struct Scratch {
    std::string stored, raw;
    format::BlockDecoder decoder;
    std::unique_ptr<internal::LoadStager> uploader;  // device destinations
  };
  bool IsDirect(const BlockRead& read) const;
  const Copy* TakesWhole(const BlockRead& read, uint64_t lo, uint64_t hi,
                         size_t cursor) const;
  bool ToDevice(const BlockRead& read) const;
  absl::Status ReadDirect(const OpenShard& shard, File& file,
                          const format::EntryRecord& e, const BlockRead& read);
  // Verifies blocks [b0, b1) of `read` from their stored bytes `stored`,
  // decoding them into `raw` when not null (a codec).
  absl::Status VerifyBlocks(Scratch& s, const OpenShard& shard,
                            const format::EntryRecord& e, const BlockRead& read,
                            uint64_t b0, uint64_t b1, const char* stored,
                            char* raw);
  absl::Status ReadGranule(Scratch& s, const OpenShard& shard, File& file,
                           const format::EntryRecord& e, const BlockRead& read,
                           uint64_t b0, uint64_t b1, size_t* cursor);
  // `uploader`: copies to device destinations go through it (raw is in
  // its pinned buffer); null: synchronous DeviceMemory::CopyFromHost.
  absl::Status CopyOut(const BlockRead& read, uint64_t lo, uint64_t hi,
                       const char* raw, size_t* cursor,
                       internal::LoadStager* uploader);
  void Finish(uint32_t request, uint64_t bytes);
  std::string Where(const OpenShard& shard, const format::EntryRecord& e,
                    const BlockRead& read, uint64_t b) const;

  const std::vector<LoadRequest>& reqs_;
  DeviceMemory* dm_;
  std::vector<std::atomic<uint64_t>> remaining_;
  std::vector<Scratch> scratch_;
  std::atomic<uint64_t> bytes_read_{0}, blocks_verified_{0};
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_READ_READ_EXECUTOR_H_
