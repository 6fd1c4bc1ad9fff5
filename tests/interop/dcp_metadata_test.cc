// DCP metadata decoded from the committed fixtures: real torch 2.13 output
// (tests/data/interop/dcp_torch213*, written by make_dcp.py real) and real
// torch 1.13 output (dcp_torch113, the legacy layout); and the merge of
// rank-local metadata.
#include "ckpt/interop/dcp_metadata.h"

#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/dcp_pickle.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace ckpt::interop {
namespace {

using ::ckpt::testing::StatusIs;

std::string Data(const std::string& name) {
  return ::ckpt::testing::ReadFileBytes(std::string(CKPT_SOURCE_DIR) +
                                        "/tests/data/interop/" + name);
}

void ExpectFixtureTensors(const DcpMetadata& m) {
  ASSERT_EQ(m.tensors.size(), 5u);
  EXPECT_EQ(m.tensors[0].fqn, "model.norm");
  EXPECT_EQ(m.tensors[0].dtype, DType::kBFloat16);
  EXPECT_EQ(m.tensors[0].size, Shape{7});
  const DcpTensor& cols = m.tensors[1];
  EXPECT_EQ(cols.fqn, "model.w_cols");
  EXPECT_EQ(cols.dtype, DType::kInt32);
  ASSERT_EQ(cols.chunks.size(), 2u);
  EXPECT_EQ(cols.chunks[1].offsets, (Dims{0, 2}));
  EXPECT_EQ(cols.chunks[1].sizes, (Dims{4, 4}));
  EXPECT_EQ(m.tensors[3].fqn, "model.w_uneven");
  EXPECT_EQ(m.tensors[3].dtype, DType::kFloat64);
  EXPECT_EQ(m.tensors[4].fqn, "opt.step_count");
  EXPECT_EQ(m.tensors[4].size, Shape{});
  EXPECT_EQ(m.bytes_items, std::vector<std::string>{"extra.note"});
  EXPECT_EQ(m.storage.size(), 9u);  // 8 chunks + 1 bytes item
}

TEST(DcpMetadataTest, Torch113Layout) {
  CKPT_ASSERT_OK_AND_ASSIGN(DcpMetadata m,
                            DecodeDcpMetadata(Data("dcp_torch113/.metadata")));
  EXPECT_EQ(m.module, "torch.distributed._shard.checkpoint.metadata");
  EXPECT_EQ(m.version, "");
  EXPECT_FALSE(m.has_storage_meta);
  ExpectFixtureTensors(m);
  for (const DcpStorage& s : m.storage) {
    EXPECT_THAT(s.relative_path,
                ::testing::MatchesRegex("__[01]_[0-9]+\\.distcp"));
    EXPECT_EQ(s.offset, 0u);  // 1.13 writes one file per item
  }
}

// The tensors of make_dcp.py real (DTensors on 2 ranks), as torch 2.13's
// global metadata lists them.
void ExpectTorch213Tensors(const DcpMetadata& m) {
  ASSERT_EQ(m.tensors.size(), 6u);
  EXPECT_EQ(m.tensors[0].fqn, "model.norm");  // Replicate(): one chunk
  EXPECT_EQ(m.tensors[0].dtype, DType::kBFloat16);
  ASSERT_EQ(m.tensors[0].chunks.size(), 1u);
  EXPECT_EQ(m.tensors[0].chunks[0].sizes, Dims{7});
  const DcpTensor& tiny = m.tensors[1];  // Shard(0) of 1 row on 2 ranks
  EXPECT_EQ(tiny.fqn, "model.tiny");
  ASSERT_EQ(tiny.chunks.size(), 2u);
  EXPECT_EQ(tiny.chunks[1].offsets, (Dims{1, 0}));
  EXPECT_EQ(tiny.chunks[1].sizes, (Dims{0, 3}));
  const DcpTensor& cols = m.tensors[2];  // Shard(1)
  EXPECT_EQ(cols.fqn, "model.w_cols");
  EXPECT_EQ(cols.dtype, DType::kInt32);
  ASSERT_EQ(cols.chunks.size(), 2u);
  EXPECT_EQ(cols.chunks[1].offsets, (Dims{0, 3}));
  EXPECT_EQ(cols.chunks[1].sizes, (Dims{4, 3}));
  const DcpTensor& uneven = m.tensors[4];  // Shard(0), 5 rows: 3 + 2
  EXPECT_EQ(uneven.fqn, "model.w_uneven");
  EXPECT_EQ(uneven.dtype, DType::kFloat64);
  ASSERT_EQ(uneven.chunks.size(), 2u);
  EXPECT_EQ(uneven.chunks[1].offsets, (Dims{3, 0}));
  EXPECT_EQ(uneven.chunks[1].sizes, (Dims{2, 3}));
  EXPECT_EQ(m.tensors[5].fqn, "opt.step_count");
  EXPECT_EQ(m.tensors[5].size, Shape{});
  // The dict {"note": {"epoch": 3, "name": "fixture"}}, flattened by DCP.
  EXPECT_EQ(m.bytes_items,
            (std::vector<std::string>{"extra.note.epoch", "extra.note.name"}));
  EXPECT_EQ(m.storage.size(), 12u);  // 10 chunks + 2 bytes items
}

TEST(DcpMetadataTest, Torch213Layout) {
  CKPT_ASSERT_OK_AND_ASSIGN(DcpMetadata m,
                            DecodeDcpMetadata(Data("dcp_torch213/.metadata")));
  EXPECT_EQ(m.module, "torch.distributed.checkpoint.metadata");
  EXPECT_EQ(m.version, "1.0.0");
  EXPECT_EQ(m.rank_local_files, 0);
  EXPECT_TRUE(m.has_storage_meta);
  // StorageMeta.checkpoint_id is the writer's path, a pathlib.PosixPath.
  EXPECT_EQ(m.checkpoint_id, "dcp_torch213");
  EXPECT_TRUE(m.has_planner_data);
  ExpectTorch213Tensors(m);
  // One concatenated file per rank, items addressed by offset and length;
  // _StorageInfo pickles no transform_descriptors when there are none.
  std::map<std::string, int> items;
  for (const DcpStorage& s : m.storage) {
    ++items[s.relative_path];
    EXPECT_TRUE(s.transform_descriptors.empty());
  }
  EXPECT_EQ(items.size(), 2u);
  EXPECT_EQ(items["__0_0.distcp"] + items["__1_0.distcp"], 12);
}

// Real megatron-core 0.16.1 output (megatron_torch_dist_real/, written by
// make_megatron.py): Metadata carries all_local_plans (a SavePlan per rank),
// planner_data None, MetadataIndex.index None and _StorageInfo
// transform_descriptors None; FileSystemWriterAsync(thread_count=2) spreads
// each rank's items over __<rank>_0.distcp and __<rank>_1.distcp.
TEST(DcpMetadataTest, MegatronCore016Layout) {
  CKPT_ASSERT_OK_AND_ASSIGN(
      DcpMetadata m,
      DecodeDcpMetadata(Data("megatron_torch_dist_real/.metadata")));
  EXPECT_EQ(m.module, "torch.distributed.checkpoint.metadata");
  EXPECT_EQ(m.version, "1.0.0");
  EXPECT_TRUE(m.has_storage_meta);
  EXPECT_EQ(m.checkpoint_id, "megatron_torch_dist_real");  // a str here
  EXPECT_FALSE(m.has_planner_data);
  EXPECT_EQ(m.all_local_plans, std::optional<size_t>(2));
  ASSERT_EQ(m.tensors.size(), 5u);
  EXPECT_EQ(m.tensors[1].fqn, "model.w_cols");  // 2 + 4 columns
  ASSERT_EQ(m.tensors[1].chunks.size(), 2u);
  EXPECT_EQ(m.tensors[1].chunks[1].offsets, (Dims{0, 2}));
  EXPECT_EQ(m.tensors[1].chunks[1].sizes, (Dims{4, 4}));
  // The ShardedObject "extra.note" of global shape (1,), as Megatron keys it.
  EXPECT_EQ(m.bytes_items, std::vector<std::string>{"extra.note/shard_0_1"});
  std::map<std::string, int> items;
  for (const DcpStorage& s : m.storage) {
    ++items[s.relative_path];
    EXPECT_TRUE(s.transform_descriptors.empty()) << s.fqn;
  }
  EXPECT_EQ(items, (std::map<std::string, int>{{"__0_0.distcp", 3},
                                               {"__0_1.distcp", 3},
                                               {"__1_0.distcp", 1},
                                               {"__1_1.distcp", 2}}));
}

// A Metadata pickle (protocol 2) whose all_local_plans is `plans` (pickle
// opcodes of one value).
std::string MetadataWithPlans(const std::string& plans) {
  using namespace std::string_literals;  // NUL bytes in the literals
  return "\x80\x02"
         "ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81}("
         "X\x13\0\0\0state_dict_metadata}"
         "X\x0c\0\0\0storage_data}"
         "X\x0f\0\0\0all_local_plans"s +
         plans +
         "\x8c\x07version\x8c\x05"
         "1.0.0ub.";
}

TEST(DcpMetadataTest, AllLocalPlansIsAListOfSavePlans) {
  // A pickle of the shape above is read (no plans: None, or an empty list).
  CKPT_ASSERT_OK_AND_ASSIGN(DcpMetadata none,
                            DecodeDcpMetadata(MetadataWithPlans("N")));
  EXPECT_EQ(none.all_local_plans, std::nullopt);
  EXPECT_EQ(none.version, "1.0.0");
  CKPT_ASSERT_OK_AND_ASSIGN(DcpMetadata empty,
                            DecodeDcpMetadata(MetadataWithPlans("]")));
  EXPECT_EQ(empty.all_local_plans, std::optional<size_t>(0));
  EXPECT_THAT(
      DecodeDcpMetadata(MetadataWithPlans("K\x05")),
      StatusIs(absl::StatusCode::kDataLoss, "all_local_plans is not a list"));
  EXPECT_THAT(DecodeDcpMetadata(MetadataWithPlans("]K\x01"
                                                  "a")),
              StatusIs(absl::StatusCode::kDataLoss,
                       "all_local_plans holds 1, not a SavePlan"));
}

// Megatron's ShardedObject keys "<key>/shard_<offset>_<shape>" and the
// ckpt entry names they take.
TEST(DcpMetadataTest, MegatronShardedObjectNames) {
  const std::pair<const char*, std::optional<std::string>> cases[] = {
      {"extra.note/shard_0_1", "extra.note"},  // one shard
      {"rng_state/shard_0.0_1.1", "rng_state"},
      {"rng_state/shard_0.1_1.2", "rng_state:shard_0.1_1.2"},
      {"opt/shard_3_8", "opt:shard_3_8"},
      {"legacy/shard_0.0_1", "legacy:shard_0.0_1"},  // offset one longer
      {"extra.note", std::nullopt},
      {"a/b", std::nullopt},
      {"/shard_0_1", std::nullopt},
      {"a/shard_0_1/x", std::nullopt},
      {"a/shard_0_1_2", std::nullopt},
      {"a/shard_0.0_1", "a:shard_0.0_1"},
      {"a/shard_0.0.0_1", std::nullopt},
      {"a/shard_x_1", std::nullopt},
      {"a/shard_0._1", std::nullopt},
      {"a/shard__1", std::nullopt},
      {"a/shard_-1_1", std::nullopt},
      {"a/shard_0_1x", std::nullopt},
  };
  for (const auto& [fqn, name] : cases) {
    EXPECT_EQ(MegatronShardedObjectName(fqn), name) << fqn;
  }
}

TEST(DcpMetadataTest, Torch213RankLocalMergesToTheGlobalLayout) {
  std::vector<DcpMetadata> ranks;
  for (const char* f : {"__0.metadata", "__1.metadata"}) {
    CKPT_ASSERT_OK_AND_ASSIGN(
        DcpMetadata m,
        DecodeDcpMetadata(Data(std::string("dcp_torch213_rank_local/") + f)));
    // Each rank lists every tensor, with only its own chunks.
    EXPECT_EQ(m.tensors.size(), 6u) << f;
    EXPECT_EQ(m.storage.size(), 8u) << f;
    ranks.push_back(std::move(m));
  }
  CKPT_ASSERT_OK_AND_ASSIGN(DcpMetadata m,
                            MergeRankLocalDcpMetadata(std::move(ranks)));
  EXPECT_EQ(m.rank_local_files, 2);
  EXPECT_EQ(m.checkpoint_id, "dcp_torch213_rank_local");
  ExpectTorch213Tensors(m);
  for (const DcpStorage& s : m.storage) {
    if (s.fqn == "model.norm" || s.fqn == "extra.note.epoch") {
      EXPECT_EQ(s.relative_path, "__0_0.distcp") << s.fqn;  // rank 0's copy
    }
  }
}

// Rank-local metadata with one tensor: `chunks` are (offset, size) of dim 0.
DcpMetadata OneTensorRank(const std::string& dtype, uint64_t rows,
                          std::vector<std::pair<uint64_t, uint64_t>> chunks) {
  DcpMetadata m;
  m.module = "torch.distributed.checkpoint.metadata";
  m.version = "1.0.0";
  DcpTensor t;
  t.fqn = "w";
  t.dtype_name = dtype;
  t.size = {rows};
  for (const auto& [offset, size] : chunks) {
    t.chunks.push_back({{offset}, {size}});
    m.storage.push_back({"w", Dims{offset}, "__0_0.distcp", 0, 8, {}});
  }
  m.tensors.push_back(std::move(t));
  return m;
}

TEST(DcpMetadataTest, RankLocalMergeRefusesDisagreeingRanks) {
  EXPECT_THAT(
      MergeRankLocalDcpMetadata({OneTensorRank("torch.float32", 4, {{0, 2}}),
                                 OneTensorRank("torch.float64", 4, {{2, 2}})}),
      StatusIs(absl::StatusCode::kDataLoss,
               "ranks 0 and 1 disagree: tensor 'w' is torch.float32 "
               "[4] on rank 0 and torch.float64 [4] on rank 1"));
  EXPECT_THAT(
      MergeRankLocalDcpMetadata({OneTensorRank("torch.float32", 4, {{0, 2}}),
                                 OneTensorRank("torch.float32", 4, {{0, 3}})}),
      StatusIs(absl::StatusCode::kDataLoss,
               "the chunk of 'w' at [0] has sizes [2] on rank 0 and "
               "[3] on rank 1"));
  DcpMetadata bytes;
  bytes.module = "torch.distributed.checkpoint.metadata";
  bytes.version = "1.0.0";
  bytes.bytes_items = {"w"};
  EXPECT_THAT(
      MergeRankLocalDcpMetadata(
          {OneTensorRank("torch.float32", 4, {{0, 4}}), std::move(bytes)}),
      StatusIs(absl::StatusCode::kDataLoss,
               "'w' is a tensor on rank 0 and a bytes item on rank 1"));
  EXPECT_THAT(MergeRankLocalDcpMetadata({}),
              StatusIs(absl::StatusCode::kDataLoss, "no rank-local metadata"));
}

TEST(DcpMetadataTest, RankLocalMergeKeepsReplicasOnce) {
  CKPT_ASSERT_OK_AND_ASSIGN(
      DcpMetadata m,
      MergeRankLocalDcpMetadata({OneTensorRank("torch.float32", 4, {{0, 4}}),
                                 OneTensorRank("torch.float32", 4, {{0, 4}}),
                                 OneTensorRank("torch.float32", 4, {{0, 4}})}));
  ASSERT_EQ(m.tensors.size(), 1u);
  EXPECT_EQ(m.tensors[0].chunks.size(), 1u);
  EXPECT_EQ(m.storage.size(), 1u);
  EXPECT_EQ(m.rank_local_files, 3);
}

// Issue 28 §3: a size of [2^32, 2^32] has 2^64 elements, which wrapped to
// 0 (an empty tensor, "covered" by no chunks). Every tensor's size goes
// through the format's own shape check before anything counts elements.
TEST(DcpMetadataTest, SizeWhoseElementCountOverflowsIsRefused) {
  namespace dp = ::ckpt::testing::dcp_pickle;
  EXPECT_THAT(
      DecodeDcpMetadata(dp::Metadata(
          {{"w", dp::Tensor({int64_t{1} << 32, int64_t{1} << 32}, "]")}})),
      StatusIs(absl::StatusCode::kDataLoss,
               "tensor 'w' (torch.float32): shape [4294967296, "
               "4294967296]: element count overflows int64"));
}

// Messages quote the names of the pickle through format::EscapeText.
TEST(DcpMetadataTest, ErrorsQuoteItemNamesEscaped) {
  namespace dp = ::ckpt::testing::dcp_pickle;
  EXPECT_THAT(DecodeDcpMetadata(dp::Metadata(
                  {{"w\x1b[2J\xc2\x9b",
                    dp::Tensor({int64_t{1} << 32, int64_t{1} << 32}, "]")}})),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'w\\x1b[2J\\u009b' (torch.float32): shape"));
}

TEST(DcpMetadataTest, SizeWhoseByteCountOverflowsIsRefused) {
  namespace dp = ::ckpt::testing::dcp_pickle;
  EXPECT_THAT(
      DecodeDcpMetadata(
          dp::Metadata({{"w", dp::Tensor({int64_t{1} << 62}, "]")}})),
      StatusIs(absl::StatusCode::kDataLoss,
               "tensor 'w' (torch.float32): shape [4611686018427387904]: byte "
               "count overflows int64"));
}

TEST(DcpMetadataTest, SizeOfMoreThan32DimsIsRefused) {
  namespace dp = ::ckpt::testing::dcp_pickle;
  EXPECT_THAT(DecodeDcpMetadata(dp::Metadata(
                  {{"w", dp::Tensor(std::vector<int64_t>(33, 1), "]")}})),
              StatusIs(absl::StatusCode::kDataLoss,
                       "size of 'w' has 33 dimensions; the limit is 32"));
}

// A chunk list that the pickle shares between tensors (one memo entry, a
// two-byte BINGET per tensor) is copied into each: what the decoder builds
// is charged to the pickle's memory budget, so 2000 tensors sharing a list
// of 1000 chunks (a 60 KB pickle, 2 * 10^6 chunks of 48 bytes: past the
// budget's fixed 64 MiB) are refused.
TEST(DcpMetadataTest, SharedChunkListsAreChargedToTheBudget) {
  namespace dp = ::ckpt::testing::dcp_pickle;
  std::string list = "](" + dp::Chunk({0}, {1}) + std::string("q\x01", 2);
  for (int i = 1; i < 1000; ++i) list += std::string("h\x01", 2);
  list += std::string("eq\x02", 3);
  std::vector<std::pair<std::string, std::string>> tensors = {
      {"t0", dp::Tensor({1}, list)}};
  for (int i = 1; i < 2000; ++i) {
    tensors.emplace_back(absl::StrCat("t", i),
                         dp::Tensor({1}, std::string("h\x02", 2)));
  }
  EXPECT_THAT(DecodeDcpMetadata(dp::Metadata(tensors)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "bytes of memory, the budget of decoding it"));
}

TEST(DcpMetadataTest, PickleCallingOsSystem) {
  EXPECT_THAT(DecodeDcpMetadata(Data("hostile/dcp_os_system/.metadata")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "pickle global 'posix.system' is not allowed"));
}

TEST(DcpMetadataTest, RootThatIsNotMetadata) {
  EXPECT_THAT(
      DecodeDcpMetadata(std::string("\x80\x02N.", 4)),
      StatusIs(absl::StatusCode::kDataLoss, "the root is None, not Metadata"));
}

TEST(DcpMetadataTest, TorchDtypes) {
  EXPECT_EQ(*DTypeFromTorch("torch.half"), DType::kFloat16);
  EXPECT_EQ(*DTypeFromTorch("torch.float8_e4m3fn"), DType::kFloat8E4M3FN);
  EXPECT_THAT(
      DTypeFromTorch("torch.complex64"),
      StatusIs(absl::StatusCode::kFailedPrecondition, "no ckpt equivalent"));
}

TEST(DcpMetadataTest, GatherStridedView) {
  // A transposed 2x3 view of a 3x2 storage [0..5].
  TorchTensorRef t;
  t.dtype = DType::kUInt8;
  t.storage_numel = 6;
  t.size = {2, 3};
  t.stride = {1, 2};
  CKPT_ASSERT_OK_AND_ASSIGN(std::string out,
                            GatherTensor(t, std::string("\0\1\2\3\4\5", 6)));
  EXPECT_EQ(out, std::string("\0\2\4\1\3\5", 6));
  t.storage_offset = 1;
  EXPECT_THAT(GatherTensor(t, std::string(6, '\0')),
              StatusIs(absl::StatusCode::kDataLoss,
                       "reaches element 6 of a storage of 6"));
}

}  // namespace
}  // namespace ckpt::interop
