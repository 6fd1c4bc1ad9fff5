// ObjectWriter against moto: positioned writes in any order from several
// threads become one object, committed only by Close.
#include "s3/s3_object_writer.h"

#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "s3_test_server.h"
#include "testing/status_matchers.h"

namespace ckpt::s3 {
namespace {

using ::ckpt::s3::testing::NewBucket;
using ::ckpt::s3::testing::TestOptions;
using ::ckpt::testing::StatusIs;

constexpr uint64_t kPart = kMinPartSize;  // 5 MiB

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

struct Fixture {
  std::unique_ptr<S3Client> client;
  std::string bucket;
};

Fixture Make(const testing::TestServer& server) {
  Fixture f;
  f.client = std::move(S3Client::Create(TestOptions(server)).value());
  f.bucket = NewBucket(f.client.get());
  return f;
}

std::unique_ptr<ObjectWriter> Writer(const Fixture& f, const std::string& key,
                                     ObjectWriterOptions o = {}) {
  o.part_size = kPart;
  return std::move(
      ObjectWriter::Create(f.client.get(), f.bucket, key, o).value());
}

uint64_t Ops(const S3Counters& c, S3Op op) {
  return c.requests_by_op[static_cast<int>(op)];
}

TEST(ObjectWriter, SmallObjectIsOnePut) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Fixture f = Make(*server);
  auto w = Writer(f, "small");
  const S3Counters before = f.client->counters();
  CKPT_ASSERT_OK(w->PWrite(5, "world"));
  CKPT_ASSERT_OK(w->PWrite(0, "hello"));
  CKPT_ASSERT_OK(w->Close());
  const S3Counters d = f.client->counters() - before;
  EXPECT_EQ(d.requests, 1u);
  EXPECT_EQ(Ops(d, S3Op::kPutObject), 1u);
  EXPECT_EQ(w->parts_uploaded(), 0);
  EXPECT_EQ(f.client->GetObject(f.bucket, "small").value(), "helloworld");
  auto empty = Writer(f, "empty");
  CKPT_ASSERT_OK(empty->Close());
  EXPECT_EQ(f.client->GetObject(f.bucket, "empty").value(), "");
}

// A shard's payloads: pieces written by 4 threads in shuffled order; parts
// go up as they fill, in parallel, and the object is exact.
TEST(ObjectWriter, OutOfOrderWritesFromThreadsMakeTheExactObject) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Fixture f = Make(*server);
  const std::string data = RandomBytes(3 * kPart + 123457, 7);
  ObjectWriterOptions o;
  o.upload_threads = 3;
  auto w = Writer(f, "shard", o);
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  for (uint64_t off = 0; off < data.size(); off += 300001) {
    pieces.emplace_back(off, std::min<uint64_t>(300001, data.size() - off));
  }
  std::shuffle(pieces.begin(), pieces.end(), std::mt19937(1));
  const S3Counters before = f.client->counters();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < pieces.size(); i += 4) {
        const auto [off, n] = pieces[i];
        EXPECT_TRUE(
            w->PWrite(off, absl::string_view(data).substr(off, n)).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  // Nothing is visible before Close, even with parts uploaded.
  EXPECT_THAT(f.client->HeadObject(f.bucket, "shard"),
              StatusIs(absl::StatusCode::kNotFound, "404"));
  CKPT_ASSERT_OK(w->Close());
  EXPECT_EQ(w->parts_uploaded(), 4);
  EXPECT_EQ(w->size(), data.size());
  const S3Counters d = f.client->counters() - before;
  EXPECT_EQ(Ops(d, S3Op::kUploadPart), 4u);
  EXPECT_EQ(Ops(d, S3Op::kCreateMultipartUpload), 1u);
  EXPECT_EQ(Ops(d, S3Op::kCompleteMultipartUpload), 1u);
  // Bytes sent: the object once, plus the completion's XML.
  EXPECT_GE(d.bytes_sent, data.size());
  EXPECT_LT(d.bytes_sent, data.size() + 1000);
  auto got = f.client->GetObject(f.bucket, "shard");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == data);
  EXPECT_TRUE(f.client->ListMultipartUploads(f.bucket, "").value().empty());
}

TEST(ObjectWriter, HolesReadAsZeros) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Fixture f = Make(*server);
  auto w = Writer(f, "holes");
  const std::string a = RandomBytes(1000, 1), b = RandomBytes(1000, 2);
  CKPT_ASSERT_OK(w->PWrite(100, a));
  CKPT_ASSERT_OK(w->PWrite(kPart + 5000, b));  // part 1 has a hole, part 2 too
  CKPT_ASSERT_OK(w->Close());
  EXPECT_EQ(w->parts_uploaded(), 2);
  std::string want(kPart + 6000, '\0');
  want.replace(100, a.size(), a);
  want.replace(kPart + 5000, b.size(), b);
  EXPECT_TRUE(f.client->GetObject(f.bucket, "holes").value() == want);
}

TEST(ObjectWriter, WritingIntoAnUploadedPartIsRefused) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Fixture f = Make(*server);
  auto w = Writer(f, "k");
  CKPT_ASSERT_OK(w->PWrite(0, std::string(kPart, 'a')));  // part 1: full
  EXPECT_THAT(w->PWrite(10, "late"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "bytes [10, 14) belong to part 1, which is already "
                       "uploaded"));
  CKPT_ASSERT_OK(w->Abort());
}

// A failed or abandoned save leaves neither an object nor an upload.
TEST(ObjectWriter, AbortAndDestructionLeaveNothing) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Fixture f = Make(*server);
  {
    auto w = Writer(f, "aborted");
    CKPT_ASSERT_OK(w->PWrite(0, std::string(2 * kPart, 'a')));
    CKPT_ASSERT_OK(w->Abort());
    EXPECT_THAT(w->PWrite(2 * kPart, "x"),
                StatusIs(absl::StatusCode::kAborted, "aborted"));
    EXPECT_THAT(w->Close(),
                StatusIs(absl::StatusCode::kFailedPrecondition, "twice"));
  }
  {
    auto w = Writer(f, "dropped");
    CKPT_ASSERT_OK(w->PWrite(0, std::string(kPart + 10, 'b')));
  }  // destroyed without Close
  EXPECT_TRUE(f.client->ListMultipartUploads(f.bucket, "").value().empty());
  EXPECT_TRUE(f.client->ListObjects(f.bucket, "").value().objects.empty());
}

// Two writers race for one key with if_none_match: one commits, the other
// gets AlreadyExists and leaves nothing behind; the first one's bytes stay.
TEST(ObjectWriter, IfNoneMatchLetsOneOfTwoWritersCommit) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Fixture f = Make(*server);
  ObjectWriterOptions once;
  once.if_none_match = true;
  for (const uint64_t size : {uint64_t{100}, 2 * kPart + 7}) {
    const std::string key = absl::StrCat("MANIFEST-", size);
    auto first = Writer(f, key, once), second = Writer(f, key, once);
    const std::string a = RandomBytes(size, 1), b = RandomBytes(size, 2);
    CKPT_ASSERT_OK(first->PWrite(0, a));
    CKPT_ASSERT_OK(second->PWrite(0, b));
    CKPT_ASSERT_OK(first->Close());
    EXPECT_THAT(second->Close(),
                StatusIs(absl::StatusCode::kAlreadyExists, "If-None-Match"))
        << size;
    EXPECT_TRUE(f.client->GetObject(f.bucket, key).value() == a) << size;
  }
  EXPECT_TRUE(f.client->ListMultipartUploads(f.bucket, "").value().empty());
}

TEST(ObjectWriter, BadOptionsAndSizes) {
  ObjectWriterOptions o;
  o.part_size = kMinPartSize - 1;
  EXPECT_THAT(
      ObjectWriter::Create(nullptr, "b", "k", o),
      StatusIs(absl::StatusCode::kInvalidArgument, "below S3's minimum"));
  o.part_size = kMinPartSize;
  o.upload_threads = 0;
  EXPECT_THAT(ObjectWriter::Create(nullptr, "b", "k", o),
              StatusIs(absl::StatusCode::kInvalidArgument, "upload_threads"));
  o.upload_threads = 1;
  auto w = ObjectWriter::Create(nullptr, "b", "k", o);
  ASSERT_TRUE(w.ok());
  EXPECT_THAT((*w)->PWrite(kMaxParts * kMinPartSize, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "10000 parts"));
  CKPT_EXPECT_OK((*w)->Abort());  // nothing started: nothing to abort
}

}  // namespace
}  // namespace ckpt::s3
