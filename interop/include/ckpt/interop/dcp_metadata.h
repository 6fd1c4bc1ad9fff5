// PyTorch Distributed Checkpoint (DCP) metadata and torch.save tensor
// records, decoded from the plain data of the restricted unpickler
// (pickle.h). Pure: bytes in, structs out.
//
// A DCP directory holds ".metadata" (a pickle of
// torch.distributed.checkpoint.metadata.Metadata, or of
// torch.distributed._shard.checkpoint.metadata.Metadata before PyTorch 2.0)
// and data files ("__<rank>_<n>.distcp"). The metadata lists every tensor
// (dtype, global size, chunks as offsets and sizes) and every bytes item,
// and maps each chunk (MetadataIndex: fqn and offsets) to a byte range of
// a data file (_StorageInfo: relative_path, offset, length). Each range is
// one torch.save record (a zip archive: torch_zip.h): the chunk as a tensor,
// or, for a bytes item, the item's object.
//
// PyTorch 2.x's save(use_collectives=False) writes no ".metadata": each rank
// r writes "__<r>.metadata", a Metadata of only what it wrote (its chunks
// with the tensors' global sizes, its own copy of every replicated tensor
// and bytes item). MergeRankLocalDcpMetadata makes them one.
#ifndef CKPT_INTEROP_DCP_METADATA_H_
#define CKPT_INTEROP_DCP_METADATA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckpt/format/dtype.h"
#include "ckpt/format/geometry.h"
#include "ckpt/interop/pickle.h"

namespace ckpt::interop {

struct DcpChunk {
  Dims offsets, sizes;
};

struct DcpTensor {
  std::string fqn;
  std::string dtype_name;  // "torch.float32"
  DType dtype = DType::kFloat32;
  Shape size;
  std::vector<DcpChunk> chunks;
};

// Where one chunk (or bytes item) is stored.
struct DcpStorage {
  std::string fqn;
  std::optional<Dims> offsets;  // the chunk's offsets; none for bytes items
  std::string relative_path;    // a data file of the directory
  uint64_t offset = 0, length = 0;
  std::vector<std::string> transform_descriptors;  // PyTorch >= 2.6
};

struct DcpMetadata {
  std::string module;  // where the classes came from (see pickle.h IsDcpClass)
  // 0 for a global ".metadata"; N when merged from the rank-local
  // "__0.metadata" .. "__<N-1>.metadata".
  int rank_local_files = 0;
  std::string version;  // Metadata.version ("" before PyTorch 2.4)
  bool has_storage_meta = false;
  std::string checkpoint_id;  // StorageMeta.checkpoint_id, if any
  bool has_planner_data = false;
  // Metadata.all_local_plans, which Megatron-Core (>= 0.12) sets: the number
  // of SavePlans it holds (one per rank). Not read further: every chunk and
  // item is in state_dict_metadata and storage_data. None when the field is
  // absent or None.
  std::optional<size_t> all_local_plans;
  std::vector<DcpTensor> tensors;        // sorted by fqn
  std::vector<std::string> bytes_items;  // sorted
  std::vector<DcpStorage> storage;       // sorted by fqn, then offsets
};

// Decodes `.metadata`. Errors: those of Unpickle (a global off the
// allow-list names it); DataLoss naming the field for a structure that is
// not DCP metadata (all_local_plans included: a list of SavePlan, or None);
// FailedPrecondition naming the tensor for a dtype ckpt
// has no type for (complex), and for a file name in storage_data that
// is not a plain name inside the directory.
absl::StatusOr<DcpMetadata> DecodeDcpMetadata(absl::string_view pickle_bytes);

// Megatron-Core's torch_dist strategy stores a ShardedObject as the bytes
// item "<key>/shard_<offset>_<shape>" (ShardedObject.unique_key: offset and
// shape are '.'-joined non-negative integers, e.g. "extra.note/shard_0_1",
// "rng_state/shard_0.1_1.2"; offset may have one more integer than shape,
// Megatron's legacy form). A ckpt entry name holds no '/', so the item's
// ckpt name is "<key>" for an object of one shard (shape all 1s, offset all
// 0s), else "<key>:shard_<offset>_<shape>". nullopt for any other name.
std::optional<std::string> MegatronShardedObjectName(absl::string_view fqn);

// One DcpMetadata from the decoded rank-local metadata of ranks 0..N-1
// (`ranks[r]` from "__<r>.metadata"; not empty). A tensor's chunks are the
// union of the ranks' chunks; a chunk that several ranks hold (same offsets
// and sizes: a replicated tensor) and a bytes item that several ranks
// wrote are kept once, with the storage item of the lowest such rank.
// module, version, checkpoint_id and all_local_plans are rank 0's. DataLoss
// naming the ranks and the item if the ranks disagree: another module or
// version, a tensor's dtype or global size, a chunk with the same offsets and
// other sizes, a name that is a tensor on one rank and a bytes item on another.
// Coverage (gaps, partial overlaps) is the caller's to check, as for a
// global ".metadata".
absl::StatusOr<DcpMetadata> MergeRankLocalDcpMetadata(
    std::vector<DcpMetadata> ranks);

// A tensor saved by torch.save: _rebuild_tensor_v2(storage, storage_offset,
// size, stride, ...) with the storage a persistent id
// ('storage', torch.<Type>Storage, key, location, numel).
struct TorchTensorRef {
  DType dtype = DType::kFloat32;
  std::string storage_key;
  uint64_t storage_numel = 0;
  uint64_t storage_offset = 0;
  Shape size;
  std::vector<int64_t> stride;
};

// Decodes the root of a data.pkl that holds one tensor. DataLoss or
// FailedPrecondition (an unsupported storage type) otherwise.
absl::StatusOr<TorchTensorRef> DecodeTorchTensor(const PyValue& root);

// The tensor `t` as contiguous row-major bytes, gathered from the bytes of
// its storage `storage` (little-endian, as torch.save writes). DataLoss if
// an element lies outside the storage, or if the tensor has more elements
// than its storage (an expanded view), which bounds the output by the input.
absl::StatusOr<std::string> GatherTensor(const TorchTensorRef& t,
                                         absl::string_view storage);

// The ckpt dtype of a torch dtype name ("torch.float32", "torch.bfloat16";
// aliases "torch.float", "torch.half", "torch.long"...).
absl::StatusOr<DType> DTypeFromTorch(absl::string_view name);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_DCP_METADATA_H_
