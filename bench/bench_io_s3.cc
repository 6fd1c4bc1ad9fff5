#include "bench_io_s3.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "s3/s3_config.h"
#include "s3/s3_storage.h"

namespace ckpt::bench {
namespace {

using s3::RequestRecord;
using s3::S3Op;

constexpr uint64_t kRows = 4096, kCols = 1024;  // 16 MiB of float32
constexpr uint64_t kTensorBytes = kRows * kCols * 4;
constexpr uint64_t kMiB = 1 << 20;

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string Name(size_t i) { return absl::StrFormat("layers.%d.w", i); }
uint64_t Lo(int r, int world, uint64_t n) { return n * r / world; }

// One attempt as the request log keeps it.
struct Request {
  S3Op op;
  std::string key;
  uint64_t offset = 0, length = 0;  // ranged GETs
  uint64_t sent = 0, received = 0;
};

class RequestLog {
 public:
  void Add(const RequestRecord& r) {
    std::lock_guard<std::mutex> l(mu_);
    log_.push_back({r.op, std::string(r.key), r.range_offset, r.range_length,
                    r.bytes_sent, r.bytes_received});
  }
  // The requests since the last call.
  std::vector<Request> Take() {
    std::vector<Request> out;
    std::lock_guard<std::mutex> l(mu_);
    out.swap(log_);
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<Request> log_;
};

// Bytes [begin, end) of a shard object hold its chunks' data (§5.2); the
// header lies before, the index and tail after (metadata).
struct Payload {
  uint64_t begin = 0, end = 0;
};

// A phase's counts. A data request moves shard bytes (UploadPart, a
// shard's PutObject, a ranged GET of payload); a small one has under 1 MiB
// and is not the last piece of its object (for a GET: of its payload).
// GETs of a shard's header, index and tail are metadata, as MANIFEST,
// latest and the markers are.
struct Counts {
  uint64_t requests = 0, sent = 0, received = 0;
  std::map<std::string, uint64_t> by_op;
  std::map<std::string, int> parts;  // shard key -> parts (or 1: a PUT)
  uint64_t data_requests = 0, small = 0, smallest = 0;
  std::vector<std::string> small_list;  // what each small request was

  static Counts Of(const std::vector<Request>& log,
                   const std::map<std::string, uint64_t>& sizes,
                   const std::map<std::string, Payload>& payloads,
                   uint64_t part_size) {
    Counts c;
    for (const Request& r : log) {
      ++c.requests;
      c.sent += r.sent;
      c.received += r.received;
      ++c.by_op[std::string(s3::S3OpName(r.op))];
      if (!absl::StrContains(r.key, "/shard-")) continue;
      const auto size = sizes.find(r.key);
      const uint64_t object = size == sizes.end() ? 0 : size->second;
      uint64_t bytes = 0;
      bool last = false;
      if (r.op == S3Op::kUploadPart || r.op == S3Op::kPutObject) {
        bytes = r.sent;
        ++c.parts[r.key];
        last = r.op == S3Op::kPutObject || bytes == object % part_size;
      } else if (r.op == S3Op::kGetObject && r.length > 0) {
        const auto p = payloads.find(r.key);
        const Payload payload =
            p == payloads.end() ? Payload{0, object} : p->second;
        if (r.offset + r.length <= payload.begin || r.offset >= payload.end) {
          continue;  // header, index or tail
        }
        bytes = r.length;
        last = r.offset + r.length >= payload.end;
      } else {
        continue;
      }
      ++c.data_requests;
      c.smallest = c.data_requests == 1 ? bytes : std::min(c.smallest, bytes);
      if (bytes < kMiB && !last) {
        ++c.small;
        c.small_list.push_back(absl::StrCat(r.key, " bytes ", r.offset, "+",
                                            bytes, " of ", object));
      }
    }
    return c;
  }

  std::string Json() const {
    std::string ops =
        absl::StrJoin(by_op, ", ", [](std::string* out, const auto& kv) {
          absl::StrAppendFormat(out, "\"%s\": %llu", kv.first,
                                static_cast<unsigned long long>(kv.second));
        });
    return absl::StrFormat(
        "\"requests\": %llu, \"bytes_sent\": %llu, \"bytes_received\": %llu, "
        "\"data_requests\": %llu, \"small_data_requests\": %llu, "
        "\"smallest_data_request\": %llu, \"by_op\": {%s}",
        static_cast<unsigned long long>(requests),
        static_cast<unsigned long long>(sent),
        static_cast<unsigned long long>(received),
        static_cast<unsigned long long>(data_requests),
        static_cast<unsigned long long>(small),
        static_cast<unsigned long long>(smallest), ops);
  }
};

struct Bench {
  S3CountsOptions o;
  std::unique_ptr<s3::S3Storage> storage;
  RequestLog log;
  std::string root, bucket, prefix;  // prefix: the root's key
  std::vector<std::string> src;      // the tensors

  absl::Status Save() {
    InProcessWorld w(o.ranks);
    return RunRanks(w, [&](Communicator& comm) -> absl::Status {
      const int r = comm.rank();
      Writer::Options wo;
      wo.comm = &comm;
      wo.storage = storage.get();
      CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
      const uint64_t b = Lo(r, o.ranks, kRows), e = Lo(r + 1, o.ranks, kRows);
      for (size_t i = 0; i < src.size(); ++i) {
        CKPT_RETURN_IF_ERROR(writer->AddTensor(
            Name(i), DType::kFloat32, {kRows, kCols},
            Box{{b, 0}, {e - b, kCols}}, src[i].data() + b * kCols * 4));
      }
      SaveOptions so;
      so.io_threads = o.threads;
      return writer->Save(root, 1, so).status();
    });
  }

  // `world` ranks load, cooperatively, columns [Lo(r), Lo(r + 1)) of every
  // tensor (`columns`) or every tensor whole, and check the bytes.
  absl::Status Load(int world, bool columns) {
    InProcessWorld w(world);
    return RunRanks(w, [&](Communicator& comm) -> absl::Status {
      const int r = comm.rank();
      ReaderOptions ro;
      ro.storage = storage.get();
      ro.io_threads = o.threads;
      ro.communicator = &comm;
      CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(root, ro));
      const uint64_t b = columns ? Lo(r, world, kCols) : 0;
      const uint64_t n = columns ? Lo(r + 1, world, kCols) - b : kCols;
      std::vector<std::string> dst(src.size(), std::string(kRows * n * 4, 0));
      std::vector<LoadRequest> reqs;
      for (size_t i = 0; i < src.size(); ++i) {
        reqs.push_back({Name(i),
                        DType::kFloat32,
                        {kRows, kCols},
                        Box{{0, b}, {kRows, n}},
                        dst[i].data()});
      }
      CKPT_RETURN_IF_ERROR(reader->Load(reqs).status());
      for (size_t i = 0; i < src.size(); ++i) {
        for (uint64_t row = 0; row < kRows; ++row) {
          if (std::memcmp(dst[i].data() + row * n * 4,
                          src[i].data() + (row * kCols + b) * 4, n * 4) != 0) {
            return absl::DataLossError(absl::StrCat("rank ", r, ": tensor ", i,
                                                    " row ", row, " differs"));
          }
        }
      }
      return absl::OkStatus();
    });
  }

  // Where each shard object's payload lies, by key (from the manifest).
  absl::StatusOr<std::map<std::string, Payload>> Payloads() {
    ReaderOptions ro;
    ro.storage = storage.get();
    CKPT_ASSIGN_OR_RETURN(auto reader, Reader::Open(root, ro));
    const format::Manifest& m = reader->manifest();
    std::map<std::string, Payload> out;
    for (const format::EntryRecord& e : m.entries) {
      for (const format::ChunkRecord& c : e.chunks) {
        const std::string key = absl::StrCat(prefix, "/step-00000001/",
                                             m.shards[c.shard].file_name);
        const Payload here{c.data_offset, c.data_offset + c.stored_length};
        auto it = out.try_emplace(key, here).first;
        it->second.begin = std::min(it->second.begin, here.begin);
        it->second.end = std::max(it->second.end, here.end);
      }
    }
    return out;
  }

  // Sizes of the objects under the checkpoint, by key.
  absl::StatusOr<std::map<std::string, uint64_t>> Sizes() {
    CKPT_ASSIGN_OR_RETURN(
        s3::ListResult listed,
        storage->client()->ListObjects(bucket, prefix + "/step-00000001/"));
    std::map<std::string, uint64_t> sizes;
    for (const s3::ObjectInfo& obj : listed.objects) sizes[obj.key] = obj.size;
    return sizes;
  }
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// The client and storage (counting every request into b.log), the
// checkpoint's root, emptied.
absl::Status Connect(Bench& b) {
  CKPT_ASSIGN_OR_RETURN(s3::ClientOptions co, s3::ClientOptionsFromEnv());
  s3::S3StorageOptions so;
  so.writer.part_size = static_cast<uint64_t>(b.o.part_mib) * kMiB;
  CKPT_ASSIGN_OR_RETURN(
      b.storage, s3::S3Storage::Create(
                     co, so, [&b](const RequestRecord& r) { b.log.Add(r); }));
  CKPT_ASSIGN_OR_RETURN(s3::S3Url url, s3::ParseS3Url(b.o.url));
  b.bucket = url.bucket;
  b.prefix = url.key.empty() ? "ckpt-bench-io" : url.key + "/ckpt-bench-io";
  b.root = absl::StrCat("s3://", b.bucket, "/", b.prefix);
  if (b.o.create_bucket) {
    CKPT_RETURN_IF_ERROR(b.storage->client()->CreateBucket(b.bucket));
  }
  CKPT_RETURN_IF_ERROR(b.storage->RemoveAll(b.root));
  return absl::OkStatus();
}

// The tensors saved: enough of kTensorBytes each for --gib, of hashed bytes.
void MakeInputs(Bench& b) {
  const size_t n = std::max<size_t>(
      1, static_cast<size_t>(b.o.gib * (1ull << 30) / kTensorBytes));
  b.src.assign(n, std::string(kTensorBytes, '\0'));
  for (size_t i = 0; i < n; ++i) {
    for (uint64_t j = 0; j < kTensorBytes / 8; ++j) {
      const uint64_t v = Mix((uint64_t(i) << 40) + j);
      std::memcpy(b.src[i].data() + 8 * j, &v, 8);
    }
  }
}

// What the three phases did.
struct Measured {
  size_t n = 0;
  uint64_t tensor_bytes = 0, checkpoint = 0, part = 0;
  double save_s = 0, reshard_s = 0, replicated_s = 0;
  Counts save, reshard, replicated;
};

// Saves, then loads resharded and replicated, counting each phase's
// requests; leaves the root empty.
absl::StatusOr<Measured> Measure(Bench& b) {
  Measured m;
  m.n = b.src.size();
  m.tensor_bytes = m.n * kTensorBytes;
  (void)b.log.Take();
  auto t0 = std::chrono::steady_clock::now();
  CKPT_RETURN_IF_ERROR(b.Save());
  m.save_s = Seconds(t0);
  const std::vector<Request> save_log = b.log.Take();
  CKPT_ASSIGN_OR_RETURN(auto sizes, b.Sizes());
  CKPT_ASSIGN_OR_RETURN(auto payloads, b.Payloads());
  (void)b.log.Take();  // the listing and the manifest
  for (const auto& [key, size] : sizes) m.checkpoint += size;
  m.part = static_cast<uint64_t>(b.o.part_mib) * kMiB;
  m.save = Counts::Of(save_log, sizes, payloads, m.part);

  t0 = std::chrono::steady_clock::now();
  CKPT_RETURN_IF_ERROR(b.Load(b.o.reshard_to, /*columns=*/true));
  m.reshard_s = Seconds(t0);
  m.reshard = Counts::Of(b.log.Take(), sizes, payloads, m.part);

  t0 = std::chrono::steady_clock::now();
  CKPT_RETURN_IF_ERROR(b.Load(b.o.ranks, /*columns=*/false));
  m.replicated_s = Seconds(t0);
  m.replicated = Counts::Of(b.log.Take(), sizes, payloads, m.part);
  CKPT_RETURN_IF_ERROR(b.storage->RemoveAll(b.root));
  return m;
}

// The figures judged against the targets.
struct Ratios {
  std::vector<std::string> parts;  // parts per shard, by shard key
  double sent = 0, reshard = 0, replicated = 0;
  bool small_ok = false, met = false;

  static Ratios Of(const Measured& m) {
    Ratios r;
    for (const auto& [key, k] : m.save.parts)
      r.parts.push_back(absl::StrCat(k));
    r.sent = double(m.save.sent) / m.checkpoint;
    r.reshard = double(m.reshard.received) / m.tensor_bytes;
    r.replicated = double(m.replicated.received) / m.tensor_bytes;
    r.small_ok =
        m.save.small == 0 && m.reshard.small == 0 && m.replicated.small == 0;
    r.met = r.sent <= 1.01 && r.reshard <= 1.05 && r.small_ok;
    return r;
  }
};

void PrintLoadLine(const char* what, int world, double s, const Counts& c,
                   uint64_t tensor_bytes, double ratio) {
  std::printf(
      "%s on %d ranks (%.1f s): %llu requests (%llu GETs of data, smallest "
      "%llu bytes, %llu small), %llu bytes received for %llu needed "
      "(%.4fx)\n",
      what, world, s, static_cast<unsigned long long>(c.requests),
      static_cast<unsigned long long>(c.data_requests),
      static_cast<unsigned long long>(c.smallest),
      static_cast<unsigned long long>(c.small),
      static_cast<unsigned long long>(c.received),
      static_cast<unsigned long long>(tensor_bytes), ratio);
}

// The text lines, and the small requests on stderr.
void PrintText(const Bench& b, const Measured& m, const Ratios& r) {
  std::printf(
      "save on %d ranks (%.1f s): %llu requests, %llu bytes sent for a "
      "checkpoint of %llu bytes (%.4fx), parts per shard %s, %llu small data "
      "requests\n",
      b.o.ranks, m.save_s, static_cast<unsigned long long>(m.save.requests),
      static_cast<unsigned long long>(m.save.sent),
      static_cast<unsigned long long>(m.checkpoint), r.sent,
      absl::StrJoin(r.parts, ",").c_str(),
      static_cast<unsigned long long>(m.save.small));
  for (const Counts* c : {&m.save, &m.reshard, &m.replicated}) {
    for (const std::string& what : c->small_list) {
      std::fprintf(stderr, "small data request: %s\n", what.c_str());
    }
  }
  PrintLoadLine("cooperative resharded load (rows to columns)", b.o.reshard_to,
                m.reshard_s, m.reshard, m.tensor_bytes, r.reshard);
  PrintLoadLine("cooperative replicated load (each rank everything)", b.o.ranks,
                m.replicated_s, m.replicated, m.tensor_bytes, r.replicated);
}

// The JSON line, last.
void PrintJson(const Bench& b, const Measured& m, const Ratios& r) {
  std::printf(
      "{\"storage\": \"s3\", \"tensor_bytes\": %llu, \"tensors\": %zu, "
      "\"part_bytes\": %llu, \"checkpoint_bytes\": %llu, "
      "\"save\": {\"ranks\": %d, \"seconds\": %.3f, \"parts_per_shard\": [%s], "
      "\"sent_over_checkpoint\": %.4f, %s}, "
      "\"reshard\": {\"from\": %d, \"to\": %d, \"seconds\": %.3f, "
      "\"received_over_needed\": %.4f, %s}, "
      "\"replicated\": {\"ranks\": %d, \"seconds\": %.3f, "
      "\"received_over_needed\": %.4f, %s}, "
      "\"targets\": {\"save_sent_le_1.01\": %s, \"reshard_received_le_1.05\": "
      "%s, \"no_small_requests\": %s, \"met\": %s}}\n",
      static_cast<unsigned long long>(m.tensor_bytes), m.n,
      static_cast<unsigned long long>(m.part),
      static_cast<unsigned long long>(m.checkpoint), b.o.ranks, m.save_s,
      absl::StrJoin(r.parts, ", ").c_str(), r.sent, m.save.Json().c_str(),
      b.o.ranks, b.o.reshard_to, m.reshard_s, r.reshard,
      m.reshard.Json().c_str(), b.o.ranks, m.replicated_s, r.replicated,
      m.replicated.Json().c_str(), r.sent <= 1.01 ? "true" : "false",
      r.reshard <= 1.05 ? "true" : "false", r.small_ok ? "true" : "false",
      r.met ? "true" : "false");
}

absl::Status Run(Bench& b) {
  CKPT_RETURN_IF_ERROR(Connect(b));
  MakeInputs(b);
  CKPT_ASSIGN_OR_RETURN(Measured m, Measure(b));
  const Ratios r = Ratios::Of(m);
  PrintText(b, m, r);
  PrintJson(b, m, r);
  return absl::OkStatus();
}

}  // namespace

int RunS3Counts(const S3CountsOptions& options) {
  Bench b;
  b.o = options;
  if (b.o.ranks < 1 || b.o.reshard_to < 1 || b.o.part_mib < 5) {
    std::cerr << "ckpt-bench-io: --ranks and --reshard-to must be >= 1, "
                 "--part-mib >= 5\n";
    return 2;
  }
  absl::Status s = Run(b);
  if (!s.ok()) {
    std::cerr << "ckpt-bench-io: " << s << "\n";
    return 2;
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace ckpt::bench
