#include "ckpt/gpu/device.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::gpu {
namespace {

using ::testing::MatchesRegex;

// No GPU or no driver is a configuration, not an error.
TEST(QueryDevicesTest, SucceedsWithOrWithoutDevices) {
  auto devices = QueryDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
}

TEST(QueryDevicesTest, IsRepeatable) {
  auto first = QueryDevices();
  auto second = QueryDevices();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->size(), second->size());
}

TEST(QueryDevicesTest, ReportsPlausibleProperties) {
  auto devices = QueryDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (devices->empty()) GTEST_SKIP() << "no CUDA device";

  std::set<std::string> bus_ids;
  for (size_t i = 0; i < devices->size(); ++i) {
    const DeviceInfo& d = (*devices)[i];
    SCOPED_TRACE(d.name);
    EXPECT_EQ(d.ordinal, static_cast<int>(i));
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory_bytes, 0u);
    EXPECT_GE(d.compute_capability_major, 3);
    EXPECT_GE(d.compute_capability_minor, 0);
    EXPECT_THAT(d.pci_bus_id,
                MatchesRegex("[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\\.[0-9]"));
    bus_ids.insert(d.pci_bus_id);
  }
  EXPECT_EQ(bus_ids.size(), devices->size());
}

}  // namespace
}  // namespace ckpt::gpu
