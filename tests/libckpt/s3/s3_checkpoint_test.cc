// Checkpoints on S3 end to end, against moto: ranks in one process save
// through the public Writer with an S3Storage and load through the Reader on
// another number of ranks; the object-store commit protocol of
// spec/FORMAT.md §4.3 under a flipped byte, a save killed midway, the
// leftovers it leaves, two writers racing for one step, overwrite and
// pruning.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt/format/latest.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/testing/fault_injection.h"
#include "ckpt/testing/forwarding_storage.h"
#include "ckpt/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"
#include "s3/s3_storage.h"
#include "s3_test_server.h"
#include "testing/status_matchers.h"

namespace ckpt::s3 {
namespace {

using ::ckpt::s3::testing::NewBucket;
using ::ckpt::s3::testing::TestOptions;
using ::ckpt::testing::Extract;
using ::ckpt::testing::Layout;
using ::ckpt::testing::PieceOf;
using ::ckpt::testing::ReferenceBytes;
using ::ckpt::testing::StatusIs;
using ::testing::HasSubstr;

struct Tensor {
  std::string name;
  DType dtype;
  Shape shape;
  Layout saved, loaded;  // how ranks hold it when saving and when loading
  std::string global;
};

struct Model {
  std::vector<Tensor> tensors;
  std::map<std::string, std::string> objects;  // set by rank 0
};

// A few tensors, one of them over 5 MiB on one rank (a multipart upload),
// laid out differently for the load than for the save.
Model SmallModel(uint64_t seed) {
  Model m;
  auto add = [&](std::string name, DType dtype, Shape shape, Layout saved,
                 Layout loaded) {
    std::string global = ReferenceBytes(dtype, shape, seed + m.tensors.size());
    m.tensors.push_back({std::move(name), dtype, std::move(shape), saved,
                         loaded, std::move(global)});
  };
  add("big", DType::kFloat32, {1536, 1024}, Layout::kWhole, Layout::kRows);
  add("embed", DType::kFloat32, {1024, 256}, Layout::kRows, Layout::kCols);
  add("proj", DType::kBFloat16, {256, 512}, Layout::kCols, Layout::kRows);
  add("bias", DType::kFloat32, {1000}, Layout::kFlatUneven,
      Layout::kFlatUneven);
  add("norm", DType::kFloat32, {64}, Layout::kReplicated, Layout::kWhole);
  m.objects["train_state"] = absl::StrCat("step and seed ", seed);
  return m;
}

struct Env {
  std::shared_ptr<S3Client> client;
  std::unique_ptr<S3Storage> storage;
  std::string bucket;
  std::string root;  // s3://bucket/run
};

S3StorageOptions SmallParts() {
  S3StorageOptions o;
  o.writer.part_size = kMinPartSize;
  return o;
}

Env MakeEnv(const testing::TestServer& server,
            S3StorageOptions options = SmallParts(),
            const ClientOptions* client_options = nullptr) {
  Env e;
  e.client = std::shared_ptr<S3Client>(std::move(
      S3Client::Create(client_options ? *client_options : TestOptions(server))
          .value()));
  e.storage = std::make_unique<S3Storage>(e.client, options);
  e.bucket = NewBucket(e.client.get());
  e.root = absl::StrCat("s3://", e.bucket, "/run");
  return e;
}

// Saves `model` at `step` from `world` in-process ranks, rank r through
// storages[r] (all the same when one is given). Every rank's result.
std::vector<absl::StatusOr<SaveResult>> SaveOnRanks(
    const std::vector<Storage*>& storages, const std::string& root,
    uint64_t step, const Model& model, int world,
    const SaveOptions& options = {}) {
  InProcessWorld w(world);
  std::vector<absl::StatusOr<SaveResult>> results(
      world, absl::UnknownError("not run"));
  std::vector<std::vector<std::string>> bufs(
      world, std::vector<std::string>(model.tensors.size()));
  (void)RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const int rank = comm.rank();
    results[rank] = [&]() -> absl::StatusOr<SaveResult> {
      Writer::Options wo;
      wo.comm = &comm;
      wo.storage = storages.size() == 1 ? storages[0] : storages[rank];
      CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
      for (size_t i = 0; i < model.tensors.size(); ++i) {
        const Tensor& t = model.tensors[i];
        ::ckpt::testing::Piece p = PieceOf(t.saved, t.shape, rank, world);
        if (RegionElements(p.region) == 0) continue;
        bufs[rank][i] = Extract(t.global, t.dtype, t.shape, p.region);
        TensorOptions to;
        to.replica = p.replica;
        CKPT_RETURN_IF_ERROR(writer->AddTensor(
            t.name, t.dtype, t.shape, p.region, bufs[rank][i].data(), to));
      }
      if (rank == 0) {
        for (const auto& [name, bytes] : model.objects) {
          CKPT_RETURN_IF_ERROR(writer->SetObject(name, bytes));
        }
      }
      return writer->Save(root, step, options);
    }();
    return results[rank].status();
  });
  return results;
}

absl::Status AllOk(const std::vector<absl::StatusOr<SaveResult>>& results) {
  for (const auto& r : results) CKPT_RETURN_IF_ERROR(r.status());
  return absl::OkStatus();
}

// Every rank of `world` loads its `loaded` piece of every tensor and every
// object from `path`; OK iff all equal the model. *needed: the bytes asked
// for, over all ranks. `cooperative`: one cooperative load (each stored
// byte read once by the job).
absl::Status LoadOnRanks(Storage* storage, const std::string& path,
                         const Model& model, int world,
                         uint64_t* needed = nullptr, bool cooperative = false) {
  InProcessWorld w(world);
  std::vector<uint64_t> asked(world, 0);
  absl::Status s = RunRanks(w, [&](Communicator& comm) -> absl::Status {
    const int rank = comm.rank();
    ReaderOptions ro;
    ro.storage = storage;
    if (cooperative) ro.communicator = &comm;
    CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(path, ro));
    std::vector<Region> regions;
    std::vector<std::string> bufs(model.tensors.size());
    std::vector<LoadRequest> reqs;
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      const Tensor& t = model.tensors[i];
      regions.push_back(PieceOf(t.loaded, t.shape, rank, world).region);
      bufs[i].assign(RegionElements(regions[i]) * DTypeSize(t.dtype), '\xEE');
      asked[rank] += bufs[i].size();
      reqs.push_back({t.name, t.dtype, t.shape, regions[i], bufs[i].data()});
    }
    std::vector<std::string> objs(model.objects.size());
    size_t k = 0;
    for (const auto& [name, bytes] : model.objects) {
      LoadRequest r;
      r.name = name;
      r.object = &objs[k++];
      reqs.push_back(std::move(r));
      asked[rank] += bytes.size();
    }
    CKPT_RETURN_IF_ERROR(reader->Load(reqs).status());
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      const Tensor& t = model.tensors[i];
      if (bufs[i] != Extract(t.global, t.dtype, t.shape, regions[i])) {
        return absl::InternalError(
            absl::StrCat("rank ", rank, ": tensor '", t.name, "' differs"));
      }
    }
    k = 0;
    for (const auto& [name, bytes] : model.objects) {
      if (objs[k++] != bytes) {
        return absl::InternalError(
            absl::StrCat("rank ", rank, ": object '", name, "' differs"));
      }
    }
    return absl::OkStatus();
  });
  if (needed != nullptr) {
    *needed = 0;
    for (uint64_t a : asked) *needed += a;
  }
  return s;
}

// Keys under s3://bucket/<prefix>, relative to it.
std::vector<std::string> Keys(const Env& e, const std::string& prefix,
                              uint64_t* bytes = nullptr) {
  std::vector<std::string> out;
  auto r = e.client->ListObjects(e.bucket, prefix);
  EXPECT_TRUE(r.ok()) << r.status();
  if (bytes) *bytes = 0;
  if (!r.ok()) return out;
  for (const ObjectInfo& o : r->objects) {
    out.push_back(o.key.substr(prefix.size()));
    if (bytes) *bytes += o.size;
  }
  return out;
}

std::vector<MultipartUpload> Uploads(const Env& e) {
  auto r = e.client->ListMultipartUploads(e.bucket, "");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<MultipartUpload>();
}

uint64_t Ops(const S3Counters& c, S3Op op) {
  return c.requests_by_op[static_cast<int>(op)];
}

std::string Latest(const Env& e) {
  auto bytes = e.client->GetObject(e.bucket, "run/latest");
  if (!bytes.ok()) return std::string(bytes.status().message());
  auto dir = format::DecodeLatest(*bytes);
  return dir.ok() ? *dir : std::string(dir.status().message());
}

TEST(S3Checkpoint, SavedOnThreeRanksLoadsReshardedOnTwo) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Env e = MakeEnv(*server);
  const Model model = SmallModel(1);
  const S3Counters t0 = e.client->counters();
  auto saved = SaveOnRanks({e.storage.get()}, e.root, 100, model, 3);
  CKPT_ASSERT_OK(AllOk(saved));
  EXPECT_EQ(saved[0]->path, e.root + "/step-00000100");
  const S3Counters t1 = e.client->counters();

  // The step's prefix: MANIFEST and one shard object per rank, named after
  // the save; latest names it; the save's marker is gone; no upload left.
  uint64_t stored = 0;
  std::vector<std::string> keys = Keys(e, "run/step-00000100/", &stored);
  ASSERT_EQ(keys.size(), 4u) << ::testing::PrintToString(keys);
  EXPECT_EQ(keys[0], "MANIFEST");
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(
        absl::StartsWith(keys[r + 1], absl::StrCat("shard-0000", r, ".")))
        << keys[r + 1];
    EXPECT_EQ(keys[r + 1].size(), std::string("shard-00000.").size() + 16 + 5);
  }
  std::vector<std::string> all = {"latest"};
  for (const std::string& k : keys) all.push_back("step-00000100/" + k);
  EXPECT_EQ(Keys(e, "run/"), all);
  EXPECT_EQ(Latest(e), "step-00000100");
  EXPECT_TRUE(Uploads(e).empty());

  uint64_t needed = 0;
  CKPT_ASSERT_OK(LoadOnRanks(e.storage.get(), e.root, model, 2, &needed));
  const S3Counters t2 = e.client->counters();
  CKPT_ASSERT_OK(LoadOnRanks(e.storage.get(), e.root, model, 2, &needed,
                             /*cooperative=*/true));
  const S3Counters t3 = e.client->counters();

  const S3Counters save = t1 - t0, load = t2 - t1, coop = t3 - t2;
  // Every byte of the checkpoint went up once (no retries here), plus
  // `latest` (46 bytes) and the XML that completes the multipart upload.
  EXPECT_EQ(save.retries, 0u);
  EXPECT_GE(save.bytes_sent, stored + 46);
  EXPECT_LE(save.bytes_sent, stored + 46 + 1024);
  EXPECT_GE(Ops(save, S3Op::kUploadPart), 2u);  // the 6 MiB shard
  EXPECT_EQ(Ops(save, S3Op::kCompleteMultipartUpload), 1u);
  std::cout << "S3 counts: save of " << stored << " bytes (" << keys.size()
            << " objects on 3 ranks): " << save.requests << " requests, "
            << save.bytes_sent << " bytes sent ("
            << static_cast<double>(save.bytes_sent) / stored
            << "x the checkpoint), " << Ops(save, S3Op::kUploadPart)
            << " parts; resharded load on 2 ranks: " << load.requests
            << " requests (" << Ops(load, S3Op::kGetObject) << " GETs, "
            << Ops(load, S3Op::kHeadObject) << " HEADs, "
            << Ops(load, S3Op::kListObjects) << " LISTs), "
            << load.bytes_received << " bytes received for " << needed
            << " bytes needed ("
            << static_cast<double>(load.bytes_received) / needed
            << "x); the same load, cooperative: " << coop.requests
            << " requests, " << coop.bytes_received << " bytes received ("
            << static_cast<double>(coop.bytes_received) / needed << "x)\n";
}

TEST(S3Checkpoint, FlippedByteInAShardObjectIsDataLossNamingTheShard) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Env e = MakeEnv(*server);
  const Model model = SmallModel(2);
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 1, model, 2)));
  ReaderOptions ro;
  ro.storage = e.storage.get();
  CKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(e.root, ro));
  const format::EntryRecord* embed = reader->Find("embed");
  ASSERT_NE(embed, nullptr);
  const format::ChunkRecord& c = embed->chunks.back();
  const std::string shard = reader->manifest().shards[c.shard].file_name;
  const std::string key = "run/step-00000001/" + shard;
  CKPT_ASSERT_OK_AND_ASSIGN(std::string bytes,
                            e.client->GetObject(e.bucket, key));
  bytes[c.data_offset + 1234] ^= 0x10;
  CKPT_ASSERT_OK(e.client->PutObject(e.bucket, key, bytes));
  reader.reset();

  absl::Status s = LoadOnRanks(e.storage.get(), e.root, model, 1);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, shard));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, "checksum"));
}

TEST(S3Checkpoint, KilledSaveLeavesNoManifestAndIsCleanedByALaterSave) {
  CKPT_S3_SERVER_OR_SKIP(server);
  S3StorageOptions o = SmallParts();
  o.stale_save_age = absl::Seconds(4);
  Env e = MakeEnv(*server, o);
  const Model first = SmallModel(3), second = SmallModel(4);
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 1, first, 3)));

  // Killed after its first shard object is complete: nothing after that
  // reaches the store, the coordinator's cleanup included.
  FaultInjectingStorage dying(e.storage.get());
  dying.OnlyPathsContaining("/shard-");
  dying.CrashAt(StorageOp::kClose, 2);
  auto killed = SaveOnRanks({&dying}, e.root, 2, second, 3);
  EXPECT_FALSE(AllOk(killed).ok());
  std::vector<std::string> left = Keys(e, "run/step-00000002/");
  EXPECT_THAT(left, ::testing::Not(::testing::Contains("MANIFEST")));
  EXPECT_FALSE(left.empty());  // the shard that was complete
  std::vector<std::string> markers;
  for (const std::string& k : Keys(e, "run/")) {
    if (absl::StartsWith(k, ".tmp-save.")) markers.push_back(k);
  }
  ASSERT_EQ(markers.size(), 1u);
  // A killed process also leaves its uploads in progress: one for the
  // save's rank 1, made by hand (the wrapper's crash still lets the
  // ObjectWriter abort its own).
  const std::string tag = markers[0].substr(10, 16);
  const std::string pending_key =
      absl::StrCat("run/step-00000002/shard-00001.", tag, ".ckpt");
  CKPT_ASSERT_OK(
      e.client->CreateMultipartUpload(e.bucket, pending_key).status());

  // Readers see step 1 only.
  EXPECT_EQ(Latest(e), "step-00000001");
  CKPT_EXPECT_OK(LoadOnRanks(e.storage.get(), e.root, first, 2));
  ReaderOptions ro;
  ro.storage = e.storage.get();
  EXPECT_THAT(Reader::Open(e.root + "/step-00000002", ro),
              StatusIs(absl::StatusCode::kNotFound, "step-00000002"));

  // Once the stale age has passed, the next save removes all of it.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 3, second, 2)));
  EXPECT_THAT(Keys(e, "run/step-00000002/"), ::testing::IsEmpty());
  for (const std::string& k : Keys(e, "run/")) {
    EXPECT_FALSE(absl::StrContains(k, tag)) << k;
  }
  EXPECT_TRUE(Uploads(e).empty());
  EXPECT_EQ(Latest(e), "step-00000003");
  CKPT_EXPECT_OK(LoadOnRanks(e.storage.get(), e.root, second, 3));
}

TEST(S3Checkpoint, FailedSaveRemovesItsOwnObjectsOnly) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Env e = MakeEnv(*server);
  const Model model = SmallModel(5);
  FaultInjectingStorage failing(e.storage.get());
  failing.OnlyPathsContaining("/shard-");
  failing.FailAt(StorageOp::kWrite, 3, absl::UnavailableError("injected"));
  auto failed = SaveOnRanks({&failing}, e.root, 7, model, 3);
  EXPECT_THAT(AllOk(failed), StatusIs(absl::StatusCode::kUnavailable, "rank"));
  EXPECT_THAT(Keys(e, "run/"), ::testing::IsEmpty());
  EXPECT_TRUE(Uploads(e).empty());
}

// Holds every CreateExclusive of a MANIFEST until `n` writers reach it, so
// that racing saves meet at the commit point, not at the early check.
class CommitBarrier : public ::ckpt::testing::ForwardingStorage {
 public:
  CommitBarrier(Storage* base, int n)
      : ForwardingStorage(base), base_(base), n_(n) {}
  absl::Status CreateExclusive(const std::string& path,
                               absl::string_view data) override {
    if (absl::EndsWith(path, "/MANIFEST")) {
      std::unique_lock<std::mutex> l(mu_);
      ++arrived_;
      cv_.notify_all();
      cv_.wait_for(l, std::chrono::seconds(30), [&] { return arrived_ >= n_; });
    }
    return base_->CreateExclusive(path, data);
  }

 private:
  Storage* const base_;
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
};

TEST(S3Checkpoint, TwoWritersRacingForOneStepExactlyOneCommits) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Env e = MakeEnv(*server);
  const Model a = SmallModel(10), b = SmallModel(20);
  CommitBarrier barrier(e.storage.get(), 2);
  std::vector<absl::StatusOr<SaveResult>> ra, rb;
  std::thread ta([&] { ra = SaveOnRanks({&barrier}, e.root, 9, a, 2); });
  std::thread tb([&] { rb = SaveOnRanks({&barrier}, e.root, 9, b, 3); });
  ta.join();
  tb.join();
  const bool a_won = AllOk(ra).ok(), b_won = AllOk(rb).ok();
  ASSERT_NE(a_won, b_won) << AllOk(ra) << " / " << AllOk(rb);
  EXPECT_THAT(AllOk(a_won ? rb : ra),
              StatusIs(absl::StatusCode::kAlreadyExists, "step-00000009"));
  const Model& winner = a_won ? a : b;
  CKPT_EXPECT_OK(LoadOnRanks(e.storage.get(), e.root, winner, 2));
  // Only the winner's shards are left under the step.
  EXPECT_EQ(Keys(e, "run/step-00000009/").size(), 1u + (a_won ? 2 : 3));
  EXPECT_TRUE(Uploads(e).empty());
}

TEST(S3Checkpoint, OverwriteReplacesTheManifestThenRemovesTheOldShards) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Env e = MakeEnv(*server);
  const Model a = SmallModel(30), b = SmallModel(40);
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 5, a, 2)));
  EXPECT_THAT(AllOk(SaveOnRanks({e.storage.get()}, e.root, 5, b, 3)),
              StatusIs(absl::StatusCode::kAlreadyExists, "set overwrite"));
  SaveOptions so;
  so.overwrite = true;
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 5, b, 3, so)));
  EXPECT_EQ(Keys(e, "run/step-00000005/").size(), 4u);
  CKPT_EXPECT_OK(LoadOnRanks(e.storage.get(), e.root, b, 2));
}

TEST(S3Checkpoint, KeepLastPrunesOldStepsManifestFirst) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Env e = MakeEnv(*server);
  const Model model = SmallModel(50);
  SaveOptions so;
  so.keep_last = 2;
  for (uint64_t step : {1, 2, 3}) {
    CKPT_ASSERT_OK(
        AllOk(SaveOnRanks({e.storage.get()}, e.root, step, model, 1, so)));
  }
  EXPECT_THAT(Keys(e, "run/step-00000001/"), ::testing::IsEmpty());
  EXPECT_EQ(Keys(e, "run/step-00000002/").size(), 2u);
  EXPECT_EQ(Latest(e), "step-00000003");
}

// Small enough for fifty saves.
Model TinyModel(uint64_t seed) {
  Model m;
  auto add = [&](std::string name, DType dtype, Shape shape, Layout saved) {
    std::string global = ReferenceBytes(dtype, shape, seed + m.tensors.size());
    m.tensors.push_back({std::move(name), dtype, std::move(shape), saved,
                         Layout::kWhole, std::move(global)});
  };
  add("embed", DType::kFloat32, {64, 32}, Layout::kRows);
  add("bias", DType::kFloat32, {100}, Layout::kFlatUneven);
  add("norm", DType::kFloat32, {8}, Layout::kReplicated);
  m.objects["train_state"] = "tiny";
  return m;
}

TEST(S3Checkpoint,
     CrashesAtRandomPointsNeverLeaveACommittedIncompleteCheckpoint) {
  CKPT_S3_SERVER_OR_SKIP(server);
  Env e = MakeEnv(*server);
  const Model model = TinyModel(70);
  SaveOptions so;
  so.keep_last = 3;
  const StorageOp ops[] = {
      StorageOp::kOpen, StorageOp::kWrite,  StorageOp::kClose, StorageOp::kStat,
      StorageOp::kList, StorageOp::kRemove, StorageOp::kRead};
  std::mt19937 rng(26);
  int crashed = 0, committed = 0;
  for (uint64_t step = 1; step <= 50; ++step) {
    // A crash: the chosen call and everything after it, on every rank,
    // never reaches the store (the coordinator's cleanup included).
    FaultInjectingStorage dying(e.storage.get());
    const StorageOp op = ops[rng() % std::size(ops)];
    const int nth = 1 + static_cast<int>(rng() % 6);
    dying.CrashAt(op, nth);
    const bool ok =
        AllOk(SaveOnRanks({&dying}, e.root, step, model, 2, so)).ok();
    crashed += !ok;
    SCOPED_TRACE(absl::StrCat("step ", step, ": crash at ", StorageOpName(op),
                              " #", nth, ok ? " (saved)" : " (crashed)"));
    // Every step with a MANIFEST loads whole; `latest` names one of them.
    std::vector<std::string> steps;
    for (const std::string& k : Keys(e, "run/")) {
      if (absl::EndsWith(k, "/MANIFEST"))
        steps.push_back(k.substr(0, k.find('/')));
    }
    if (ok) {
      EXPECT_THAT(steps, ::testing::Contains(format::StepDirName(step)));
    }
    for (const std::string& dir : steps) {
      CKPT_EXPECT_OK(
          LoadOnRanks(e.storage.get(), e.root + "/" + dir, model, 1));
    }
    committed = static_cast<int>(steps.size());
    const std::string latest = Latest(e);
    if (latest.rfind("step-", 0) == 0) {
      EXPECT_THAT(steps, ::testing::Contains(latest));
    }
  }
  std::cout << "S3 crashes: " << crashed << " of 50 saves crashed; "
            << committed << " committed steps kept\n";
  EXPECT_GE(crashed, 25);
}

// Faults of the transport during a whole save and a whole load, injected by
// fault_proxy.py between the storage and moto: 500s, SlowDown, an answer
// held past the timeout, connections reset or dropped mid-body. Each is
// retried; the checkpoint loads exact.
class WholeCheckpointFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    server_ = testing::GetTestServer(&why);
    if (server_ == nullptr) {
      if (testing::InCi()) FAIL() << why;
      GTEST_SKIP() << why;
    }
    auto proxy = testing::FaultProxy::Start(server_->endpoint);
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = std::move(*proxy);
  }
  // Storage through the proxy: request timeout 1 s, up to `attempts`.
  Env Through(int attempts = 8) {
    ClientOptions o = TestOptions(*server_, proxy_->endpoint());
    o.request_timeout = absl::Seconds(1);
    o.retry.max_attempts = attempts;
    return MakeEnv(*server_, SmallParts(), &o);
  }
  void Rules(const std::string& json) {
    CKPT_ASSERT_OK(proxy_->SetRules(json));
  }
  std::vector<int> Hits() { return proxy_->Hits().value(); }

  const testing::TestServer* server_ = nullptr;
  std::unique_ptr<testing::FaultProxy> proxy_;
};

TEST_F(WholeCheckpointFaults, TransientFaultsDuringSaveAndLoadAreRetried) {
  Env e = Through();
  const Model model = SmallModel(80);
  Rules(R"([{"action": "status", "status": 500, "code": "InternalError",
             "method": "PUT", "path": "partNumber=1&", "times": 1},
            {"action": "status", "status": 503, "code": "SlowDown",
             "method": "PUT", "path": "/shard-", "times": 2},
            {"action": "reset", "method": "PUT", "path": "/MANIFEST",
             "times": 1},
            {"action": "delay", "seconds": 2, "method": "PUT",
             "path": "/latest", "times": 1},
            {"action": "status", "status": 503, "code": "SlowDown",
             "method": "HEAD", "times": 1}])");
  const S3Counters t0 = e.client->counters();
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 1, model, 3)));
  EXPECT_THAT(Hits(), ::testing::Each(::testing::Ge(1)));
  const S3Counters t1 = e.client->counters();
  EXPECT_GE((t1 - t0).retries, 4u);  // the reset may be resent by libcurl

  Rules(R"([{"action": "truncate", "keep_bytes": 1000, "method": "GET",
             "path": "/shard-", "times": 2},
            {"action": "status", "status": 500, "method": "GET",
             "path": "/MANIFEST", "times": 1},
            {"action": "delay", "seconds": 2, "method": "GET",
             "path": "/shard-", "times": 1},
            {"action": "reset", "method": "GET", "path": "/shard-",
             "times": 1}])");
  CKPT_EXPECT_OK(LoadOnRanks(e.storage.get(), e.root, model, 2));
  EXPECT_THAT(Hits(), ::testing::Each(::testing::Ge(1)));
  // Not one per fault: libcurl itself sends again, within one attempt, a
  // request whose reused connection is reset before any answer, and a
  // small GET (an index) fits in the bytes a truncation keeps.
  EXPECT_GE((e.client->counters() - t1).retries, 1u);
}

// A fault that persists fails the load, naming the object, the HTTP status
// and S3's code; never partial data.
TEST_F(WholeCheckpointFaults, PersistentSlowDownFailsTheLoadNamingTheObject) {
  Env e = Through(/*attempts=*/3);
  const Model model = SmallModel(81);
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 1, model, 2)));
  Rules(R"([{"action": "status", "status": 503, "code": "SlowDown",
             "method": "GET", "path": "/shard-00001", "times": null}])");
  absl::Status s = LoadOnRanks(e.storage.get(), e.root, model, 2);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable,
                          "step-00000001/shard-00001."));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, "HTTP 503 SlowDown"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, "gave up after 3"));
}

// Connections dropped mid-body on every attempt: an error, never the bytes
// that came.
TEST_F(WholeCheckpointFaults, AlwaysTruncatedReadsFailTheLoad) {
  Env e = Through(/*attempts=*/3);
  const Model model = SmallModel(82);
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 1, model, 2)));
  Rules(R"([{"action": "truncate", "keep_bytes": 100, "method": "GET",
             "path": "/shard-00000", "times": null}])");
  EXPECT_THAT(LoadOnRanks(e.storage.get(), e.root, model, 1),
              StatusIs(absl::StatusCode::kUnavailable, "/shard-00000."));
}

// 403 and 404 are what they are: one attempt each, and reported as such.
TEST_F(WholeCheckpointFaults, ForbiddenAndNotFoundAreNotRetried) {
  Env e = Through();
  const Model model = SmallModel(83);
  Rules(R"([{"action": "status", "status": 403, "code": "AccessDenied",
             "method": "PUT", "path": "/shard-00001", "times": null}])");
  EXPECT_THAT(
      AllOk(SaveOnRanks({e.storage.get()}, e.root, 1, model, 2)),
      StatusIs(absl::StatusCode::kPermissionDenied, "HTTP 403 AccessDenied"));
  EXPECT_THAT(Hits(), ::testing::ElementsAre(1));
  EXPECT_THAT(Keys(e, "run/"), ::testing::IsEmpty());

  Rules("[]");
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 2, model, 2)));
  Rules(R"([{"action": "status", "status": 404, "code": "NoSuchKey",
             "method": "GET", "path": "/shard-00000", "times": null},
            {"action": "status", "status": 403, "code": "AccessDenied",
             "method": "GET", "path": "/shard-00001", "times": null}])");
  absl::Status s = LoadOnRanks(e.storage.get(), e.root, model, 1);
  EXPECT_TRUE(absl::IsNotFound(s) || absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              ::testing::AnyOf(HasSubstr("HTTP 404 NoSuchKey"),
                               HasSubstr("HTTP 403 AccessDenied")));
  for (int h : Hits()) EXPECT_LE(h, 1);
}

// A byte flipped in transit is caught by ckpt's block checksums.
TEST_F(WholeCheckpointFaults, ByteFlippedInTransitIsDataLoss) {
  Env e = Through();
  const Model model = SmallModel(84);
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({e.storage.get()}, e.root, 1, model, 1)));
  // The largest GET of the load is tensor data: flip its 5000th byte.
  Rules(R"([{"action": "flip", "offset": 5000, "method": "GET",
             "path": "/shard-00000", "skip": 2, "times": 1}])");
  absl::Status s = LoadOnRanks(e.storage.get(), e.root, model, 1);
  EXPECT_THAT(Hits(), ::testing::ElementsAre(1));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, "shard-00000."));
}

TEST(S3Checkpoint, StoreWithoutConditionalWritesIsRefusedUnlessSingleWriter) {
  CKPT_S3_SERVER_OR_SKIP(server);
  S3StorageOptions o = SmallParts();
  o.conditional_writes = false;
  Env e = MakeEnv(*server, o);
  const Model model = SmallModel(60);
  EXPECT_THAT(AllOk(SaveOnRanks({e.storage.get()}, e.root, 1, model, 2)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "single_writer"));
  EXPECT_THAT(Keys(e, "run/"), ::testing::IsEmpty());
  o.single_writer = true;
  S3Storage single(e.client, o);
  CKPT_ASSERT_OK(AllOk(SaveOnRanks({&single}, e.root, 1, model, 2)));
  CKPT_EXPECT_OK(LoadOnRanks(&single, e.root, model, 3));
}

}  // namespace
}  // namespace ckpt::s3
