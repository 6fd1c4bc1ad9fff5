// Verifying a source checkpoint's shard files before a tool sizes any work
// from its manifest (issue 28, SECURITY.md "Resource use"): the manifest
// declares tensor shapes, chunk regions and stored lengths that only the
// shard files can vouch for. ckpt-reshard (whose output layout and block
// tables follow the source's chunks) and ckpt-convert's exports call this
// right after opening the source, so that what they plan is bounded by the
// bytes on disk.
#ifndef CKPT_OPS_SOURCE_SHARDS_H_
#define CKPT_OPS_SOURCE_SHARDS_H_

#include <string>

#include "absl/status/status.h"
#include "ckpt/format/records.h"
#include "ckpt/storage.h"

namespace ckpt::ops {

// Opens every shard file of the checkpoint directory `dir`, whose manifest
// is `manifest`, one at a time, and checks it as a load does before it
// reads a shard (internal::OpenShardFile: present, its size the manifest's,
// header, tail and index decoded, ids; internal::CheckShardIndex: its
// CHECKPOINT_INFO, METADATA and chunks as the manifest lists them, every
// block table consistent with its chunk). The first problem: DataLoss
// naming the file (and entry and chunk), or the storage's error. Memory:
// one shard's index at a time. `storage` and `manifest` are borrowed.
absl::Status CheckSourceShards(Storage* storage, const std::string& dir,
                               const format::Manifest& manifest);

}  // namespace ckpt::ops

#endif  // CKPT_OPS_SOURCE_SHARDS_H_
