// One shard file written by libckpt/save/shard_writer.h, read back with the
// format's own decoders: layout, block checksums, codecs, sources, device
// staging, and the fsync the commit protocol relies on (F2 of
// spec/FORMAT.md §4.1).
#include "save/shard_writer.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/format/block_codec.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/shard.h"
#include "ckpt/testing/forwarding_storage.h"
#include "ckpt/testing/power_loss.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::internal {
namespace {

using ::ckpt::testing::IsOk;
using ::ckpt::testing::StatusIs;

constexpr char kPath[] = "/d/shard-00000.ckpt";

struct Piece {
  LocalItem item;
  std::string bytes;
};

// A tensor of `n` float32 elements whose bytes follow `seed`.
Piece Floats(const std::string& name, uint64_t n, int seed) {
  Piece p;
  p.item.name = name;
  p.item.dtype = DType::kFloat32;
  p.item.shape = {n};
  p.item.region = FlatRange{0, n};
  p.bytes.resize(n * 4);
  for (size_t i = 0; i < p.bytes.size(); ++i)
    p.bytes[i] = static_cast<char>(i * seed % 251);
  return p;
}

class ShardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(disk_.CreateDir("/d"), IsOk());
    ASSERT_THAT(disk_.SyncDir("/"), IsOk());
    options_.block_size = 4096;
    options_.alignment = 512;
    options_.io_threads = 3;
    header_.shard_id = 0;
    header_.alignment = 512;
    info_.step = 9;
  }

  absl::StatusOr<ShardWriteResult> Write(
      const std::vector<Piece>& pieces, DeviceMemory* dm = nullptr,
      MemoryKind memory = MemoryKind::kHost) {
    items_.clear();
    for (const Piece& p : pieces) {
      items_.push_back(WriteItem{&p.item, p.bytes.data(), memory, 0, nullptr});
    }
    return WriteShardFile(&disk_, kPath, header_, info_, {{"k", "v"}}, items_,
                          options_, dm);
  }

  // Decodes the file as a reader would; the index, or a failure.
  format::ShardIndex ReadIndex() {
    std::string file = *disk_.ReadFile(kPath);
    auto header =
        format::DecodeShardHeader(file.substr(0, format::kShardHeaderSize));
    EXPECT_THAT(header, IsOk());
    auto tail = format::DecodeShardTail(
        file.substr(file.size() - format::kShardTailSize), file.size());
    EXPECT_THAT(tail, IsOk());
    if (!header.ok() || !tail.ok()) return {};
    auto index = format::DecodeShardIndex(
        absl::string_view(file).substr(tail->index_offset, tail->index_length),
        *header, *tail);
    EXPECT_THAT(index, IsOk());
    return index.ok() ? *index : format::ShardIndex{};
  }

  // The raw bytes of `chunk`, decoded block by block with its checksums.
  std::string ReadChunk(const format::ChunkRecord& c, uint64_t raw_bytes) {
    std::string file = *disk_.ReadFile(kPath);
    std::string out(raw_bytes, '\0');
    format::BlockDecoder decoder;
    uint64_t stored = c.data_offset, raw = 0;
    for (const format::BlockRecord& b : c.blocks) {
      const uint64_t n = std::min<uint64_t>(c.block_size, raw_bytes - raw);
      EXPECT_THAT(
          decoder.Decode(c.codec,
                         absl::string_view(file).substr(stored, b.stored_size),
                         b.checksum, n, out.data() + raw),
          IsOk());
      stored += b.stored_size;
      raw += n;
    }
    return out;
  }

  PowerLossStorage disk_;
  SaveOptions options_;
  format::ShardHeader header_;
  format::CheckpointInfo info_;
  std::vector<WriteItem> items_;
};

TEST_F(ShardWriterTest, UncompressedShardReadsBackExactly) {
  std::vector<Piece> pieces = {Floats("a", 3000, 7), Floats("b", 5, 3),
                               Floats("c", 0, 1)};
  auto result = Write(pieces);
  ASSERT_THAT(result, IsOk());
  EXPECT_EQ(result->file_size, disk_.Stat(kPath)->size);
  EXPECT_EQ(result->stored_bytes, 4u * 3005);
  format::ShardIndex index = ReadIndex();
  EXPECT_EQ(index, result->index);
  ASSERT_EQ(index.entries.size(), 3u);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const format::ChunkRecord& c = index.entries[i].chunks.at(0);
    EXPECT_EQ(c.stored_length, pieces[i].bytes.size());
    EXPECT_EQ(c.blocks.size(), format::NumBlocks(pieces[i].bytes.size(), 4096));
    if (pieces[i].bytes.empty()) {
      EXPECT_EQ(c.data_offset, 0u);  // no payload
      continue;
    }
    EXPECT_EQ(c.data_offset % 512, 0u) << pieces[i].item.name;
    EXPECT_EQ(ReadChunk(c, pieces[i].bytes.size()), pieces[i].bytes)
        << pieces[i].item.name;
  }
}

TEST_F(ShardWriterTest, ZstdShardReadsBackExactly) {
  options_.codec = format::Codec::kZstd;
  Piece zeros = Floats("zeros", 4096, 0);  // compresses
  std::vector<Piece> pieces = {zeros, Floats("noise", 1500, 13)};
  auto result = Write(pieces);
  ASSERT_THAT(result, IsOk());
  format::ShardIndex index = ReadIndex();
  ASSERT_EQ(index.entries.size(), 2u);
  EXPECT_LT(index.entries[0].chunks[0].stored_length, zeros.bytes.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const format::ChunkRecord& c = index.entries[i].chunks[0];
    EXPECT_EQ(c.data_offset % 512, 0u);
    EXPECT_EQ(ReadChunk(c, pieces[i].bytes.size()), pieces[i].bytes);
  }
}

TEST_F(ShardWriterTest, LayoutDoesNotDependOnTheNumberOfThreads) {
  std::vector<Piece> pieces = {Floats("a", 70000, 5), Floats("b", 3, 2)};
  options_.io_threads = 1;
  ASSERT_THAT(Write(pieces), IsOk());
  const std::string one = *disk_.ReadFile(kPath);
  ASSERT_THAT(disk_.RemoveFile(kPath), IsOk());
  options_.io_threads = 4;
  ASSERT_THAT(Write(pieces), IsOk());
  EXPECT_EQ(*disk_.ReadFile(kPath), one);
}

TEST_F(ShardWriterTest, FileBytesAreDurableWhenItReturns) {
  ASSERT_THAT(Write({Floats("a", 2000, 3)}), IsOk());
  const std::string written = *disk_.ReadFile(kPath);
  ASSERT_THAT(disk_.SyncDir("/d"), IsOk());  // the name: the caller's job
  disk_.PowerCut();
  EXPECT_EQ(*disk_.ReadFile(kPath), written);
}

TEST_F(ShardWriterTest, ExistingFileIsAlreadyExists) {
  ASSERT_THAT(disk_.WriteFileAndSync(kPath, "x"), IsOk());
  EXPECT_THAT(Write({Floats("a", 1, 1)}),
              StatusIs(absl::StatusCode::kAlreadyExists, kPath));
}

TEST_F(ShardWriterTest, SourceProvidesTheBytesAndItsErrorNamesTheEntry) {
  Piece p = Floats("streamed", 3000, 9);
  TensorSource good = [&](uint64_t offset, void* dst, uint64_t n) {
    std::memcpy(dst, p.bytes.data() + offset, n);
    return absl::OkStatus();
  };
  items_ = {WriteItem{&p.item, nullptr, MemoryKind::kHost, 0, &good}};
  auto ok = WriteShardFile(&disk_, kPath, header_, info_, {}, items_, options_,
                           nullptr);
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(ReadChunk(ReadIndex().entries[0].chunks[0], p.bytes.size()),
            p.bytes);

  TensorSource bad = [](uint64_t, void*, uint64_t) {
    return absl::UnavailableError("gone");
  };
  items_ = {WriteItem{&p.item, nullptr, MemoryKind::kHost, 0, &bad}};
  EXPECT_THAT(WriteShardFile(&disk_, "/d/other.ckpt", header_, info_, {},
                             items_, options_, nullptr),
              StatusIs(absl::StatusCode::kUnavailable,
                       "entry 'streamed': source at byte 0"));
}

// Copies "device" memory (host memory here) and counts the bytes.
class CountingDevice final : public DeviceMemory {
 public:
  absl::Status CopyToHost(void* dst, const void* src, size_t n, int) override {
    std::memcpy(dst, src, n);
    copied += n;
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void*, const void*, size_t, int) override {
    return absl::UnimplementedError("not used");
  }
  uint64_t copied = 0;
};

TEST_F(ShardWriterTest, DeviceMemoryIsStagedThroughDeviceMemory) {
  CountingDevice device;
  Piece p = Floats("gpu", 5000, 11);
  ASSERT_THAT(Write({p}, &device, MemoryKind::kCuda), IsOk());
  EXPECT_EQ(device.copied, p.bytes.size());
  EXPECT_EQ(ReadChunk(ReadIndex().entries[0].chunks[0], p.bytes.size()),
            p.bytes);
}

TEST_F(ShardWriterTest, DeviceMemoryWithoutDeviceMemoryIsFailedPrecondition) {
  EXPECT_THAT(Write({Floats("gpu", 4, 1)}, nullptr, MemoryKind::kCuda),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "entry 'gpu' lives in CUDA memory"));
}

// Records the byte ranges written to its files; its traits say whether
// files may have holes.
class RangeRecorder : public ::ckpt::testing::ForwardingStorage {
 public:
  RangeRecorder(Storage* base, bool sparse)
      : ForwardingStorage(base), sparse_(sparse) {}
  StorageTraits traits(const std::string&) const override {
    StorageTraits t;
    t.sparse_files = sparse_;
    return t;
  }
  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options) override {
    auto f = ForwardingStorage::Open(path, mode, options);
    if (!f.ok()) return f.status();
    return std::unique_ptr<File>(new Recording(*std::move(f), this));
  }
  // The end of the written range that starts at 0.
  uint64_t WrittenPrefix() {
    std::lock_guard<std::mutex> l(mu_);
    std::sort(ranges_.begin(), ranges_.end());
    uint64_t end = 0;
    for (const auto& [b, e] : ranges_) {
      if (b > end) break;
      end = std::max(end, e);
    }
    return end;
  }

 private:
  class Recording : public ::ckpt::testing::ForwardingFile {
   public:
    Recording(std::unique_ptr<File> base, RangeRecorder* owner)
        : ForwardingFile(std::move(base)), owner_(owner) {}
    absl::Status PWrite(uint64_t offset, absl::string_view data) override {
      {
        std::lock_guard<std::mutex> l(owner_->mu_);
        owner_->ranges_.emplace_back(offset, offset + data.size());
      }
      return ForwardingFile::PWrite(offset, data);
    }

   private:
    RangeRecorder* const owner_;
  };

  const bool sparse_;
  std::mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
};

TEST_F(ShardWriterTest, PaddingIsWrittenWhereTheStorageHasNoSparseFiles) {
  std::vector<Piece> pieces = {Floats("a", 3000, 7), Floats("b", 5, 3),
                               Floats("c", 0, 1), Floats("d", 777, 5)};
  for (format::Codec codec : {format::Codec::kNone, format::Codec::kZstd}) {
    for (bool sparse : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "codec " << static_cast<int>(codec)
                                        << " sparse " << sparse);
      PowerLossStorage disk;
      ASSERT_THAT(disk.CreateDir("/d"), IsOk());
      RangeRecorder recorder(&disk, sparse);
      SaveOptions options = options_;
      options.codec = codec;
      items_.clear();
      for (const Piece& p : pieces) {
        items_.push_back(
            WriteItem{&p.item, p.bytes.data(), MemoryKind::kHost, 0, nullptr});
      }
      auto result = WriteShardFile(&recorder, kPath, header_, info_, {}, items_,
                                   options, nullptr);
      ASSERT_THAT(result, IsOk());
      if (sparse) {
        // Holes stay holes (the header's 64 bytes, then the first payload
        // at 512).
        EXPECT_LT(recorder.WrittenPrefix(), result->file_size);
      } else {
        EXPECT_EQ(recorder.WrittenPrefix(), result->file_size);
      }
    }
  }
}

}  // namespace
}  // namespace ckpt::internal
