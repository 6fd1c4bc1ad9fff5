// The invariants of a checkpoint root that no crash, fault or concurrent
// writer may break (spec/FORMAT.md §4.1), checked with gtest expectations.
#ifndef CKPT_TESTS_RELIABILITY_ROOT_CHECK_H_
#define CKPT_TESTS_RELIABILITY_ROOT_CHECK_H_

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "reliability/model.h"
#include "testing/status_matchers.h"
#ifdef CKPT_HAVE_VALIDATE
#include "ckpt/ops/validate.h"
#endif

namespace ckpt::reliability {

struct RootCheck {
  RootListing listing;
  uint64_t latest_step = 0;  // valid when latest_ok
  bool latest_ok = false;
  size_t validate_warnings = 0;
  bool validated = false;  // Validate ran (the validate library is built)
};

// Checks, adding a gtest failure for each violation:
//  - `latest` exists, resolves, and its checkpoint loads with the exact
//    bytes of its step;
//  - every step-* directory holding a MANIFEST loads completely and exactly
//    (no directory that looks committed is incomplete);
//  - nothing but step-* directories, `latest`, .tmp-* entries and the lock
//    files is in the root;
//  - with the validate library: ckpt-validate's checks of the root and its
//    latest checkpoint find no error, and report each .tmp-* entry as a
//    warning.
// Step directories without a MANIFEST are not checkpoints; they are listed
// in the result for the caller to judge. `storage`: the root's storage
// (null: POSIX). `skip_steps`: committed steps the caller has checked
// already and that nothing has changed since (they are listed, not loaded
// again).
inline RootCheck CheckRoot(const std::string& root, int scale,
                           Storage* storage = nullptr,
                           const std::vector<uint64_t>& skip_steps = {}) {
  RootCheck out;
  Storage* const fs = storage != nullptr ? storage : DefaultStorage();
  auto listing = ListRoot(root, fs);
  EXPECT_THAT(listing, ::ckpt::testing::IsOk());
  if (!listing.ok()) return out;
  out.listing = *listing;
  EXPECT_TRUE(out.listing.other.empty())
      << "unexpected entries in the root: "
      << absl::StrJoin(out.listing.other, ", ");
  EXPECT_TRUE(out.listing.has_latest) << root << ": no latest";

  auto latest = VerifyCheckpoint(root, scale, storage);
  EXPECT_THAT(latest, ::ckpt::testing::IsOk()) << "latest of " << root;
  if (latest.ok()) {
    out.latest_ok = true;
    out.latest_step = *latest;
    const auto& c = out.listing.committed;
    EXPECT_NE(std::find(c.begin(), c.end(), *latest), c.end());
  }
  for (uint64_t step : out.listing.committed) {
    if (std::find(skip_steps.begin(), skip_steps.end(), step) !=
        skip_steps.end()) {
      continue;
    }
    const std::string dir = JoinPath(root, format::StepDirName(step));
    auto got = VerifyCheckpoint(dir, scale, storage);
    EXPECT_THAT(got, ::ckpt::testing::IsOk()) << dir;
    if (got.ok()) {
      EXPECT_EQ(*got, step) << dir;
    }
  }
#ifdef CKPT_HAVE_VALIDATE
  ops::ValidateOptions vo;
  vo.path = root;
  vo.threads = 2;
  vo.storage = storage;
  auto report = ops::Validate(vo);
  EXPECT_THAT(report, ::ckpt::testing::IsOk()) << "validate " << root;
  if (report.ok()) {
    out.validated = true;
    std::vector<std::string> flagged;
    for (const ops::Finding& f : report->findings) {
      EXPECT_EQ(f.severity, ops::Severity::kWarning) << ops::FindingText(f);
      if (f.severity != ops::Severity::kWarning) continue;
      ++out.validate_warnings;
      const std::string prefix = JoinPath(root, format::kTempDirPrefix);
      EXPECT_TRUE(absl::StartsWith(f.file, prefix)) << ops::FindingText(f);
      flagged.push_back(f.file.substr(root.size() + 1));
    }
    std::sort(flagged.begin(), flagged.end());
    std::vector<std::string> temps = out.listing.temporaries;
    std::sort(temps.begin(), temps.end());
    // A temporary may vanish or appear between the two listings only while a
    // writer runs; callers check quiescent roots.
    EXPECT_EQ(flagged, temps) << "ckpt-validate's stray temporaries";
    EXPECT_EQ(report->findings_dropped, 0u);
  }
#endif
  return out;
}

}  // namespace ckpt::reliability

#endif  // CKPT_TESTS_RELIABILITY_ROOT_CHECK_H_
