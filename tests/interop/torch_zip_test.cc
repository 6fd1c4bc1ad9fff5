// The zip reader of torch.save records: a record written by torch 1.13
// (tests/data/interop/hostile/record.zip, with the entries current
// releases add), and the refusals: compressed and overlapping entries,
// truncation, a central directory outside the archive, CRC mismatches.
#include "ckpt/interop/torch_zip.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "ckpt/format/status_macros.h"
#include "ckpt/interop/dcp_metadata.h"
#include "ckpt/interop/pickle.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace ckpt::interop {
namespace {

using ::ckpt::testing::StatusIs;

std::string Data(const std::string& name) {
  return ::ckpt::testing::ReadFileBytes(std::string(CKPT_SOURCE_DIR) +
                                        "/tests/data/interop/" + name);
}

TEST(TorchZipTest, ReadsARecordOfTorchSave) {
  const std::string rec = Data("hostile/record.zip");
  CKPT_ASSERT_OK_AND_ASSIGN(ZipArchive zip, ParseZip(rec));
  CKPT_ASSERT_OK_AND_ASSIGN(TorchRecord r, FindTorchRecord(zip));
  EXPECT_EQ(r.prefix, "archive");
  ASSERT_NE(r.version, nullptr);
  EXPECT_NE(zip.Find("archive/byteorder"), nullptr);
  for (const ZipEntry& e : zip.entries) CKPT_EXPECT_OK(VerifyZipEntry(rec, e));
  CKPT_ASSERT_OK_AND_ASSIGN(
      Unpickled u, Unpickle(absl::string_view(rec).substr(r.pickle->data_offset,
                                                          r.pickle->size)));
  CKPT_ASSERT_OK_AND_ASSIGN(TorchTensorRef t, DecodeTorchTensor(*u.root));
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(t.size, Shape{4});
  const ZipEntry* st = r.Storage(zip, t.storage_key);
  ASSERT_NE(st, nullptr);
  CKPT_ASSERT_OK_AND_ASSIGN(std::string bytes,
                            GatherTensor(t, absl::string_view(rec).substr(
                                                st->data_offset, st->size)));
  std::vector<float> v(4);
  std::memcpy(v.data(), bytes.data(), 16);
  EXPECT_EQ(v, (std::vector<float>{0, 1, 2, 3}));
}

TEST(TorchZipTest, CompressedEntryIsRefused) {
  EXPECT_THAT(ParseZip(Data("hostile/compressed.zip")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "entry 'archive/data.pkl' is compressed (method 8)"));
}

TEST(TorchZipTest, OverlappingEntryIsRefused) {
  EXPECT_THAT(ParseZip(Data("hostile/overlap.zip")),
              StatusIs(absl::StatusCode::kDataLoss, "local header disagrees"));
}

TEST(TorchZipTest, OverlapOfTwoWellFormedEntries) {
  // Entry 0's size grown by 10 in the central directory: its data now runs
  // into the local header of the entry after it (archive/byteorder).
  std::string rec = Data("hostile/record.zip");
  const size_t end = rec.size() - 22;
  uint32_t cd = 0;
  std::memcpy(&cd, rec.data() + end + 16, 4);
  for (size_t field : {20u, 24u}) {
    uint32_t v = 0;
    std::memcpy(&v, rec.data() + cd + field, 4);
    v += 10;
    std::memcpy(rec.data() + cd + field, &v, 4);
  }
  EXPECT_THAT(
      ParseZip(rec),
      StatusIs(absl::StatusCode::kDataLoss,
               "entry 'archive/byteorder' overlaps entry 'archive/data.pkl'"));
}

TEST(TorchZipTest, TruncatedArchive) {
  const std::string rec = Data("hostile/record.zip");
  EXPECT_THAT(
      ParseZip(rec.substr(0, rec.size() - 10)),
      StatusIs(absl::StatusCode::kDataLoss, "no end of central directory"));
  EXPECT_THAT(ParseZip("PK"),
              StatusIs(absl::StatusCode::kDataLoss, "too short"));
}

TEST(TorchZipTest, CentralDirectoryOutsideTheArchive) {
  std::string rec = Data("hostile/record.zip");
  const size_t end = rec.size() - 22;
  rec[end + 16] = '\xff';
  rec[end + 17] = '\xff';
  rec[end + 18] = '\xff';
  rec[end + 19] = '\x7f';
  EXPECT_THAT(ParseZip(rec),
              StatusIs(absl::StatusCode::kDataLoss, "outside the archive"));
}

TEST(TorchZipTest, CrcMismatch) {
  std::string rec = Data("hostile/record.zip");
  CKPT_ASSERT_OK_AND_ASSIGN(ZipArchive zip, ParseZip(rec));
  const ZipEntry* data = zip.Find("archive/data/0");
  ASSERT_NE(data, nullptr);
  rec[data->data_offset] ^= 1;
  EXPECT_THAT(
      VerifyZipEntry(rec, *data),
      StatusIs(absl::StatusCode::kDataLoss, "entry 'archive/data/0': CRC-32"));
}

TEST(TorchZipTest, NotATorchRecord) {
  // An archive without data.pkl: the compressed fixture's names, stored.
  ZipArchive zip;
  zip.entries.push_back({"x/other", 0, 0, 0});
  EXPECT_THAT(FindTorchRecord(zip),
              StatusIs(absl::StatusCode::kDataLoss, "no <dir>/data.pkl"));
}

}  // namespace
}  // namespace ckpt::interop
