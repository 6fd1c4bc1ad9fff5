#include "ckpt/gpu/status_macros.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::gpu {
namespace {

using ::testing::HasSubstr;

absl::Status Returns(cudaError_t err) {
  CKPT_CUDA_RETURN_IF_ERROR(err);
  return absl::OkStatus();
}

absl::StatusOr<int> ReturnsOr(cudaError_t err) {
  CKPT_CUDA_RETURN_IF_ERROR(err);
  return 7;
}

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(Returns(cudaSuccess).ok());
  auto v = ReturnsOr(cudaSuccess);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
}

TEST(CudaStatusTest, MessageNamesCallSiteAndCudaError) {
  absl::Status s = Returns(cudaErrorInvalidValue);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("err failed at status_macros_test.cc:"));
  EXPECT_THAT(s.message(), HasSubstr("cudaErrorInvalidValue"));
  EXPECT_THAT(s.message(),
              HasSubstr(cudaGetErrorString(cudaErrorInvalidValue)));
}

TEST(CudaStatusTest, WorksInStatusOrFunctions) {
  auto v = ReturnsOr(cudaErrorMemoryAllocation);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(CudaStatusTest, MissingDeviceOrDriverIsFailedPrecondition) {
  for (cudaError_t err :
       {cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorStubLibrary}) {
    EXPECT_TRUE(internal::IsNoDeviceError(err));
    EXPECT_EQ(Returns(err).code(), absl::StatusCode::kFailedPrecondition)
        << cudaGetErrorName(err);
  }
  EXPECT_FALSE(internal::IsNoDeviceError(cudaErrorInvalidValue));
  EXPECT_FALSE(internal::IsNoDeviceError(cudaSuccess));
}

TEST(CudaStatusTest, EvaluatesExpressionOnce) {
  int calls = 0;
  auto f = [&]() -> absl::Status {
    CKPT_CUDA_RETURN_IF_ERROR((++calls, cudaErrorInvalidValue));
    return absl::OkStatus();
  };
  EXPECT_FALSE(f().ok());
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace ckpt::gpu
