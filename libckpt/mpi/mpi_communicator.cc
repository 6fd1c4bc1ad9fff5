#include "ckpt/mpi_communicator.h"

#include <algorithm>
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

}  // namespace

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    MPI_Comm comm, const Options& options) {
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
  // Errors on `comm` itself go to the caller's error handler (by default
  // MPI_ERRORS_ARE_FATAL); only the duplicate is switched to return codes.
  int inter = 0;
  CKPT_RETURN_IF_ERROR(MpiStatus(MPI_Comm_test_inter(comm, &inter),
                                 "Create: MPI_Comm_test_inter"));
  if (inter) {
    return absl::InvalidArgumentError(
        "MpiCommunicator::Create: an intercommunicator is not supported");
  }
  MPI_Comm dup = MPI_COMM_NULL;
  CKPT_RETURN_IF_ERROR(
      MpiStatus(MPI_Comm_dup(comm, &dup), "Create: MPI_Comm_dup"));
  int rank = 0, size = 0;
  absl::Status status =
      MpiStatus(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN),
                "Create: MPI_Comm_set_errhandler");
  if (status.ok())
    status = MpiStatus(MPI_Comm_rank(dup, &rank), "Create: MPI_Comm_rank");
  if (status.ok())
    status = MpiStatus(MPI_Comm_size(dup, &size), "Create: MPI_Comm_size");
  // The name shows up in MPI's error messages and in debuggers.
  if (status.ok())
    status =
        MpiStatus(MPI_Comm_set_name(dup, "ckpt"), "Create: MPI_Comm_set_name");
  if (!status.ok()) {
    (void)MPI_Comm_free(&dup);  // the first error is the one worth reporting
    return status;
  }
  return std::unique_ptr<MpiCommunicator>(
      new MpiCommunicator(dup, rank, size, options));
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

  // Round k moves bytes [k * piece, (k + 1) * piece) of every contribution.
  // One round when everything fits in one call; otherwise each rank sends at
  // most limit / size bytes per round, so counts and displacements (C ints)
  // stay within the limit. Every rank derives the same rounds from
  // `lengths`, so all of them make the same number of calls.
  const int64_t limit = options_.max_bytes_per_call;
  const int64_t piece =
      total <= limit ? longest : std::max<int64_t>(1, limit / size_);
  const int64_t rounds = (longest + piece - 1) / piece;
  std::vector<int> counts(size_), displs(size_);
  std::string buffer;
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t begin = k * piece;
    int64_t round_total = 0;
    for (int r = 0; r < size_; ++r) {
      counts[r] =
          static_cast<int>(std::clamp<int64_t>(lengths[r] - begin, 0, piece));
      displs[r] = static_cast<int>(round_total);
      round_total += counts[r];
    }
    if (receives) buffer.resize(round_total);
    const char* send = mine.data() + std::min(begin, my_length);
    if (root < 0) {
      CKPT_RETURN_IF_ERROR(MpiStatus(
          MPI_Allgatherv(send, counts[rank_], MPI_BYTE, buffer.data(),
                         counts.data(), displs.data(), MPI_BYTE, comm_),
          What(call, "MPI_Allgatherv", k, rounds)));
    } else {
      CKPT_RETURN_IF_ERROR(MpiStatus(
          MPI_Gatherv(send, counts[rank_], MPI_BYTE, buffer.data(),
                      counts.data(), displs.data(), MPI_BYTE, root, comm_),
          What(call, "MPI_Gatherv", k, rounds)));
    }
    if (receives) {
      for (int r = 0; r < size_; ++r)
        out[r].append(buffer, displs[r], counts[r]);
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

}  // namespace ckpt
