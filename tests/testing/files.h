// Whole files of the real file system, for tests: the one copy of "read a
// file into a string" and "write a string to a file" that every suite uses.
#ifndef CKPT_TESTS_TESTING_FILES_H_
#define CKPT_TESTS_TESTING_FILES_H_

#include <fstream>
#include <iterator>
#include <string>

namespace ckpt::testing {

// The bytes of `path`; empty if it cannot be opened (a test that needs the
// file to exist checks that itself).
inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f),
                     std::istreambuf_iterator<char>());
}

// Creates or truncates `path` and writes `bytes` (no fsync).
inline void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_FILES_H_
