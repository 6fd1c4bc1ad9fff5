// What a Writer holds for one registration (AddTensor, AddTensorSource,
// SetObject): the item as the planner sees it and where its bytes are.
#ifndef CKPT_LIBCKPT_SAVE_REGISTRATION_H_
#define CKPT_LIBCKPT_SAVE_REGISTRATION_H_

#include <string>

#include "ckpt/format/records.h"
#include "ckpt/types.h"
#include "ckpt/writer.h"
#include "save/save_plan.h"

namespace ckpt::internal {

struct Registration {
  LocalItem item;
  const void* data = nullptr;  // tensors: the caller's memory
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  std::string bytes;    // objects only
  TensorSource source;  // AddTensorSource only
  // ItemFingerprint(item); sizes of objects excluded.
  format::Fingerprint fp{};
};

}  // namespace ckpt::internal

#endif  // CKPT_LIBCKPT_SAVE_REGISTRATION_H_
