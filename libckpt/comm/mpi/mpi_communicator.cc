#include "ckpt/mpi_communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/format/status_macros.h"

namespace ckpt {

namespace internal {

absl::Status MpiStatus(int rc, absl::string_view what) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  int error_class = rc;
  if (MPI_Error_class(rc, &error_class) != MPI_SUCCESS) error_class = rc;
  std::string message = absl::StrCat(
      what, ": ", len > 0 ? absl::string_view(text, len) : "unknown MPI error",
      " (MPI error class ", error_class, ")");
  if (error_class == MPI_ERR_NO_MEM)
    return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace internal

namespace {

using internal::MpiStatus;

// "<call>: <function>", with " (part k of n)" when a transfer is split.
std::string What(absl::string_view call, absl::string_view function, int64_t k,
                 int64_t n) {
  if (n <= 1) return absl::StrCat(call, ": ", function);
  return absl::StrCat(call, ": ", function, " (part ", k + 1, " of ", n, ")");
}

// AllToAll: the send size a rank whose own arguments are bad announces, so
// that receivers do not report a mismatch of its making.
constexpr uint64_t kBadArguments = ~uint64_t{0};

// The parts of one side of AllToAll (what this rank sends, or receives),
// addressed as integers: one side reads, the other writes.
struct Parts {
  std::vector<uintptr_t> address;
  std::vector<int64_t> size;
};

template <typename Buffer>
Parts PartsOf(absl::Span<const Buffer> buffers) {
  Parts parts;
  for (const Buffer& b : buffers) {
    parts.address.push_back(reinterpret_cast<uintptr_t>(b.data));
    parts.size.push_back(static_cast<int64_t>(b.size));
  }
  return parts;
}

// Grows on demand, never initialised: holds the parts of a round that are
// not passed to MPI in place.
class Staging {
 public:
  char* Get(size_t bytes) {
    if (bytes > capacity_) {
      buffer_.reset(new char[bytes]);
      capacity_ = bytes;
    }
    return buffer_.get();
  }

 private:
  std::unique_ptr<char[]> buffer_;
  size_t capacity_ = 0;
};

// Which bytes one MPI_Alltoallv call of AllToAll moves: [begin, begin +
// piece) of every part between ranks whose distance (receiver - sender,
// modulo size) is in [first_shift, first_shift + shifts). Distances are
// split into groups only when max_bytes_per_call is smaller than the number
// of peers a rank talks to; then each call has at most `shifts` peers of 1
// byte on either side.
struct Window {
  int64_t begin = 0, piece = 0;
  int first_shift = 1, shifts = 0;
};

// One side of one MPI_Alltoallv call: the window's pieces of every part.
// In place when those pieces lie within `limit` bytes of the lowest
// (displacements from it are then C ints within the limit); otherwise
// packed one after the other in `staging`. `receiving`: the parts are
// those of the senders (peer p's distance is self - p), not the receivers.
struct Round {
  std::vector<int> counts, displs;
  char* base = nullptr;
  bool staged = false;
};

Round LayOut(const Parts& parts, int self, bool receiving, const Window& w,
             int64_t limit, Staging* staging) {
  const int n = static_cast<int>(parts.size.size());
  Round round;
  round.counts.assign(n, 0);
  round.displs.assign(n, 0);
  uintptr_t low = UINTPTR_MAX, high = 0;
  int64_t total = 0;
  for (int p = 0; p < n; ++p) {
    const int shift = ((receiving ? self - p : p - self) + n) % n;
    if (shift < w.first_shift || shift >= w.first_shift + w.shifts) continue;
    const int64_t count =
        std::clamp<int64_t>(parts.size[p] - w.begin, 0, w.piece);
    if (count == 0) continue;
    round.counts[p] = static_cast<int>(count);
    low = std::min(low, parts.address[p] + w.begin);
    high = std::max(high, parts.address[p] + w.begin + count);
    total += count;
  }
  static char nothing;  // MPI gets a valid address even when nothing moves
  if (total == 0) {
    round.base = &nothing;
  } else if (high - low <= static_cast<uintptr_t>(limit)) {
    round.base = reinterpret_cast<char*>(low);
    for (int p = 0; p < n; ++p) {
      if (round.counts[p] > 0)
        round.displs[p] = static_cast<int>(parts.address[p] + w.begin - low);
    }
  } else {
    round.base = staging->Get(total);
    round.staged = true;
    int64_t offset = 0;
    for (int p = 0; p < n; ++p) {
      round.displs[p] = static_cast<int>(offset);
      offset += round.counts[p];
    }
  }
  return round;
}

// Copies the staged pieces between `round` and the parts: into the staging
// buffer before a send (`pack`), out of it after a receive.
void CopyStaged(const Round& round, const Parts& parts, const Window& w,
                bool pack) {
  if (!round.staged) return;
  for (size_t p = 0; p < parts.size.size(); ++p) {
    if (round.counts[p] == 0) continue;
    char* part = reinterpret_cast<char*>(parts.address[p] + w.begin);
    char* staged = round.base + round.displs[p];
    if (pack) {
      std::memcpy(staged, part, round.counts[p]);
    } else {
      std::memcpy(part, staged, round.counts[p]);
    }
  }
}

// What this rank contributes to the agreement on AllToAll's rounds: its
// largest part, its largest total (sent or received, self excluded) and
// the most peers it sends to or receives from.
std::vector<int64_t> RoundInputs(const Parts& send, const Parts& recv,
                                 int self) {
  int64_t largest = 0, sent = 0, received = 0, to = 0, from = 0;
  for (size_t p = 0; p < send.size.size(); ++p) {
    if (static_cast<int>(p) == self) continue;
    largest = std::max({largest, send.size[p], recv.size[p]});
    sent += send.size[p];
    received += recv.size[p];
    to += send.size[p] > 0;
    from += recv.size[p] > 0;
  }
  return {largest, std::max(sent, received), std::max(to, from)};
}

}  // namespace

namespace internal {

// From what every rank agreed on (see RoundInputs): one call when every
// rank's total fits the limit; otherwise pieces of limit / fan bytes per
// part, so that a call's counts on either side add up to at most the limit;
// and when the limit is below the fan (1-byte pieces), the distances are
// split into groups of `limit`.
AllToAllPlan PlanAllToAll(int64_t largest_part, int64_t largest_total,
                          int64_t widest_fan, int size, int64_t limit) {
  AllToAllPlan plan;
  plan.shifts_per_group = std::max(1, size - 1);
  if (largest_part == 0) return plan;
  plan.groups = 1;
  if (largest_total <= limit) {
    plan.piece = largest_part;
  } else if (limit >= widest_fan) {
    plan.piece = limit / widest_fan;
  } else {
    plan.piece = 1;
    plan.shifts_per_group = static_cast<int>(limit);
    plan.groups =
        (size - 1 + plan.shifts_per_group - 1) / plan.shifts_per_group;
  }
  plan.rounds = (largest_part + plan.piece - 1) / plan.piece;
  return plan;
}

}  // namespace internal

namespace {

// Create's checks of its arguments and of MPI's state, before anything is
// made.
absl::Status CheckCreateArguments(MPI_Comm comm,
                                  const MpiCommunicator::Options& options) {
  if (options.max_bytes_per_call < 1 || options.max_bytes_per_call > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MpiCommunicator::Create: max_bytes_per_call ",
        options.max_bytes_per_call, " is not in [1, ", INT_MAX, "]"));
  }
  int initialized = 0, finalized = 0;
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Initialized(&initialized), "Create: MPI_Initialized"));
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Finalized(&finalized), "Create: MPI_Finalized"));
  if (!initialized) {
    return absl::FailedPreconditionError(
        "MpiCommunicator::Create: MPI is not initialised (the caller calls "
        "MPI_Init first)");
  }
  if (finalized) {
    return absl::FailedPreconditionError(
        "MpiCommunicator::Create: MPI is already finalised");
  }
  if (comm == MPI_COMM_NULL) {
    return absl::InvalidArgumentError(
        "MpiCommunicator::Create: communicator is MPI_COMM_NULL");
  }
  int inter = 0;
  CKPT_RETURN_IF_ERROR(MpiStatus(MPI_Comm_test_inter(comm, &inter),
                                 "Create: MPI_Comm_test_inter"));
  if (inter) {
    return absl::InvalidArgumentError(
        "MpiCommunicator::Create: an intercommunicator is not supported");
  }
  return absl::OkStatus();
}

// What Create learns of its duplicate communicator.
struct DuplicateInfo {
  int rank = 0, size = 0;
  std::string node;
};

// Sets up the duplicate `dup`: errors as return codes, its rank and size,
// its name, the node's name. The caller frees `dup` on error.
absl::StatusOr<DuplicateInfo> SetUpDuplicate(MPI_Comm dup) {
  DuplicateInfo info;
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN),
                "Create: MPI_Comm_set_errhandler"));
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Comm_rank(dup, &info.rank), "Create: MPI_Comm_rank"));
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Comm_size(dup, &info.size), "Create: MPI_Comm_size"));
  // The name shows up in MPI's error messages and in debuggers.
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Comm_set_name(dup, "ckpt"), "Create: MPI_Comm_set_name"));
  char node[MPI_MAX_PROCESSOR_NAME] = {};
  int node_length = 0;
  CKPT_RETURN_IF_ERROR(MpiStatus(MPI_Get_processor_name(node, &node_length),
                                 "Create: MPI_Get_processor_name"));
  info.node.assign(node, node_length);
  return info;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    MPI_Comm comm, const Options& options) {
  CKPT_RETURN_IF_ERROR(CheckCreateArguments(comm, options));
  // Errors on `comm` itself go to the caller's error handler (by default
  // MPI_ERRORS_ARE_FATAL); only the duplicate is switched to return codes.
  MPI_Comm dup = MPI_COMM_NULL;
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Comm_dup(comm, &dup), "Create: MPI_Comm_dup"));
  absl::StatusOr<DuplicateInfo> info = SetUpDuplicate(dup);
  if (!info.ok()) {
    (void)MPI_Comm_free(&dup);  // the first error is the one worth reporting
    return info.status();
  }
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(
      dup, info->rank, info->size, std::move(info->node), options));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized &&
      comm_ != MPI_COMM_NULL) {
    (void)MPI_Comm_free(&comm_);  // a destructor has nobody to report to
  }
}

absl::StatusOr<std::vector<std::string>> MpiCommunicator::AllGather(
    absl::string_view mine) {
  return GatherBytes(mine, /*root=*/-1, "AllGather");
}

absl::StatusOr<std::vector<std::string>> MpiCommunicator::Gather(
    absl::string_view mine, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gather: root ", root,
                     " is not a rank of the communicator (size ", size_, ")"));
  }
  return GatherBytes(mine, root, "Gather");
}

namespace {

// Round k of a gather moves bytes [k * piece, (k + 1) * piece) of every
// contribution: what each rank sends in it and where it lands in the
// round's buffer.
struct GatherRound {
  std::vector<int> counts, displs;
  int64_t total = 0;
};

GatherRound LayOutGatherRound(const std::vector<int64_t>& lengths,
                              int64_t begin, int64_t piece) {
  GatherRound round;
  round.counts.resize(lengths.size());
  round.displs.resize(lengths.size());
  for (size_t r = 0; r < lengths.size(); ++r) {
    round.counts[r] =
        static_cast<int>(std::clamp<int64_t>(lengths[r] - begin, 0, piece));
    round.displs[r] = static_cast<int>(round.total);
    round.total += round.counts[r];
  }
  return round;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> MpiCommunicator::GatherBytes(
    absl::string_view mine, int root, const char* call) {
  const bool receives = root < 0 || rank_ == root;
  const int64_t my_length = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lengths(size_);
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Allgather(&my_length, 1, MPI_INT64_T, lengths.data(), 1,
                              MPI_INT64_T, comm_),
                absl::StrCat(call, ": MPI_Allgather of the lengths")));
  int64_t total = 0, longest = 0;
  for (int64_t n : lengths) {
    total += n;
    longest = std::max(longest, n);
  }
  std::vector<std::string> out;
  if (receives) {
    out.resize(size_);
    for (int r = 0; r < size_; ++r) out[r].reserve(lengths[r]);
  }
  if (total == 0) return out;

  // One round when everything fits in one call; otherwise each rank sends at
  // most limit / size bytes per round, so counts and displacements (C ints)
  // stay within the limit. Every rank derives the same rounds from
  // `lengths`, so all of them make the same number of calls.
  const int64_t limit = options_.max_bytes_per_call;
  const int64_t piece =
      total <= limit ? longest : std::max<int64_t>(1, limit / size_);
  const int64_t rounds = (longest + piece - 1) / piece;
  std::string buffer;
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t begin = k * piece;
    const GatherRound round = LayOutGatherRound(lengths, begin, piece);
    if (receives) buffer.resize(round.total);
    const char* send = mine.data() + std::min(begin, my_length);
    if (root < 0) {
      CKPT_RETURN_IF_ERROR(
          MpiStatus(MPI_Allgatherv(send, round.counts[rank_], MPI_BYTE,
                                   buffer.data(), round.counts.data(),
                                   round.displs.data(), MPI_BYTE, comm_),
                    What(call, "MPI_Allgatherv", k, rounds)));
    } else {
      CKPT_RETURN_IF_ERROR(
          MpiStatus(MPI_Gatherv(send, round.counts[rank_], MPI_BYTE,
                                buffer.data(), round.counts.data(),
                                round.displs.data(), MPI_BYTE, root, comm_),
                    What(call, "MPI_Gatherv", k, rounds)));
    }
    if (receives) {
      for (int r = 0; r < size_; ++r)
        out[r].append(buffer, round.displs[r], round.counts[r]);
    }
  }
  return out;
}

absl::Status MpiCommunicator::Broadcast(std::string* data, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root,
                     " is not a rank of the communicator (size ", size_, ")"));
  }
  int64_t length = rank_ == root ? static_cast<int64_t>(data->size()) : 0;
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Bcast(&length, 1, MPI_INT64_T, root, comm_),
                "Broadcast: MPI_Bcast of the length"));
  if (rank_ != root) {
    data->clear();  // nothing of the old contents needs to survive resize()
    data->resize(length);
  }
  const int64_t limit = options_.max_bytes_per_call;
  const int64_t parts = (length + limit - 1) / limit;
  for (int64_t k = 0; k < parts; ++k) {
    const int64_t begin = k * limit;
    const int count = static_cast<int>(std::min(limit, length - begin));
    CKPT_RETURN_IF_ERROR(
        MpiStatus(MPI_Bcast(data->data() + begin, count, MPI_BYTE, root, comm_),
                  What("Broadcast", "MPI_Bcast", k, parts)));
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Barrier() {
  return MpiStatus(MPI_Barrier(comm_), "Barrier: MPI_Barrier");
}

absl::Status MpiCommunicator::AllReduceMax(std::vector<int64_t>* values) {
  // MPI leaves mismatched counts undefined (a hang or a truncation error on
  // some ranks only); one extra reduction turns them into the same error on
  // every rank.
  const int64_t count = static_cast<int64_t>(values->size());
  int64_t range[2] = {count,
                      -count};  // max of both: the largest and -smallest count
  CKPT_RETURN_IF_ERROR(MpiStatus(
      MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_INT64_T, MPI_MAX, comm_),
      "AllReduceMax: MPI_Allreduce of the counts"));
  if (range[0] != -range[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllReduceMax: ranks passed different counts (from ",
                     -range[1], " to ", range[0], "; this rank ", count, ")"));
  }
  if (count > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllReduceMax: ", count, " values exceed MPI's limit of ", INT_MAX));
  }
  if (count == 0) return absl::OkStatus();
  return MpiStatus(
      MPI_Allreduce(MPI_IN_PLACE, values->data(), static_cast<int>(count),
                    MPI_INT64_T, MPI_MAX, comm_),
      "AllReduceMax: MPI_Allreduce");
}

absl::Status MpiCommunicator::AllToAll(absl::Span<const SendBuffer> send,
                                       absl::Span<const RecvBuffer> recv,
                                       MemoryKind memory) {
  internal::AllToAllPlan plan;
  CKPT_RETURN_IF_ERROR(AgreeOnAllToAll(send, recv, memory, &plan));
  if (send[rank_].size > 0) {
    std::memcpy(recv[rank_].data, send[rank_].data, send[rank_].size);
  }
  return AllToAllRounds(send, recv, plan);
}

absl::Status MpiCommunicator::AgreeOnAllToAll(absl::Span<const SendBuffer> send,
                                              absl::Span<const RecvBuffer> recv,
                                              MemoryKind memory,
                                              internal::AllToAllPlan* plan) {
  absl::Status verdict =
      CheckAllToAllArguments(send.size(), recv.size(), memory);
  std::vector<uint64_t> sent(size_, kBadArguments), arriving(size_);
  if (verdict.ok()) {
    for (int p = 0; p < size_; ++p) sent[p] = send[p].size;
  }
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Alltoall(sent.data(), 1, MPI_UINT64_T, arriving.data(), 1,
                             MPI_UINT64_T, comm_),
                "AllToAll: MPI_Alltoall of the sizes"));
  for (int s = 0; s < size_ && verdict.ok(); ++s) {
    if (arriving[s] != kBadArguments && arriving[s] != recv[s].size)
      verdict = AllToAllSizeMismatch(s, arriving[s], rank_, recv[s].size);
  }
  std::vector<int64_t> agreed = {0, 0, 0};
  if (verdict.ok()) agreed = RoundInputs(PartsOf(send), PartsOf(recv), rank_);
  CKPT_RETURN_IF_ERROR(AgreeOnFirstError(verdict, &agreed));
  *plan = internal::PlanAllToAll(agreed[0], agreed[1], agreed[2], size_,
                                 options_.max_bytes_per_call);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::AllToAllRounds(
    absl::Span<const SendBuffer> send, absl::Span<const RecvBuffer> recv,
    const internal::AllToAllPlan& plan) {
  const Parts out = PartsOf(send), in = PartsOf(recv);
  const int64_t limit = options_.max_bytes_per_call;
  const int64_t calls = plan.groups * plan.rounds;
  Staging out_staging, in_staging;
  for (int64_t k = 0; k < calls; ++k) {
    Window w;
    w.shifts = plan.shifts_per_group;
    w.first_shift = 1 + static_cast<int>(k / plan.rounds) * w.shifts;
    w.piece = plan.piece;
    w.begin = (k % plan.rounds) * plan.piece;
    const Round o =
        LayOut(out, rank_, /*receiving=*/false, w, limit, &out_staging);
    const Round i =
        LayOut(in, rank_, /*receiving=*/true, w, limit, &in_staging);
    CopyStaged(o, out, w, /*pack=*/true);
    CKPT_RETURN_IF_ERROR(
        MpiStatus(MPI_Alltoallv(o.base, o.counts.data(), o.displs.data(),
                                MPI_BYTE, i.base, i.counts.data(),
                                i.displs.data(), MPI_BYTE, comm_),
                  What("AllToAll", "MPI_Alltoallv", k, calls)));
    CopyStaged(i, in, w, /*pack=*/false);
  }
  return absl::OkStatus();
}

}  // namespace ckpt
