// Reader: the shard files it keeps open are bounded by
// ReaderOptions::max_open_files, while loads over many more shards stay
// byte-exact, with several I/O threads.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/reader.h"
#include "ckpt/testing/forwarding_storage.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "synth/synth.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::ckpt::testing::TempDir;

// DefaultStorage counting the files open at once (and the most ever).
class CountingStorage final : public testing::ForwardingStorage {
 public:
  int max_open() const { return max_open_; }
  int open_now() const { return open_; }
  int opens() const { return opens_; }

  absl::StatusOr<std::unique_ptr<File>> Open(
      const std::string& path, OpenMode mode,
      const OpenOptions& options) override {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<File> f,
                          ForwardingStorage::Open(path, mode, options));
    const int now = ++open_;
    ++opens_;
    int seen = max_open_.load();
    while (now > seen && !max_open_.compare_exchange_weak(seen, now)) {
    }
    return std::unique_ptr<File>(new CountedFile(std::move(f), &open_));
  }

 private:
  class CountedFile final : public testing::ForwardingFile {
   public:
    CountedFile(std::unique_ptr<File> f, std::atomic<int>* open)
        : ForwardingFile(std::move(f)), open_(open) {}
    ~CountedFile() override { --*open_; }

   private:
    std::atomic<int>* open_;
  };

  std::atomic<int> open_{0}, max_open_{0}, opens_{0};
};

// Every entry of the checkpoint at `path`, loaded whole, in manifest order.
absl::StatusOr<std::vector<std::string>> LoadAll(const std::string& path,
                                                 const ReaderOptions& ro,
                                                 int io_threads) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Reader::Open(path, ro));
  std::vector<EntryView> entries = reader->entries();
  std::vector<std::string> bytes(entries.size());
  std::vector<LoadRequest> reqs;
  for (size_t i = 0; i < entries.size(); ++i) {
    const EntryView& e = entries[i];
    LoadRequest r;
    r.name = e.name();
    if (e.is_object()) {
      r.object = &bytes[i];
    } else {
      bytes[i].assign(testing::Numel(e.shape()) * DTypeSize(e.dtype()), '\0');
      r.dtype = e.dtype();
      r.shape = e.shape();
      r.region = FullBox(e.shape());
      r.data = bytes[i].data();
    }
    reqs.push_back(std::move(r));
  }
  LoadOptions lo;
  lo.io_threads = io_threads;
  CKPT_RETURN_IF_ERROR(reader->Load(reqs, lo).status());
  return bytes;
}

TEST(ReaderOpenFilesTest, LoadOverManyShardsKeepsAtMostMaxOpenFilesOpen) {
  TempDir dir;
  CKPT_ASSERT_OK_AND_ASSIGN(
      synth::SynthResult written,
      synth::WriteTestCheckpoint(dir.path(), 64, synth::SynthLayout::kMixed));
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> want,
                            LoadAll(written.path, {}, 1));
  // More I/O threads than files: threads wait for a file to become idle.
  for (auto [threads, max_open] : {std::pair{1, 4}, {4, 4}, {8, 2}}) {
    SCOPED_TRACE(absl::StrCat(threads, " threads, ", max_open, " files"));
    CountingStorage storage;
    ReaderOptions ro;
    ro.storage = &storage;
    ro.max_open_files = max_open;
    CKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> got,
                              LoadAll(written.path, ro, threads));
    EXPECT_TRUE(got == want);
    EXPECT_LE(storage.max_open(), max_open);
    EXPECT_EQ(storage.open_now(), 0);
    EXPECT_GT(storage.opens(), 64);  // every shard at least, some twice
  }
}

TEST(ReaderOpenFilesTest, MaxOpenFilesBelowOneIsInvalidArgument) {
  TempDir dir;
  CKPT_ASSERT_OK_AND_ASSIGN(
      synth::SynthResult written,
      synth::WriteTestCheckpoint(dir.path(), 2, synth::SynthLayout::kMixed));
  ReaderOptions ro;
  ro.max_open_files = 0;
  EXPECT_THAT(Reader::Open(written.path, ro),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "ReaderOptions::max_open_files is 0, must be at least "
                       "1"));
}

}  // namespace
}  // namespace ckpt
