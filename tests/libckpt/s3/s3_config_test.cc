#include "s3/s3_config.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace ckpt::s3 {
namespace {

using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(S3Url, Parses) {
  auto u = ParseS3Url("s3://my-bucket/run/a b/step-1/");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->bucket, "my-bucket");
  EXPECT_EQ(u->key, "run/a b/step-1/");
  EXPECT_EQ(u->ToString(), "s3://my-bucket/run/a b/step-1/");
  u = ParseS3Url("s3://my.bucket.1");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->key, "");
  EXPECT_EQ(u->ToString(), "s3://my.bucket.1");
  EXPECT_TRUE(IsS3Url("s3://x"));
  EXPECT_FALSE(IsS3Url("/tmp/s3://x"));
  EXPECT_FALSE(IsS3Url("S3://x"));
}

TEST(S3Url, ErrorsSayWhatIsWrong) {
  EXPECT_THAT(ParseS3Url("/local/path"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not an S3 URL"));
  EXPECT_THAT(ParseS3Url("s3:///prefix"),
              StatusIs(absl::StatusCode::kInvalidArgument, "names no bucket"));
  EXPECT_THAT(ParseS3Url("s3://My_Bucket/x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "contains 'M'"));
  EXPECT_THAT(ParseS3Url("s3://ab/x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "wrong length"));
  EXPECT_THAT(
      ValidateBucketName("-abc"),
      StatusIs(absl::StatusCode::kInvalidArgument, "does not start and end"));
  EXPECT_THAT(ValidateBucketName("a..b"),
              StatusIs(absl::StatusCode::kInvalidArgument, "contains '..'"));
  EXPECT_THAT(ValidateBucketName("192.168.1.1"),
              StatusIs(absl::StatusCode::kInvalidArgument, "IP address"));
  EXPECT_TRUE(ValidateBucketName(std::string(63, 'a')).ok());
  EXPECT_FALSE(ValidateBucketName(std::string(64, 'a')).ok());
}

TEST(Endpoint, Parses) {
  auto e = ParseEndpoint("http://127.0.0.1:9000");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_FALSE(e->https);
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 9000);
  EXPECT_EQ(e->HostHeader(), "127.0.0.1:9000");
  e = ParseEndpoint("https://S3.eu-west-1.amazonaws.com/");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->https);
  EXPECT_EQ(e->HostHeader(), "s3.eu-west-1.amazonaws.com");
  e = ParseEndpoint("http://[::1]:5000");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->HostHeader(), "[::1]:5000");
  for (const char* bad :
       {"127.0.0.1:9000", "ftp://h", "http://", "http://h:x", "http://h:0",
        "http://h/path", "http://u@h", "http://h:"}) {
    EXPECT_THAT(ParseEndpoint(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, "endpoint"))
        << bad;
  }
}

class Env {
 public:
  Env(std::initializer_list<std::pair<const std::string, std::string>> vars)
      : vars_(vars) {}
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

TEST(ClientOptionsFromEnv, AwsConventions) {
  Env env{{"AWS_ENDPOINT_URL", "http://generic:1"},
          {"AWS_ENDPOINT_URL_S3", "http://s3only:2"},
          {"AWS_ACCESS_KEY_ID", "AKID"},
          {"AWS_SECRET_ACCESS_KEY", "SECRET"},
          {"AWS_SESSION_TOKEN", "TOKEN"},
          {"AWS_DEFAULT_REGION", "eu-west-1"},
          {"AWS_REGION", "eu-central-1"},
          {"CKPT_S3_ADDRESSING", "virtual"}};
  auto o = ClientOptionsFromEnv(env.lookup());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint, "http://s3only:2");  // the S3-specific one wins
  EXPECT_EQ(o->credentials.access_key_id, "AKID");
  EXPECT_EQ(o->credentials.secret_access_key, "SECRET");
  EXPECT_EQ(o->credentials.session_token, "TOKEN");
  EXPECT_EQ(o->region, "eu-central-1");  // AWS_REGION before the default
  EXPECT_EQ(o->addressing, Addressing::kVirtual);
}

TEST(ClientOptionsFromEnv, Defaults) {
  Env env{{"AWS_ENDPOINT_URL", "http://generic:1"},
          {"AWS_DEFAULT_REGION", "ap-south-1"}};
  auto o = ClientOptionsFromEnv(env.lookup());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint, "http://generic:1");
  EXPECT_EQ(o->region, "ap-south-1");
  EXPECT_TRUE(o->credentials.anonymous());
  EXPECT_EQ(o->addressing, Addressing::kAuto);
  o = ClientOptionsFromEnv(Env{}.lookup());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint, "");  // AWS itself
  EXPECT_EQ(o->region, "us-east-1");
}

// Errors name the variable, never a secret's value.
TEST(ClientOptionsFromEnv, ErrorsNameTheVariableNotTheSecret) {
  auto o = ClientOptionsFromEnv(
      Env{{"AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI-SECRET"}}.lookup());
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument,
                          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"));
  EXPECT_THAT(std::string(o.status().message()),
              Not(HasSubstr("wJalrXUtnFEMI-SECRET")));
  o = ClientOptionsFromEnv(Env{{"AWS_SESSION_TOKEN", "TOKEN-VALUE"}}.lookup());
  EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument,
                          "AWS_SESSION_TOKEN is set without"));
  EXPECT_THAT(std::string(o.status().message()), Not(HasSubstr("TOKEN-VALUE")));
  EXPECT_THAT(ClientOptionsFromEnv(
                  Env{{"AWS_ENDPOINT_URL_S3", "localhost:9000"}}.lookup()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "AWS_ENDPOINT_URL_S3: endpoint 'localhost:9000'"));
  EXPECT_THAT(
      ClientOptionsFromEnv(Env{{"CKPT_S3_ADDRESSING", "dns"}}.lookup()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "CKPT_S3_ADDRESSING: 'dns' is not one of path, virtual, auto"));
  EXPECT_THAT(
      ClientOptionsFromEnv(Env{{"AWS_REGION", "us east"}}.lookup()),
      StatusIs(absl::StatusCode::kInvalidArgument, "is not a region name"));
}

}  // namespace
}  // namespace ckpt::s3
