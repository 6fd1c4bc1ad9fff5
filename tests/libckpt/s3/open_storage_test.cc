// ckpt::OpenStorage: a root given as a string is the POSIX storage or, for
// s3:// URLs, an S3Storage configured from the environment, through which
// the public Writer and Reader save and load (against moto); UrlStorage:
// both at once, by path.
#include "ckpt/open_storage.h"

#include <stdlib.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "s3_test_server.h"
#include "testing/status_matchers.h"

namespace ckpt {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

using Env = std::map<std::string, std::string>;

EnvironmentLookup Lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

Env ServerEnv(const s3::testing::TestServer& server) {
  return {{"AWS_ENDPOINT_URL", server.endpoint},
          {"AWS_ACCESS_KEY_ID", server.user.access_key_id},
          {"AWS_SECRET_ACCESS_KEY", server.user.secret_access_key},
          {"AWS_REGION", server.region}};
}

std::string Bucket(const s3::testing::TestServer& server) {
  auto client = s3::S3Client::Create(s3::testing::TestOptions(server));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? s3::testing::NewBucket(client->get()) : "";
}

// Saves one tensor at step 1 into `root` through `storage`.
absl::Status SaveOne(Storage* storage, const std::string& root,
                     const std::vector<float>& data) {
  Writer::Options wo;
  wo.storage = storage;
  CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
  const uint64_t n = data.size();
  CKPT_RETURN_IF_ERROR(writer->AddTensor("w", DType::kFloat32, {n},
                                         FlatRange{0, n}, data.data()));
  return writer->Save(root, 1, SaveOptions{}).status();
}

TEST(OpenStorage, APathIsTheDefaultStorage) {
  CKPT_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> s,
                            OpenStorage("/tmp/ckpt-run"));
  EXPECT_EQ(s.get(), DefaultStorage());
  CKPT_ASSERT_OK_AND_ASSIGN(s, OpenStorage("relative/run"));
  EXPECT_EQ(s.get(), DefaultStorage());
}

TEST(OpenStorage, AnS3UrlSavesAndLoadsThroughTheEnvironmentsServer) {
  CKPT_S3_SERVER_OR_SKIP(server);
  const Env env = ServerEnv(*server);
  const std::string root = absl::StrCat("s3://", Bucket(*server), "/run");
  CKPT_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> s,
                            OpenStorage(root, Lookup(env)));
  EXPECT_FALSE(s->traits(root).atomic_rename);
  const std::vector<float> data = {1, 2, 3, 4, 5};
  CKPT_ASSERT_OK(SaveOne(s.get(), root, data));
  ReaderOptions ro;
  ro.storage = s.get();
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(root, ro));
  EXPECT_EQ(reader->path(), root + "/step-00000001");
  std::vector<float> back(5);
  CKPT_ASSERT_OK(
      reader->Load({{"w", DType::kFloat32, {5}, FlatRange{0, 5}, back.data()}})
          .status());
  EXPECT_EQ(back, data);
}

TEST(OpenStorage, MalformedUrlOrVariableIsInvalidArgumentNamingIt) {
  EXPECT_THAT(OpenStorage("s3://"),
              StatusIs(absl::StatusCode::kInvalidArgument, "names no bucket"));
  Env env = {{"CKPT_S3_SINGLE_WRITER", "perhaps"}};
  EXPECT_THAT(
      OpenStorage("s3://bucket/run", Lookup(env)),
      StatusIs(absl::StatusCode::kInvalidArgument, "CKPT_S3_SINGLE_WRITER"));
  env = {{"AWS_ACCESS_KEY_ID", "AKIDONLY"}};
  EXPECT_THAT(
      OpenStorage("s3://bucket/run", Lookup(env)),
      StatusIs(absl::StatusCode::kInvalidArgument, "AWS_SECRET_ACCESS_KEY"));
}

TEST(OpenStorage, AWrongSecretIsPermissionDeniedAndNeverInTheMessage) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Env env = ServerEnv(*server);
  const std::string root = absl::StrCat("s3://", Bucket(*server), "/run");
  const std::string secret = "wrongSecretKey/ABCDEFGHIJKLMNOPQRSTUVWXYZ0123";
  env["AWS_SECRET_ACCESS_KEY"] = secret;
  env["AWS_SESSION_TOKEN"] = "sessionTokenThatMustNotLeak";
  CKPT_ASSERT_OK_AND_ASSIGN(std::shared_ptr<Storage> s,
                            OpenStorage(root, Lookup(env)));
  absl::Status status = SaveOne(s.get(), root, {1, 2});
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kPermissionDenied, root));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr(secret)));
  EXPECT_THAT(std::string(status.message()),
              Not(HasSubstr("sessionTokenThatMustNotLeak")));
  ReaderOptions ro;
  ro.storage = s.get();
  // Refused too (a HEAD's answer has no body to say why: moto's 400 for
  // the bad token is InvalidArgument there), and never with the secrets.
  auto reader = Reader::Open(root, ro);
  EXPECT_FALSE(reader.ok());
  EXPECT_THAT(std::string(reader.status().message()), Not(HasSubstr(secret)));
  EXPECT_THAT(std::string(reader.status().message()),
              Not(HasSubstr("sessionTokenThatMustNotLeak")));
}

TEST(UrlStorage, CallsAndTraitsGoByPath) {
  CKPT_S3_SERVER_OR_SKIP(server);
  // Read at the first s3:// call, in this process.
  for (const auto& [name, value] : ServerEnv(*server)) {
    ASSERT_EQ(::setenv(name.c_str(), value.c_str(), 1), 0);
  }
  Storage* storage = UrlStorage();
  ASSERT_EQ(storage, UrlStorage());
  const std::string s3_root = absl::StrCat("s3://", Bucket(*server), "/run");
  ::ckpt::testing::TempDir local;
  EXPECT_TRUE(storage->traits(local.path()).atomic_rename);
  EXPECT_FALSE(storage->traits(s3_root).atomic_rename);
  const std::vector<float> a = {1, 2, 3}, b = {4, 5, 6};
  CKPT_ASSERT_OK(SaveOne(storage, s3_root, a));
  CKPT_ASSERT_OK(SaveOne(storage, local.path(), b));
  for (const auto& [root, want] : {std::pair{s3_root, a}, {local.path(), b}}) {
    ReaderOptions ro;
    ro.storage = storage;
    CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(root, ro));
    std::vector<float> back(3);
    CKPT_ASSERT_OK(
        reader
            ->Load({{"w", DType::kFloat32, {3}, FlatRange{0, 3}, back.data()}})
            .status());
    EXPECT_EQ(back, want) << root;
  }
  // The local save is a directory with the POSIX layout.
  CKPT_ASSERT_OK_AND_ASSIGN(
      FileInfo info,
      storage->Stat(local.path() + "/step-00000001/shard-00000.ckpt"));
  EXPECT_FALSE(info.is_dir);
}

}  // namespace
}  // namespace ckpt
