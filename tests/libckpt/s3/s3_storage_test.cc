// S3Storage against moto: the Storage contract (testing/storage_contract.h)
// and what is particular to an object store: no rename, no update in place,
// uploads aborted when a write is abandoned or its tree removed, reads that
// are one ranged GET of exactly the bytes asked, and conditional creates
// on stores with and without If-None-Match.
#include "s3/s3_storage.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "s3_test_server.h"
#include "testing/status_matchers.h"
#include "testing/storage_contract.h"

namespace ckpt::s3 {
namespace {

using ::ckpt::s3::testing::NewBucket;
using ::ckpt::s3::testing::TestOptions;
using ::ckpt::testing::StatusIs;
using ::ckpt::testing::StorageContractParam;
using ::ckpt::testing::StorageContractTest;
using ::ckpt::testing::StorageUnderTest;
using ::testing::HasSubstr;

class S3UnderTest : public StorageUnderTest {
 public:
  S3UnderTest(std::shared_ptr<S3Client> client, S3StorageOptions options)
      : storage_(client, options) {
    root_ = absl::StrCat("s3://", NewBucket(client.get()), "/root");
  }
  Storage* storage() override { return &storage_; }
  const std::string& root() const override { return root_; }
  S3Storage& s3() { return storage_; }

 private:
  S3Storage storage_;
  std::string root_;
};

S3StorageOptions SmallParts() {
  S3StorageOptions o;
  o.writer.part_size = kMinPartSize;
  return o;
}

std::unique_ptr<S3UnderTest> MakeS3(std::string* why,
                                    S3StorageOptions options = SmallParts()) {
  const testing::TestServer* server = testing::GetTestServer(why);
  if (server == nullptr) {
    if (testing::InCi()) ADD_FAILURE() << *why;
    return nullptr;
  }
  auto client = S3Client::Create(TestOptions(*server));
  if (!client.ok()) {
    *why = std::string(client.status().message());
    ADD_FAILURE() << *why;
    return nullptr;
  }
  return std::make_unique<S3UnderTest>(
      std::shared_ptr<S3Client>(*std::move(client)), options);
}

INSTANTIATE_TEST_SUITE_P(
    S3Storage, StorageContractTest,
    ::testing::Values(
        StorageContractParam{
            "S3",
            [](std::string* why) -> std::unique_ptr<StorageUnderTest> {
              return MakeS3(why);
            }},
        StorageContractParam{
            "S3SingleWriterWithoutConditionalWrites",
            [](std::string* why) -> std::unique_ptr<StorageUnderTest> {
              S3StorageOptions o = SmallParts();
              o.conditional_writes = false;
              o.single_writer = true;
              return MakeS3(why, o);
            }}),
    ::ckpt::testing::StorageContractName);

// In a TEST: `env` = a fresh S3 storage, or the test is skipped.
#define S3_ENV_OR_SKIP(env, ...)                \
  std::string env##_why;                        \
  auto env = MakeS3(&env##_why, ##__VA_ARGS__); \
  if (env == nullptr) GTEST_SKIP() << env##_why;

uint64_t Ops(const S3Counters& c, S3Op op) {
  return c.requests_by_op[static_cast<int>(op)];
}

TEST(S3StorageTest, TraitsSayObjectStore) {
  S3_ENV_OR_SKIP(env);
  StorageTraits t = env->storage()->traits(env->root());
  EXPECT_FALSE(t.atomic_rename);
  EXPECT_FALSE(t.directories);
  EXPECT_TRUE(t.conditional_create);
}

TEST(S3StorageTest, RenameAndUpdateInPlaceAreUnimplemented) {
  S3_ENV_OR_SKIP(env);
  Storage* fs = env->storage();
  const std::string a = JoinPath(env->root(), "a");
  CKPT_ASSERT_OK(fs->WriteFileAndSync(a, "A"));
  EXPECT_THAT(fs->Rename(a, JoinPath(env->root(), "b")),
              StatusIs(absl::StatusCode::kUnimplemented, "rename " + a));
  EXPECT_THAT(fs->RenameNoReplace(a, JoinPath(env->root(), "b")),
              StatusIs(absl::StatusCode::kUnimplemented, "§4.3"));
  EXPECT_THAT(fs->Open(a, OpenMode::kReadWrite),
              StatusIs(absl::StatusCode::kUnimplemented, "open " + a));
  EXPECT_THAT(
      fs->Lock(JoinPath(env->root(), ".lock"), LockMode::kExclusive, false),
      StatusIs(absl::StatusCode::kUnimplemented, ""));
}

TEST(S3StorageTest, NothingIsVisibleBeforeCloseAndAnAbandonedWriteIsAborted) {
  S3_ENV_OR_SKIP(env);
  Storage* fs = env->storage();
  const std::string path = JoinPath(env->root(), "shard");
  {
    CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                              fs->Open(path, OpenMode::kCreateNew));
    // Two whole parts: a multipart upload is under way.
    CKPT_ASSERT_OK(f->PWrite(0, std::string(2 * kMinPartSize + 10, 'x')));
    CKPT_ASSERT_OK(f->Sync());
    EXPECT_THAT(fs->Stat(path), StatusIs(absl::StatusCode::kNotFound, ""));
  }  // destroyed unclosed
  EXPECT_THAT(fs->Stat(path), StatusIs(absl::StatusCode::kNotFound, ""));
  CKPT_ASSERT_OK_AND_ASSIGN(auto url, ParseS3Url(path));
  CKPT_ASSERT_OK_AND_ASSIGN(
      std::vector<MultipartUpload> uploads,
      env->s3().client()->ListMultipartUploads(url.bucket, ""));
  EXPECT_TRUE(uploads.empty());
}

TEST(S3StorageTest, RemoveAllAbortsUploadsInProgressUnderIt) {
  S3_ENV_OR_SKIP(env);
  S3Client* client = env->s3().client();
  CKPT_ASSERT_OK_AND_ASSIGN(auto url,
                            ParseS3Url(JoinPath(env->root(), "step-1/x")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string id,
                            client->CreateMultipartUpload(url.bucket, url.key));
  CKPT_ASSERT_OK(client->UploadPart(url.bucket, url.key, id, 1, "part"));
  CKPT_ASSERT_OK(env->storage()->WriteFileAndSync(
      JoinPath(env->root(), "step-1/MANIFEST"), "m"));
  CKPT_ASSERT_OK(env->storage()->RemoveAll(JoinPath(env->root(), "step-1")));
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<MultipartUpload> uploads,
                            client->ListMultipartUploads(url.bucket, ""));
  EXPECT_TRUE(uploads.empty());
  EXPECT_THAT(env->storage()->Stat(JoinPath(env->root(), "step-1")),
              StatusIs(absl::StatusCode::kNotFound, ""));
}

TEST(S3StorageTest, RemoveFileOfAWriteInProgressAbortsIt) {
  S3_ENV_OR_SKIP(env);
  S3Client* client = env->s3().client();
  const std::string path = JoinPath(env->root(), "shard-00000.x.ckpt");
  CKPT_ASSERT_OK_AND_ASSIGN(auto url, ParseS3Url(path));
  CKPT_ASSERT_OK_AND_ASSIGN(std::string id,
                            client->CreateMultipartUpload(url.bucket, url.key));
  CKPT_ASSERT_OK(env->storage()->RemoveFile(path));
  CKPT_ASSERT_OK_AND_ASSIGN(std::vector<MultipartUpload> uploads,
                            client->ListMultipartUploads(url.bucket, ""));
  EXPECT_TRUE(uploads.empty());
  EXPECT_THAT(env->storage()->RemoveFile(path),
              StatusIs(absl::StatusCode::kNotFound, path));
}

TEST(S3StorageTest, PReadIsOneRangedGetOfExactlyTheBytesAsked) {
  S3_ENV_OR_SKIP(env);
  Storage* fs = env->storage();
  const std::string path = JoinPath(env->root(), "f");
  const std::string data = ::ckpt::testing::ContractBytes(100000, 5);
  CKPT_ASSERT_OK(fs->WriteFileAndSync(path, data));
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs->Open(path, OpenMode::kRead));
  const S3Counters before = env->s3().client()->counters();
  std::string buf(4096, '\0');
  CKPT_ASSERT_OK_AND_ASSIGN(size_t n, f->PRead(50000, buf.size(), buf.data()));
  ASSERT_EQ(n, buf.size());
  EXPECT_EQ(buf, data.substr(50000, 4096));
  // Past the end: the bytes there are, no request for nothing.
  CKPT_ASSERT_OK_AND_ASSIGN(n, f->PRead(99000, buf.size(), buf.data()));
  EXPECT_EQ(n, 1000u);
  CKPT_ASSERT_OK_AND_ASSIGN(n, f->PRead(100000, buf.size(), buf.data()));
  EXPECT_EQ(n, 0u);
  const S3Counters d = env->s3().client()->counters() - before;
  EXPECT_EQ(d.requests, 2u);
  EXPECT_EQ(Ops(d, S3Op::kGetObject), 2u);
  EXPECT_EQ(d.bytes_received, 4096u + 1000u);
}

TEST(S3StorageTest, ReadOfAnObjectThatShrankIsAnErrorNotAShortRead) {
  S3_ENV_OR_SKIP(env);
  Storage* fs = env->storage();
  const std::string path = JoinPath(env->root(), "f");
  CKPT_ASSERT_OK(fs->WriteFileAndSync(path, std::string(10000, 'a')));
  CKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f,
                            fs->Open(path, OpenMode::kRead));
  CKPT_ASSERT_OK(fs->ReplaceFile(path, std::string(100, 'b')));
  std::string buf(5000, '\0');
  EXPECT_THAT(f->PRead(0, buf.size(), buf.data()),
              StatusIs(absl::StatusCode::kOutOfRange, "pread " + path));
}

TEST(S3StorageTest, WithoutConditionalWritesCreateExclusiveIsRefused) {
  S3StorageOptions o = SmallParts();
  o.conditional_writes = false;
  S3_ENV_OR_SKIP(env, o);
  const std::string path = JoinPath(env->root(), "MANIFEST");
  EXPECT_THAT(env->storage()->CreateExclusive(path, "m"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "not known to honour conditional writes"));
  EXPECT_THAT(env->storage()->Stat(path),
              StatusIs(absl::StatusCode::kNotFound, ""));
  EXPECT_FALSE(env->storage()->traits(env->root()).conditional_create);
}

TEST(S3StorageTest, PathsThatAreNotObjectsAreInvalidArgument) {
  S3_ENV_OR_SKIP(env);
  EXPECT_THAT(env->storage()->Open("/local/file", OpenMode::kRead),
              StatusIs(absl::StatusCode::kInvalidArgument, "not an S3 URL"));
  EXPECT_THAT(env->storage()->Open("s3://Bad_Bucket/k", OpenMode::kRead),
              StatusIs(absl::StatusCode::kInvalidArgument, "Bad_Bucket"));
  CKPT_ASSERT_OK_AND_ASSIGN(auto url, ParseS3Url(env->root()));
  EXPECT_THAT(env->storage()->RemoveAll(absl::StrCat("s3://", url.bucket)),
              StatusIs(absl::StatusCode::kInvalidArgument, "whole bucket"));
}

}  // namespace
}  // namespace ckpt::s3
