// A reader of the zip archives that torch.save writes ("archive/data.pkl",
// "archive/data/0", ..., "archive/version"), as a pure parser of bytes held
// in memory. PyTorch's writer stores every entry uncompressed (method 0),
// so the reader accepts only that: a compressed or encrypted entry is an
// error, and so are entries whose local header and data leave the archive,
// overlap another entry or the central directory, or disagree with the
// central directory. Zip64 records are read. CRC-32 checks are left to
// the caller (VerifyZipEntry), which has the bytes.
#ifndef CKPT_INTEROP_TORCH_ZIP_H_
#define CKPT_INTEROP_TORCH_ZIP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::interop {

inline constexpr uint64_t kZipMaxEntries = 1u << 20;

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;  // in the archive
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

struct ZipArchive {
  std::vector<ZipEntry> entries;  // in central directory order
  const ZipEntry* Find(absl::string_view name) const;
};

// Parses the archive `data`. DataLoss naming the entry for every
// violation above; FailedPrecondition for a compressed or encrypted entry.
absl::StatusOr<ZipArchive> ParseZip(absl::string_view data);

// DataLoss if the CRC-32 of `e`'s bytes in `data` differs from the stored one.
absl::Status VerifyZipEntry(absl::string_view data, const ZipEntry& e);

// The parts of a torch.save record: "<prefix>/data.pkl", the storages
// "<prefix>/data/<key>", "<prefix>/version".
struct TorchRecord {
  std::string prefix;
  const ZipEntry* pickle = nullptr;
  const ZipEntry* version = nullptr;
  // The entry of storage `key`, or null.
  const ZipEntry* Storage(const ZipArchive& zip, absl::string_view key) const;
};

// DataLoss if the archive lacks data.pkl or its entries do not share one
// top-level directory.
absl::StatusOr<TorchRecord> FindTorchRecord(const ZipArchive& zip);

}  // namespace ckpt::interop

#endif  // CKPT_INTEROP_TORCH_ZIP_H_
