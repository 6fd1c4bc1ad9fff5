// The shard files of one checkpoint as a Reader uses them: each opened and
// checked against the manifest on first use (or adopted from the bytes
// another rank read), and kept, with its index matched to the manifest's
// chunks, for the set's lifetime; the open files among at most
// max_open_files (shard_handles.h).
#ifndef CKPT_LIBCKPT_READ_SHARD_SET_H_
#define CKPT_LIBCKPT_READ_SHARD_SET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"
#include "read/index_check.h"
#include "read/shard_file.h"
#include "read/shard_handles.h"
#include "util/mutex.h"

namespace ckpt::internal {

// A shard file opened and checked against the manifest. Its file handle
// (file.file) is null: the ShardSet's ShardHandles hold the open files.
struct OpenShard {
  std::string path;
  internal::ShardFile file;
  // (entry << 32 | chunk) of a manifest chunk -> its index record.
  absl::flat_hash_map<uint64_t, const format::ChunkRecord*> indexed;
};

inline uint64_t ChunkKey(uint32_t entry, uint32_t chunk) {
  return uint64_t{entry} << 32 | chunk;
}

// Thread-safe. Errors name the shard file (DataLoss for a shard that does
// not check, the storage's errors as they are).
class ShardSet {
 public:
  // The shards of checkpoint directory `dir`, whose manifest `index` is
  // over; `storage` and `index` must outlive the set. `direct_io`: open
  // the files for direct I/O (ReaderOptions::direct_io).
  ShardSet(Storage* storage, std::string dir, const ManifestIndex& index,
           bool direct_io, int max_open_files);
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  // Shard `id`, opened and checked on first use, or adopted (Adopt), in
  // which case it has no file.
  absl::StatusOr<const OpenShard*> Get(uint32_t id);
  // The use of shard `id`'s file (opened, as Get does, if need be): hold
  // it for the reads only.
  absl::StatusOr<ShardHandles::Lease> GetForReading(uint32_t id);
  // Get of every shard of `ids` on `threads` threads; the first error.
  absl::Status Open(const std::vector<uint32_t>& ids, int threads);
  // Decodes and checks shard `id` from the bytes another rank read
  // (DecodeShardMeta, then the index against the manifest), unless it is
  // open already.
  absl::Status Adopt(uint32_t id, ShardMetaBytes meta);
  // §5.7: an entry of `entries` (manifest entry indexes) with no chunk in
  // the manifest must be listed by some shard index; this opens every
  // shard (only when there is such an entry). DataLoss naming the
  // checkpoint and the entry.
  absl::Status CheckChunkless(const std::vector<uint32_t>& entries,
                              int threads);

 private:
  // Opens the file in a slot of handles_, where it stays when it checks.
  absl::StatusOr<std::unique_ptr<OpenShard>> OpenAndCheck(uint32_t id);
  // The checks after the shard file decoded: its index against the
  // manifest; fills s->indexed.
  absl::Status CheckIndex(uint32_t id, OpenShard* s) const;
  OpenOptions FileOptions() const;

  Storage* const storage_;
  const std::string dir_;
  const ManifestIndex& index_;
  const bool direct_io_;
  absl::flat_hash_map<uint32_t, const format::ShardInfo*> shard_info_;
  Mutex mu_;
  // Every shard opened or adopted; their open files are in handles_.
  std::map<uint32_t, std::unique_ptr<OpenShard>> shards_ ABSL_GUARDED_BY(mu_);
  ShardHandles handles_;
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_READ_SHARD_SET_H_
