// Internal: every rank's local plan in one columnar table, the form the
// coordinator plans a save from. An item is 16 bytes of ids: its entry
// name, global shape and region are interned once in tables shared by all
// ranks (a 16,384-rank job repeats the same names, shapes and regions on
// every data-parallel replica), so the table holds no per-item string or
// vector and grows by one array append per item.
#ifndef CKPT_LIBCKPT_SAVE_PLAN_TABLE_H_
#define CKPT_LIBCKPT_SAVE_PLAN_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ckpt/format/coding.h"
#include "ckpt/format/format_constants.h"
#include "ckpt/types.h"

namespace ckpt::internal {

// Dense ids (0, 1, 2, ...) of distinct byte strings, in order of first
// appearance. Views returned by Get stay valid for the Interner's lifetime.
// Not thread-safe.
class Interner {
 public:
  static constexpr uint32_t kNoHint = ~uint32_t{0};

  // The id of `key`, adding a copy of it if new. `hint` is an id that is
  // likely to hold `key` (checked before hashing: equal keys at the same
  // position of consecutive ranks cost one compare).
  uint32_t Intern(absl::string_view key, uint32_t hint = kNoHint);
  absl::string_view Get(uint32_t id) const { return views_[id]; }
  size_t size() const { return views_.size(); }

 private:
  absl::string_view Store(absl::string_view key);

  std::vector<std::unique_ptr<char[]>> blocks_;  // never move: views stay valid
  size_t block_used_ = 0, block_size_ = 0;
  std::vector<absl::string_view> views_;
  absl::flat_hash_map<absl::string_view, uint32_t> ids_;
};

// One item of a rank's local plan (save_plan.h's LocalItem) by ids into
// its PlanTable.
struct PlanItem {
  uint32_t name = 0;
  uint32_t shape = 0;
  uint32_t region = 0;
  format::EntryKind kind = format::EntryKind::kTensor;
  DType dtype = DType::kFloat32;
  bool replica = false;
  bool partial = false;
};

class PlanTable {
 public:
  // Decodes the next rank's local plan (save_plan.h's EncodeLocalPlan
  // bytes) into the table as rank ranks(). DataLoss naming the field on
  // truncated or malformed bytes (an unknown kind, dtype or geometry, more
  // than kMaxDims dimensions, trailing bytes); the table then holds no item
  // of that rank and ranks() is unchanged.
  absl::Status AppendEncoded(absl::string_view bytes);
  // Room for `items` items in all, so that appending does not reallocate.
  void Reserve(size_t items) { items_.reserve(items); }

  uint32_t ranks() const { return static_cast<uint32_t>(begin_.size() - 1); }
  absl::Span<const PlanItem> rank(uint32_t r) const {
    return absl::MakeConstSpan(items_.data() + begin_[r],
                               begin_[r + 1] - begin_[r]);
  }
  size_t total_items() const { return items_.size(); }

  size_t names() const { return names_.size(); }
  size_t shapes() const { return shapes_.size(); }
  size_t regions() const { return regions_.size(); }
  absl::string_view name(uint32_t id) const { return names_.Get(id); }
  Shape shape(uint32_t id) const;
  Region region(uint32_t id) const;
  // Without materialising the region or shape.
  uint64_t RegionElements(uint32_t region_id) const;
  uint64_t FirstDim(uint32_t shape_id) const;  // 0 for a 0-d shape
  // A total order of regions: a box before a flat range, boxes (of one
  // rank count) by offsets then sizes, lexicographically, flat ranges by
  // start then length.
  bool RegionLess(uint32_t a, uint32_t b) const;

 private:
  absl::Status DecodeItems(absl::string_view bytes);
  // One item into *it; `hint` (when `hinted`) is the previous rank's item
  // at the same position.
  absl::Status DecodeItem(format::ByteReader* r, bool hinted,
                          const PlanItem& hint, PlanItem* it);

  Interner names_, shapes_, regions_;
  std::vector<PlanItem> items_;
  std::vector<size_t> begin_ = {0};  // rank r's items: [begin_[r], begin_[r+1])
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_PLAN_TABLE_H_
