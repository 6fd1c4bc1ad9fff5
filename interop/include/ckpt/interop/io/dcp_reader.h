// Reading a PyTorch Distributed Checkpoint (DCP) directory, or Megatron-Core
// torch_dist one (a DCP directory plus metadata.json and common.pt),
// without executing any of its pickles (interop/pickle.h).
//
// OpenDcp reads and decodes ".metadata" (or, where there is none, the
// rank-local "__0.metadata" .. "__<N-1>.metadata" that PyTorch 2.x's
// save(use_collectives=False) writes, merged: dcp_metadata.h) and checks,
// without reading data, what can be checked from it and the file sizes:
// every tensor's chunks lie inside it, cover it without overlap, and each
// has exactly one storage item; every storage item names a chunk or bytes
// item of the metadata and a file of the directory, with its range inside
// that file. ReadDcpChunk and ReadDcpBytes then read one item, parse its
// torch.save record (stored zip entries only, CRC-32 verified) and check
// it against the metadata.
//
// Not read, and refused naming the item (FailedPrecondition): items stored
// through FileSystemWriter's stream transforms (_extensions, e.g.
// "stream.zstd/1"), and tensors of FileSystemWriter(serialization_format=
// SAFETENSORS), whose data files hold a safetensors file where the
// metadata's ranges point (torch's own FileSystemReader cannot load those
// either).
#ifndef CKPT_INTEROP_IO_DCP_READER_H_
#define CKPT_INTEROP_IO_DCP_READER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/interop/dcp_metadata.h"
#include "ckpt/interop/io/file_io.h"

namespace ckpt::interop {

struct DcpInput {
  std::string dir;
  interop::DcpMetadata meta;
  // The metadata file(s), for messages: "<dir>/.metadata", or
  // "<dir>/__0.metadata .. __<N-1>.metadata" (rank-local).
  std::string metadata_where;
  // Data files by name (opened), with the rank that wrote each
  // ("__<rank>_<n>.distcp"; 0 for other names).
  std::map<std::string, std::shared_ptr<InputFile>> files;
  std::map<std::string, int> file_rank;
  // 1 + the highest rank of a data file or of a rank-local metadata file.
  int world_size = 1;
  // Megatron torch_dist.
  bool megatron = false;
  std::string megatron_json;  // metadata.json as it is
  // common.pt (Megatron's common state), opened, if present.
  std::shared_ptr<InputFile> common;
  // The storage item of each chunk: storage_of[fqn][i] for chunk i of the
  // tensor; and of each bytes item.
  std::map<std::string, std::vector<const interop::DcpStorage*>> chunk_storage;
  std::map<std::string, const interop::DcpStorage*> bytes_storage;
  // The ckpt entry name of each bytes item: its DCP name, or, for a Megatron
  // ShardedObject ("<key>/shard_<offset>_<shape>", Megatron torch_dist
  // only), interop::MegatronShardedObjectName's.
  std::map<std::string, std::string> object_names;
  uint64_t tensor_bytes = 0, bytes_item_bytes = 0;
};

// True iff `dir` is a directory holding ".metadata" or "__0.metadata".
bool LooksLikeDcp(const std::string& dir);

// Opens and checks `dir` as described above. Errors name the file and item:
// NotFound (no .metadata nor __0.metadata, a missing data file, a missing
// "__<r>.metadata" below the highest one or for a rank that wrote a data
// file), DataLoss (a range outside its file, chunks that overlap or leave
// a gap, an item without storage), and those of DecodeDcpMetadata (a pickle
// global off the allow-list is FailedPrecondition naming it) and of
// MergeRankLocalDcpMetadata.
absl::StatusOr<std::unique_ptr<DcpInput>> OpenDcp(const std::string& dir);

// The name "common.pt" that Megatron's common state takes in ckpt.
inline constexpr char kCommonStateEntry[] = "common.pt";

// Whether every tensor and bytes item (and common.pt) can be a ckpt entry of
// its own: each name valid (format/names.h: no '/', '\\', "..", control
// characters) and no two the same. One FailedPrecondition per problem,
// naming the metadata file and the item ("<dir>/.metadata: bytes item
// 'a/b' cannot be a ckpt entry: invalid name 'a/b': path separator");
// empty when all can.
std::vector<absl::Status> EntryNameProblems(const DcpInput& in);

// The bytes of chunk `chunk` of tensor `t`, row-major. DataLoss naming the
// file, range and tensor if the record does not parse, fails its CRC-32, or
// holds a tensor of another dtype or size; FailedPrecondition for the
// layouts refused above.
absl::StatusOr<std::string> ReadDcpChunk(const DcpInput& in,
                                         const interop::DcpTensor& t,
                                         size_t chunk);

// The bytes of bytes item `fqn` exactly as stored (a torch.save record).
// FailedPrecondition if it is stored through a transform.
absl::StatusOr<std::string> ReadDcpBytes(const DcpInput& in,
                                         const std::string& fqn);

// A description of a torch.save record holding plain data (the value,
// decoded by the restricted unpickler), or "opaque: <why>".
std::string DescribeTorchRecord(absl::string_view record);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_IO_DCP_READER_H_
