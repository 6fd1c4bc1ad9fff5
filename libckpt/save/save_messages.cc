#include "save/save_messages.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/section_coding.h"
#include "ckpt/format/status_macros.h"

namespace ckpt::internal {
namespace {

// Decoders of this file see bytes from another rank of the same job: any
// flaw is a bug, not corruption on disk.
absl::Status WireError(absl::string_view message, const absl::Status& s) {
  return absl::InternalError(
      absl::StrCat("malformed ", message, " from another rank: ", s.message()));
}

absl::Status ExpectEnd(absl::string_view message, const format::ByteReader& r) {
  if (r.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("malformed ", message,
                                          " from another rank: ", r.remaining(),
                                          " trailing bytes"));
}

template <size_t N>
absl::Status ReadArray(format::ByteReader* r, absl::string_view what,
                       std::array<uint8_t, N>* out) {
  CKPT_ASSIGN_OR_RETURN(absl::string_view b, r->ReadBytes(what, N));
  std::copy(b.begin(), b.end(), out->begin());
  return absl::OkStatus();
}

template <size_t N>
void PutArray(std::string* out, const std::array<uint8_t, N>& a) {
  out->append(reinterpret_cast<const char*>(a.data()), a.size());
}

}  // namespace

std::string EncodeRankPlan(const RankPlan& plan) {
  std::string out;
  PutArray(&out, plan.fingerprint);
  out += EncodeLocalPlan(plan.plan);
  return out;
}

absl::StatusOr<RankPlan> DecodeRankPlan(absl::string_view bytes) {
  RankPlan plan;
  format::ByteReader r(bytes);
  absl::Status s = ReadArray(&r, "fingerprint", &plan.fingerprint);
  if (!s.ok()) return WireError("local plan", s);
  auto local = DecodeLocalPlan(bytes.substr(bytes.size() - r.remaining()));
  if (!local.ok()) return WireError("local plan", local.status());
  plan.plan = std::move(*local);
  return plan;
}

absl::Status AppendRankPlan(absl::string_view bytes, format::Fingerprint* fp,
                            PlanTable* table) {
  format::ByteReader r(bytes);
  absl::Status s = ReadArray(&r, "fingerprint", fp);
  if (s.ok())
    s = table->AppendEncoded(bytes.substr(bytes.size() - r.remaining()));
  if (!s.ok()) return WireError("local plan", s);
  return absl::OkStatus();
}

std::string EncodeCoordinatorPlan(const CoordinatorPlan& plan) {
  std::string out;
  format::PutFixed8(&out, plan.reused ? 1 : 0);
  out += plan.body;
  return out;
}

absl::StatusOr<CoordinatorPlan> DecodeCoordinatorPlan(absl::string_view bytes) {
  format::ByteReader r(bytes);
  auto reused = r.Read8("reused");
  if (!reused.ok()) return WireError("plan", reused.status());
  if (*reused > 1) {
    return absl::InternalError(absl::StrCat(
        "malformed plan from another rank: reused flag ", *reused));
  }
  return CoordinatorPlan{std::string(bytes.substr(1)), *reused == 1};
}

std::string EncodeSavePrep(const SavePrep& prep) {
  std::string out;
  PutArray(&out, prep.id);
  PutArray(&out, prep.fingerprint);
  format::PutFixed64(&out, static_cast<uint64_t>(prep.created_unix_ns));
  format::PutString(&out, prep.tmp_dir);
  return out;
}

absl::StatusOr<SavePrep> DecodeSavePrep(absl::string_view bytes) {
  SavePrep prep;
  format::ByteReader r(bytes);
  absl::Status s = [&]() -> absl::Status {
    CKPT_RETURN_IF_ERROR(ReadArray(&r, "checkpoint id", &prep.id));
    CKPT_RETURN_IF_ERROR(ReadArray(&r, "fingerprint", &prep.fingerprint));
    CKPT_ASSIGN_OR_RETURN(uint64_t ns, r.Read64("creation time"));
    prep.created_unix_ns = static_cast<int64_t>(ns);
    CKPT_ASSIGN_OR_RETURN(absl::string_view tmp,
                          r.ReadString("directory", bytes.size()));
    prep.tmp_dir = std::string(tmp);
    return absl::OkStatus();
  }();
  if (!s.ok()) return WireError("save preparation", s);
  CKPT_RETURN_IF_ERROR(ExpectEnd("save preparation", r));
  return prep;
}

std::string EncodeShardReport(const ShardReport& report) {
  std::string out;
  format::PutVarint(&out, report.file_size);
  format::internal::EncodeEntries(report.entries, /*with_blocks=*/false, &out);
  return out;
}

absl::StatusOr<ShardReport> DecodeShardReport(absl::string_view bytes) {
  ShardReport report;
  format::ByteReader r(bytes);
  auto size = r.ReadVarint("file size");
  if (!size.ok()) return WireError("shard report", size.status());
  report.file_size = *size;
  format::internal::RawSection section;
  section.tag = format::kSectionEntries;
  section.body = bytes.substr(bytes.size() - r.remaining());
  auto entries =
      format::internal::DecodeEntries(section, /*with_blocks=*/false);
  if (!entries.ok()) return WireError("shard report", entries.status());
  report.entries = std::move(*entries);
  return report;
}

std::string EncodeCommitSummary(const CommitSummary& summary) {
  std::string out;
  format::PutVarint(&out, summary.stored_bytes);
  format::PutVarint(&out, summary.logical_bytes);
  return out;
}

absl::StatusOr<CommitSummary> DecodeCommitSummary(absl::string_view bytes) {
  CommitSummary summary;
  format::ByteReader r(bytes);
  absl::Status s = [&]() -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(summary.stored_bytes, r.ReadVarint("stored bytes"));
    CKPT_ASSIGN_OR_RETURN(summary.logical_bytes, r.ReadVarint("logical bytes"));
    return absl::OkStatus();
  }();
  if (!s.ok()) return WireError("commit summary", s);
  CKPT_RETURN_IF_ERROR(ExpectEnd("commit summary", r));
  return summary;
}

}  // namespace ckpt::internal
