// Hand-built PyTorch DCP ".metadata" pickles (protocol 2) for tests of
// hostile metadata: shapes that overflow, chunk lists shared between
// tensors, runs of opcodes. Only the opcodes and classes that
// interop/dcp_metadata.cc reads; no torch needed.
#ifndef CKPT_TESTS_TESTING_DCP_PICKLE_H_
#define CKPT_TESTS_TESTING_DCP_PICKLE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::testing::dcp_pickle {

inline std::string Le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s += static_cast<char>(v >> (8 * i));
  return s;
}

// BINUNICODE.
inline std::string Str(const std::string& s) {
  return "X" + Le(s.size(), 4) + s;
}

// LONG1 of 8 bytes (any int64).
inline std::string Int(int64_t v) {
  return "\x8a\x08" + Le(static_cast<uint64_t>(v), 8);
}

// GLOBAL module.name.
inline std::string Global(const std::string& module, const std::string& name) {
  return "c" + module + "\n" + name + "\n";
}

inline std::string Tuple(const std::vector<std::string>& items) {
  std::string s = "(";
  for (const std::string& i : items) s += i;
  return s + "t";
}

inline std::string IntTuple(const std::vector<int64_t>& v) {
  std::vector<std::string> items;
  for (int64_t x : v) items.push_back(Int(x));
  return Tuple(items);
}

inline std::string Dict(
    const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string s = "}(";
  for (const auto& [k, v] : kv) s += k + v;
  return s + "u";
}

// An object of class `module`.`cls` with BUILD state `state`.
inline std::string ObjIn(const std::string& module, const std::string& cls,
                         const std::string& state) {
  return Global(module, cls) + ")\x81" + state + "b";
}

// An object of DCP's metadata module.
inline std::string Obj(const std::string& cls, const std::string& state) {
  return ObjIn("torch.distributed.checkpoint.metadata", cls, state);
}

// TensorStorageMetadata of a float32 tensor of `size`; `chunks` the pickle
// of its chunk list.
inline std::string Tensor(const std::vector<int64_t>& size,
                          const std::string& chunks) {
  const std::string props =
      Obj("TensorProperties", Tuple({Global("torch", "float32")}));
  return Obj("TensorStorageMetadata", Dict({{Str("properties"), props},
                                            {Str("size"), IntTuple(size)},
                                            {Str("chunks"), chunks}}));
}

inline std::string Chunk(const std::vector<int64_t>& offsets,
                         const std::vector<int64_t>& sizes) {
  return Obj("ChunkStorageMetadata", Dict({{Str("offsets"), IntTuple(offsets)},
                                           {Str("sizes"), IntTuple(sizes)}}));
}

// A storage_data item: the chunk of `fqn` at `offsets` is stored in
// `path` at [offset, offset + length). Key and value pickles.
inline std::pair<std::string, std::string> StorageItem(
    const std::string& fqn, const std::vector<int64_t>& offsets,
    const std::string& path, int64_t offset, int64_t length) {
  return {Obj("MetadataIndex", Dict({{Str("fqn"), Str(fqn)},
                                     {Str("offset"), IntTuple(offsets)},
                                     {Str("index"), "N"}})),
          ObjIn("torch.distributed.checkpoint.filesystem", "_StorageInfo",
                Dict({{Str("relative_path"), Str(path)},
                      {Str("offset"), Int(offset)},
                      {Str("length"), Int(length)}}))};
}

// Metadata of `tensors` (name and TensorStorageMetadata pickle each) and
// `storage` (StorageItem pickles).
inline std::string Metadata(
    const std::vector<std::pair<std::string, std::string>>& tensors,
    const std::vector<std::pair<std::string, std::string>>& storage = {}) {
  std::vector<std::pair<std::string, std::string>> sdm;
  for (const auto& [name, t] : tensors) sdm.emplace_back(Str(name), t);
  return "\x80\x02" +
         Obj("Metadata", Dict({{Str("state_dict_metadata"), Dict(sdm)},
                               {Str("storage_data"), Dict(storage)}})) +
         ".";
}

}  // namespace ckpt::testing::dcp_pickle

#endif  // CKPT_TESTS_TESTING_DCP_PICKLE_H_
