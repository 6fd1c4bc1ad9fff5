// The Storage contract (testing/storage_contract.h) on the POSIX storage
// and on FaultInjectingStorage over it with no rule set, which must be
// indistinguishable from its base.
#include "testing/storage_contract.h"

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/storage.h"
#include "ckpt/testing/fault_injection.h"
#include "gtest/gtest.h"

namespace ckpt::testing {
namespace {

class PosixUnderTest : public StorageUnderTest {
 public:
  explicit PosixUnderTest(bool wrap) {
    std::string tmpl = JoinPath(::testing::TempDir(), "ckpt-contract-XXXXXX");
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) != nullptr) root_ = buf.data();
    if (wrap)
      fault_ = std::make_unique<FaultInjectingStorage>(DefaultStorage());
  }
  ~PosixUnderTest() override {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }
  Storage* storage() override {
    return fault_ ? static_cast<Storage*>(fault_.get()) : DefaultStorage();
  }
  const std::string& root() const override { return root_; }

 private:
  std::string root_;
  std::unique_ptr<FaultInjectingStorage> fault_;
};

std::unique_ptr<StorageUnderTest> MakePosix(bool wrap, std::string* why) {
  auto env = std::make_unique<PosixUnderTest>(wrap);
  if (env->root().empty()) {
    *why = "mkdtemp failed";
    return nullptr;
  }
  return env;
}

INSTANTIATE_TEST_SUITE_P(
    Posix, StorageContractTest,
    ::testing::Values(StorageContractParam{"Posix",
                                           [](std::string* why) {
                                             return MakePosix(false, why);
                                           }},
                      StorageContractParam{"FaultInjectingOverPosix",
                                           [](std::string* why) {
                                             return MakePosix(true, why);
                                           }}),
    StorageContractName);

}  // namespace
}  // namespace ckpt::testing
