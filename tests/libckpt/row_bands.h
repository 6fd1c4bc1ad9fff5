// The checkpoint the cooperative load tests read: float32 tensors saved by
// in-process ranks, each rank holding one band of rows of every tensor.
#ifndef CKPT_TESTS_LIBCKPT_ROW_BANDS_H_
#define CKPT_TESTS_LIBCKPT_ROW_BANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/format/status_macros.h"
#include "ckpt/in_process.h"
#include "ckpt/writer.h"
#include "gtest/gtest.h"
#include "libckpt/test_util.h"

namespace ckpt::testing {

// Saves `count` float32 tensors "t0", "t1", ... of rows x cols at step 1
// in blocks of `block_size` bytes, from `ranks` in-process ranks, rank r
// holding rows [r rows / ranks, (r + 1) rows / ranks) of each; tensor i is
// ReferenceBytes(float32, {rows, cols}, seed + i). Returns the tensors'
// global bytes. REQUIRES: ranks divides rows.
inline std::vector<std::string> SaveRowBands(const std::string& root, int ranks,
                                             int count, uint64_t rows,
                                             uint64_t cols, int seed,
                                             uint64_t block_size = 4096) {
  std::vector<std::string> global;
  for (int i = 0; i < count; ++i) {
    global.push_back(ReferenceBytes(DType::kFloat32, {rows, cols}, seed + i));
  }
  InProcessWorld w(ranks);
  absl::Status st = RunRanks(w, [&](Communicator& comm) -> absl::Status {
    Writer::Options wo;
    wo.comm = &comm;
    CKPT_ASSIGN_OR_RETURN(auto writer, Writer::Create(wo));
    const uint64_t r0 = comm.rank() * rows / ranks;
    for (int i = 0; i < count; ++i) {
      CKPT_RETURN_IF_ERROR(writer->AddTensor("t" + std::to_string(i),
                                             DType::kFloat32, {rows, cols},
                                             Box{{r0, 0}, {rows / ranks, cols}},
                                             global[i].data() + r0 * cols * 4));
    }
    SaveOptions so;
    so.block_size = block_size;
    return writer->Save(root, 1, so).status();
  });
  EXPECT_TRUE(st.ok()) << st;
  return global;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_LIBCKPT_ROW_BANDS_H_
