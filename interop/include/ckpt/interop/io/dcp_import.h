// ckpt-convert DIR DST --from dcp: converts a PyTorch DCP (or Megatron
// torch_dist) directory into a ckpt checkpoint that keeps its sharding
// (tools/README.md (ckpt-convert)).
//
// The checkpoint has the DCP's world size (1 + the highest rank in the
// data file names "__<rank>_<n>.distcp"); every chunk becomes a box chunk
// written by the rank whose file holds it, so ckpt-reshard and the other
// tools see the DCP layout. Bytes items become objects holding their
// stored bytes (torch.save records) unchanged; Megatron's common.pt
// becomes the object "common.pt" and metadata.json the user metadata key
// "megatron.metadata.json". A Megatron ShardedObject, stored as the bytes
// item "<key>/shard_<offset>_<shape>", becomes the object "<key>" (one
// shard) or "<key>:shard_<offset>_<shape>" (interop::
// MegatronShardedObjectName), and the user metadata key
// "megatron.sharded_objects" maps each such object name to its DCP name
// (a JSON object). The DCP version and module go into user
// metadata ("dcp.version", "dcp.module", "dcp.checkpoint_id", and
// "dcp.rank_local_metadata": the number of rank-local metadata files, for a
// checkpoint saved with use_collectives=False). A chunk or bytes item that
// several ranks wrote (rank-local metadata) is converted once, as written
// by the lowest of them. Each chunk's record is read and
// checked when the writer first asks for its bytes and released when they
// have all been written, so memory is bounded by the largest chunks in
// flight, not the checkpoint.
#ifndef CKPT_INTEROP_IO_DCP_IMPORT_H_
#define CKPT_INTEROP_IO_DCP_IMPORT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"

namespace ckpt::interop {

struct DcpImportOptions {
  std::optional<uint64_t> step;  // default 0
  bool overwrite = false;
  format::Codec codec = format::Codec::kNone;
  int io_threads = 4;
  Storage* storage =
      nullptr;  // of the checkpoint root; not owned; null = POSIX
  std::function<void(uint64_t bytes, uint64_t total)>
      progress;  // any thread, serialized
};

struct DcpImportedEntry {
  std::string name;
  bool object = false;
  DType dtype = DType::kUInt8;
  Shape shape;
  size_t chunks = 0;
  uint64_t bytes = 0;
};

struct DcpImportResult {
  std::string input;
  std::string format;  // "PyTorch DCP" or "Megatron torch_dist"
  std::string module;  // the metadata classes' module
  std::string checkpoint;
  uint64_t step = 0;
  int world_size = 1;
  std::vector<DcpImportedEntry> entries;  // sorted by name
  size_t metadata_keys = 0;
  uint64_t logical_bytes = 0;
};

struct DcpInput;  // dcp_reader.h

// Errors: those of OpenDcp and ReadDcpChunk; the first of
// EntryNameProblems (a name ckpt cannot hold, FailedPrecondition naming the
// metadata file and the item), found before anything is written;
// AlreadyExists if the step exists and !overwrite; the Writer's errors.
// The ranks of the conversion run as threads: an error of any rank (say,
// rank 0's reading a bytes item) is returned by every rank, so the call
// returns it and never waits for a rank that gave up.
absl::StatusOr<DcpImportResult> ImportDcp(const std::string& dir,
                                          const std::string& root,
                                          const DcpImportOptions& options);

// The same, of a DCP input already opened (OpenDcp), which must outlive
// the call.
absl::StatusOr<DcpImportResult> ImportOpenedDcp(
    const DcpInput& in, const std::string& root,
    const DcpImportOptions& options);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_IO_DCP_IMPORT_H_
