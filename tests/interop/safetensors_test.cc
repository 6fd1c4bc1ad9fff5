// The safetensors header codec and the Hugging Face index: round trips,
// one test per violation the reference implementation rejects, and the
// reference implementation's own sample files (tests/data/interop/
// safetensors/, copied byte for byte from its test suite's output).
#include "ckpt/interop/safetensors.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/interop/strict_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace ckpt::interop {
namespace {

using ::ckpt::testing::StatusIs;

// Decodes a whole file image.
absl::StatusOr<SafetensorsHeader> DecodeImage(const std::string& image) {
  auto n = DecodeSafetensorsHeaderLength(image, image.size());
  if (!n.ok()) return n.status();
  auto h = DecodeSafetensorsHeader(absl::string_view(image).substr(8, *n),
                                   image.size() - 8 - *n);
  if (h.ok()) h->data_offset = 8 + *n;
  return h;
}

std::string Image(const std::string& json, uint64_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, DTypeNamesRoundTripForEveryCkptDType) {
  for (DType d : kAllDTypes) {
    CKPT_ASSERT_OK_AND_ASSIGN(DType back,
                              DTypeFromSafetensors(SafetensorsDTypeName(d)));
    EXPECT_EQ(back, d);
  }
  EXPECT_EQ(SafetensorsDTypeName(DType::kBFloat16), "BF16");
  EXPECT_EQ(SafetensorsDTypeName(DType::kFloat8E4M3FN), "F8_E4M3");
  EXPECT_EQ(SafetensorsDTypeName(DType::kBool), "BOOL");
}

// Every dtype of the reference implementation (safetensors 0.8.0's Dtype
// enum) that ckpt has no type for: a valid file, refused by name.
TEST(SafetensorsTest, ForeignOnlyDTypeIsFailedPrecondition) {
  for (const char* name : {"F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "C64",
                           "F8_E4M3FNUZ", "F8_E5M2FNUZ"}) {
    EXPECT_THAT(
        DTypeFromSafetensors(name),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 absl::StrCat("dtype ", name, " has no ckpt equivalent")));
  }
  EXPECT_THAT(
      DTypeFromSafetensors("F33"),
      StatusIs(absl::StatusCode::kInvalidArgument, "unknown dtype 'F33'"));
}

TEST(SafetensorsTest, EncodeDecodeRoundTrip) {
  std::vector<SafetensorsTensor> ts = {
      {"b.w", DType::kBFloat16, {2, 3}, 0, 12},
      {"a", DType::kFloat8E5M2, {}, 12, 13},
      {"empty", DType::kFloat32, {0, 4}, 13, 13}};
  CKPT_ASSERT_OK_AND_ASSIGN(
      std::string head,
      EncodeSafetensorsHeader(ts, {{"format", "pt"}, {"k", "v"}}));
  EXPECT_EQ(head.size() % 8, 0u);
  CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsHeader h,
                            DecodeImage(head + std::string(13, 'x')));
  EXPECT_EQ(h.data_offset, head.size());
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "b.w");
  EXPECT_EQ(h.tensors[0].shape, Shape({2, 3}));
  EXPECT_EQ(h.tensors[1].name, "a");
  EXPECT_EQ(h.tensors[1].dtype, DType::kFloat8E5M2);
  EXPECT_EQ(h.tensors[1].shape, Shape{});
  EXPECT_EQ(h.tensors[2].begin, 13u);
  EXPECT_EQ(h.metadata, (std::vector<std::pair<std::string, std::string>>{
                            {"format", "pt"}, {"k", "v"}}));
  // The JSON starts with __metadata__, as the reference writes it.
  EXPECT_EQ(head.substr(8, 16), "{\"__metadata__\":");
}

TEST(SafetensorsTest, EncodeRejectsNonUtf8Name) {
  EXPECT_THAT(EncodeSafetensorsHeader({{"\xff", DType::kUInt8, {1}, 0, 1}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not valid UTF-8"));
}

TEST(SafetensorsTest, HeaderLengthBeyondLimit) {
  std::string image(16, '\0');
  const uint64_t n = kSafetensorsMaxHeader + 1;
  std::memcpy(image.data(), &n, 8);
  EXPECT_THAT(DecodeSafetensorsHeaderLength(image, 1ull << 40),
              StatusIs(absl::StatusCode::kDataLoss,
                       "exceeds the limit of 100000000 bytes"));
}

TEST(SafetensorsTest, HeaderLengthPastEndOfFile) {
  std::string image = Image("{}", 0);
  image[0] = 100;
  EXPECT_THAT(DecodeSafetensorsHeaderLength(image, image.size()),
              StatusIs(absl::StatusCode::kDataLoss,
                       "header length 100 runs past the end"));
}

TEST(SafetensorsTest, FileShorterThanLength) {
  EXPECT_THAT(DecodeSafetensorsHeaderLength("abc", 3),
              StatusIs(absl::StatusCode::kDataLoss, "too short"));
}

TEST(SafetensorsTest, HeaderNotStartingWithBrace) {
  EXPECT_THAT(DecodeImage(Image(" {}", 0)),
              StatusIs(absl::StatusCode::kDataLoss, "does not start with '{'"));
}

TEST(SafetensorsTest, MalformedJson) {
  EXPECT_THAT(
      DecodeImage(Image("{\"a\":", 0)),
      StatusIs(absl::StatusCode::kDataLoss, "not well-formed UTF-8 JSON"));
}

// The reference implementation (safetensors 0.8.0, serde_json) refuses a
// header padded with NUL bytes, or holding one anywhere; nlohmann's lexer
// alone would stop at the first NUL and ignore what follows it.
TEST(SafetensorsTest, NulByteInHeader) {
  const std::string t =
      R"("x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  for (const std::string& json :
       {"{" + t + "}" + std::string(6, '\0'),
        "{" + t + "}" + std::string(1, '\0') + "trailing garbage",
        "{" + t + std::string(1, '\0') + ",\"y\":1}"}) {
    EXPECT_THAT(DecodeImage(Image(json, 1)),
                StatusIs(absl::StatusCode::kDataLoss,
                         "header is not well-formed UTF-8 JSON: a NUL byte"));
  }
  EXPECT_THAT(DecodeHfIndex(std::string(R"({"weight_map":{}})") +
                            std::string(1, '\0') + "x"),
              StatusIs(absl::StatusCode::kDataLoss,
                       "index is not well-formed UTF-8 JSON: a NUL byte"));
}

TEST(SafetensorsTest, InvalidUtf8InHeader) {
  EXPECT_THAT(
      DecodeImage(Image("{\"\xc3\x28\":{}}", 0)),
      StatusIs(absl::StatusCode::kDataLoss, "not well-formed UTF-8 JSON"));
}

TEST(SafetensorsTest, DuplicateKey) {
  const std::string t = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_THAT(DecodeImage(Image("{\"x\":" + t + ",\"x\":" + t + "}", 1)),
              StatusIs(absl::StatusCode::kDataLoss, "has the key 'x' twice"));
}

TEST(SafetensorsTest, UnknownDType) {
  EXPECT_THAT(
      DecodeImage(
          Image(R"({"x":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}})", 1)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "tensor 'x': unknown dtype 'Q8'"));
}

// A dtype string, a tensor name and a duplicate key from the header are
// quoted escaped (format::EscapeText): no ESC, C1 control or other control
// byte of the file reaches the message.
TEST(SafetensorsTest, ErrorsQuoteHeaderStringsEscaped) {
  EXPECT_THAT(
      DecodeImage(
          Image(R"({"x\u009b":{"dtype":"F\u001b]52;c;aGk=\u0007","shape":[1],)"
                R"("data_offsets":[0,1]}})",
                1)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "tensor 'x\\u009b': unknown dtype 'F\\x1b]52;c;aGk=\\x07'"));
  EXPECT_THAT(
      DecodeImage(Image(R"({"y\n\u001b[2J":{"dtype":"U8","shape":["\u009b"],)"
                        R"("data_offsets":[0,1]}})",
                        1)),
      StatusIs(absl::StatusCode::kDataLoss,
               "tensor 'y\\x0a\\x1b[2J': a dim is not a non-negative integer: "
               "\"\\u009b\""));
  const std::string t = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_THAT(
      DecodeImage(Image("{\"\\u001b\":" + t + ",\"\\u001b\":" + t + "}", 1)),
      StatusIs(absl::StatusCode::kDataLoss, "has the key '\\x1b' twice"));
}

TEST(SafetensorsTest, NegativeDim) {
  EXPECT_THAT(
      DecodeImage(Image(
          R"({"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1)),
      StatusIs(absl::StatusCode::kDataLoss,
               "a dim is not a non-negative integer"));
}

TEST(SafetensorsTest, OffsetsNotContiguous) {
  EXPECT_THAT(
      DecodeImage(
          Image(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2)),
      StatusIs(absl::StatusCode::kDataLoss,
               "not contiguous (expected begin 0)"));
}

TEST(SafetensorsTest, OffsetsOverlap) {
  EXPECT_THAT(DecodeImage(Image(
                  R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                  R"("y":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                  3)),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'y': data_offsets [1, 3] are not contiguous"));
}

TEST(SafetensorsTest, ByteCountDiffersFromShape) {
  EXPECT_THAT(
      DecodeImage(Image(
          R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4)),
      StatusIs(absl::StatusCode::kDataLoss,
               "4 bytes in data_offsets [0, 4] != 8 bytes"));
}

TEST(SafetensorsTest, DataNotCovered) {
  EXPECT_THAT(
      DecodeImage(
          Image(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 2)),
      StatusIs(absl::StatusCode::kDataLoss,
               "cover 1 bytes of the data, which holds 2"));
}

TEST(SafetensorsTest, ShapeOverflow) {
  EXPECT_THAT(DecodeImage(Image(
                  R"({"x":{"dtype":"F64","shape":[4294967296,4294967296],)"
                  R"("data_offsets":[0,1]}})",
                  1)),
              StatusIs(absl::StatusCode::kDataLoss, "overflows"));
}

// Issue 28 §3: a foreign shape goes through ckpt's own shape check. A zero
// dim makes the byte count 0 whatever the other dims, so a dim of 2^64 - 1
// passed the reference's check; ckpt refuses it, and more than 32 dims.
TEST(SafetensorsTest, DimBeyondInt64IsRefusedEvenBesideAZeroDim) {
  EXPECT_THAT(DecodeImage(Image(
                  R"({"x":{"dtype":"U8","shape":[0,18446744073709551615],)"
                  R"("data_offsets":[0,0]}})",
                  0)),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'x': shape [0, 18446744073709551615]: dim "
                       "18446744073709551615 exceeds int64"));
}

TEST(SafetensorsTest, MoreThan32DimsAreRefused) {
  std::string dims = "1";
  for (int i = 1; i < 33; ++i) dims += ",1";
  EXPECT_THAT(
      DecodeImage(Image(absl::StrCat(R"({"x":{"dtype":"U8","shape":[)", dims,
                                     R"(],"data_offsets":[0,1]}})"),
                        1)),
      StatusIs(absl::StatusCode::kDataLoss,
               "tensor 'x': shape has 33 dims; the limit is 32"));
}

// Issue 28: JSON of millions of tiny values ("[]," becomes ~80 bytes of
// nodes) took 26 bytes of memory per byte of a 95 MB header. What a parse
// keeps is counted as it goes, within 16 bytes per byte + 64 MiB by
// default; past its budget nothing more is kept and the parse is refused.
TEST(StrictJsonTest, ParseBeyondItsMemoryBudgetIsRefused) {
  std::string text = "[[]";
  for (int i = 0; i < 100000; ++i) text += ",[]";
  text += "]";
  EXPECT_THAT(ParseStrictJson(text, "header", 1 << 20),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "header of 300004 bytes would take more than 1048576 "
                       "bytes of memory to parse"));
  CKPT_EXPECT_OK(ParseStrictJson(text, "header", 16 << 20).status());
  EXPECT_EQ(kJsonBudgetPerByte, 16u);
  EXPECT_EQ(kJsonBudgetFixed, 64u << 20);
}

TEST(SafetensorsTest, MetadataValueNotString) {
  EXPECT_THAT(
      DecodeImage(Image(R"({"__metadata__":{"a":1}})", 0)),
      StatusIs(absl::StatusCode::kDataLoss, "value of 'a' is not a string"));
}

TEST(SafetensorsTest, NestingTooDeep) {
  EXPECT_THAT(
      DecodeImage(Image(
          "{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", 0)),
      StatusIs(absl::StatusCode::kDataLoss, "nests deeper than 64"));
}

// The reference implementation's sample files: nine one-tensor files and
// one with all nine, each tensor [-3, -2, -1, 0, 1, 2] in its dtype
// (unsigned: wrapped), metadata {"test": "a"}.
TEST(SafetensorsTest, ReferenceSampleFilesReadExactly) {
  const std::string dir =
      std::string(CKPT_SOURCE_DIR) + "/tests/data/interop/safetensors/";
  const std::string image =
      ::ckpt::testing::ReadFileBytes(dir + "overall.safetensors");
  ASSERT_EQ(image.size(), 702u);
  CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsHeader h, DecodeImage(image));
  EXPECT_EQ(h.metadata,
            (std::vector<std::pair<std::string, std::string>>{{"test", "a"}}));
  ASSERT_EQ(h.tensors.size(), 9u);
  const char* names[] = {"B", "H", "I", "b", "d", "e", "f", "h", "i"};
  const DType dtypes[] = {DType::kUInt8,   DType::kUInt16,  DType::kUInt32,
                          DType::kInt8,    DType::kFloat64, DType::kFloat16,
                          DType::kFloat32, DType::kInt16,   DType::kInt32};
  for (int i = 0; i < 9; ++i) {
    const SafetensorsTensor& t = h.tensors[i];
    EXPECT_EQ(t.name, names[i]);
    EXPECT_EQ(t.dtype, dtypes[i]);
    EXPECT_EQ(t.shape, Shape{6});
    const char* p = image.data() + h.data_offset + t.begin;
    for (int k = 0; k < 6; ++k) {
      const int want = k - 3;
      double got = 0;
      switch (t.dtype) {
        case DType::kUInt8:
          got = static_cast<int8_t>(p[k]);
          break;
        case DType::kInt8:
          got = static_cast<int8_t>(p[k]);
          break;
        case DType::kUInt16:
        case DType::kInt16: {
          int16_t v;
          std::memcpy(&v, p + 2 * k, 2);
          got = v;
          break;
        }
        case DType::kUInt32:
        case DType::kInt32: {
          int32_t v;
          std::memcpy(&v, p + 4 * k, 4);
          got = v;
          break;
        }
        case DType::kFloat32: {
          float v;
          std::memcpy(&v, p + 4 * k, 4);
          got = v;
          break;
        }
        case DType::kFloat64: {
          double v;
          std::memcpy(&v, p + 8 * k, 8);
          got = v;
          break;
        }
        case DType::kFloat16: {
          uint16_t v;
          std::memcpy(&v, p + 2 * k, 2);
          // -3..2 in IEEE half: sign, exponent and the top mantissa bits.
          const uint16_t want16[] = {0xc200, 0xc000, 0xbc00,
                                     0x0000, 0x3c00, 0x4000};
          EXPECT_EQ(v, want16[k]) << t.name << "[" << k << "]";
          got = want;
          break;
        }
        default:
          FAIL() << "unexpected dtype";
      }
      EXPECT_EQ(got, want) << t.name << "[" << k << "]";
    }
  }
  // Each single-tensor file holds the same tensor.
  for (int i = 0; i < 9; ++i) {
    const std::string one =
        ::ckpt::testing::ReadFileBytes(dir + names[i] + ".safetensors");
    CKPT_ASSERT_OK_AND_ASSIGN(SafetensorsHeader s, DecodeImage(one));
    ASSERT_EQ(s.tensors.size(), 1u);
    EXPECT_EQ(s.tensors[0].dtype, dtypes[i]);
    const SafetensorsTensor& t = h.tensors[i];
    EXPECT_EQ(one.substr(s.data_offset),
              image.substr(h.data_offset + t.begin, t.end - t.begin));
  }
}

TEST(HfIndexTest, RoundTrip) {
  HfIndex in;
  in.total_size = 1234;
  in.weight_map = {{"b", "model-00002-of-00002.safetensors"},
                   {"a", "model-00001-of-00002.safetensors"}};
  CKPT_ASSERT_OK_AND_ASSIGN(HfIndex out, DecodeHfIndex(EncodeHfIndex(in)));
  EXPECT_TRUE(out.has_total_size);
  EXPECT_EQ(out.total_size, 1234u);
  EXPECT_EQ(out.weight_map[0].first, "a");
  EXPECT_EQ(out.files,
            (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(HfShardName(0, 3), "model-00001-of-00003.safetensors");
}

TEST(HfIndexTest, FileOutsideTheDirectory) {
  for (const char* f :
       {"../x.safetensors", "/etc/passwd", "sub/x.safetensors", "..", ""}) {
    EXPECT_THAT(
        DecodeHfIndex(std::string(R"({"weight_map":{"w":")") + f + "\"}}"),
        StatusIs(absl::StatusCode::kDataLoss,
                 "not a file inside the index's directory"))
        << f;
  }
}

TEST(HfIndexTest, MissingWeightMap) {
  EXPECT_THAT(DecodeHfIndex(R"({"metadata":{}})"),
              StatusIs(absl::StatusCode::kDataLoss, "no weight_map"));
}

TEST(ParseByteSizeTest, UnitsAsTransformers) {
  EXPECT_EQ(*ParseByteSize("5GB"), 5000000000u);
  EXPECT_EQ(*ParseByteSize("500MiB"), 500ull << 20);
  EXPECT_EQ(*ParseByteSize("10kb"), 10000u);
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_THAT(ParseByteSize("0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'0'"));
  EXPECT_THAT(ParseByteSize("five"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'five'"));
}

}  // namespace
}  // namespace ckpt::interop
