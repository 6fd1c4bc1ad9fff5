// The block table of a chunk (spec/FORMAT.md §8.4) in memory: a vector of
// BlockRecord that takes one pointer, not three. Only a shard index's
// chunks have blocks; a manifest's millions of chunks hold an empty table,
// and its 8 bytes instead of std::vector's 24 are part of what keeps a
// decoded record within 16 bytes per byte on disk (SECURITY.md "Resource
// use").
#ifndef CKPT_FORMAT_BLOCK_TABLE_H_
#define CKPT_FORMAT_BLOCK_TABLE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>

namespace ckpt::format {

// One stored block of a chunk's payload (§8.4).
struct BlockRecord {
  uint64_t stored_size = 0;
  uint64_t checksum = 0;
  friend bool operator==(const BlockRecord& a, const BlockRecord& b) {
    return a.stored_size == b.stored_size && a.checksum == b.checksum;
  }
  friend bool operator!=(const BlockRecord& a, const BlockRecord& b) {
    return !(a == b);
  }
};

// The subset of std::vector<BlockRecord> that block tables need, with the
// same meaning. Size and capacity live in the allocation, ahead of the
// records, so an empty table allocates nothing. Thread-compatible.
class BlockTable {
 public:
  using value_type = BlockRecord;
  using size_type = size_t;
  using difference_type = ptrdiff_t;
  using reference = BlockRecord&;
  using const_reference = const BlockRecord&;
  using iterator = BlockRecord*;
  using const_iterator = const BlockRecord*;

  BlockTable() = default;
  BlockTable(std::initializer_list<BlockRecord> blocks) {
    assign(blocks.begin(), blocks.end());
  }
  BlockTable(const BlockTable& other) { assign(other.begin(), other.end()); }
  BlockTable(BlockTable&& other) noexcept = default;
  BlockTable& operator=(const BlockTable& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  BlockTable& operator=(BlockTable&& other) noexcept = default;
  BlockTable& operator=(std::initializer_list<BlockRecord> blocks) {
    assign(blocks.begin(), blocks.end());
    return *this;
  }

  size_t size() const { return rep_ ? rep_[0].stored_size : 0; }
  bool empty() const { return size() == 0; }
  size_t capacity() const { return rep_ ? rep_[0].checksum : 0; }

  BlockRecord* data() { return rep_ ? rep_.get() + 1 : nullptr; }
  const BlockRecord* data() const { return rep_ ? rep_.get() + 1 : nullptr; }
  iterator begin() { return data(); }
  iterator end() { return data() + size(); }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size(); }
  BlockRecord& operator[](size_t i) { return data()[i]; }
  const BlockRecord& operator[](size_t i) const { return data()[i]; }
  BlockRecord& front() { return data()[0]; }
  const BlockRecord& front() const { return data()[0]; }
  BlockRecord& back() { return data()[size() - 1]; }
  const BlockRecord& back() const { return data()[size() - 1]; }

  // Room for `n` records in all; never shrinks.
  void reserve(size_t n) {
    if (n <= capacity()) return;
    std::unique_ptr<BlockRecord[]> rep(new BlockRecord[n + 1]);
    const size_t count = size();
    std::copy(begin(), end(), rep.get() + 1);
    rep[0] = BlockRecord{count, n};
    rep_ = std::move(rep);
  }
  // New records are {0, 0}.
  void resize(size_t n) {
    reserve(n);
    if (n == 0 && !rep_) return;
    std::fill(data() + std::min(n, size()), data() + n, BlockRecord{});
    rep_[0].stored_size = n;
  }
  void push_back(const BlockRecord& b) {
    const size_t n = size();
    if (n == capacity()) reserve(std::max<size_t>(4, 2 * n));
    data()[n] = b;
    rep_[0].stored_size = n + 1;
  }
  // REQUIRES: !empty().
  void pop_back() { --rep_[0].stored_size; }
  // Frees the records, as shrink_to_fit would after std::vector's clear.
  void clear() { rep_.reset(); }

  friend bool operator==(const BlockTable& a, const BlockTable& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator!=(const BlockTable& a, const BlockTable& b) {
    return !(a == b);
  }

 private:
  template <typename It>
  void assign(It first, It last) {
    const size_t n = static_cast<size_t>(last - first);
    if (n == 0) {
      rep_.reset();
      return;
    }
    if (n > capacity()) {
      rep_.reset();
      reserve(n);
    }
    std::copy(first, last, data());
    rep_[0].stored_size = n;
  }

  // Null when nothing was ever reserved; else rep_[0] holds the size (in
  // stored_size) and the capacity (in checksum), and the records follow.
  std::unique_ptr<BlockRecord[]> rep_;
};

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_BLOCK_TABLE_H_
