#include <string>

#include "gtest/gtest.h"
#include "transfer/kv_transfer.h"

namespace sluice::transfer {
namespace {

RemoteKvDescriptor Sample() {
  RemoteKvDescriptor desc;
  desc.worker_address = std::string("\x01\x02\x00worker", 9);
  desc.regions.push_back({0x7f0000001000ull, 64, 2048, std::string("rkey-a\0z", 8)});
  desc.regions.push_back({0x7f0000100000ull, 128, 512, "rkey-b"});
  return desc;
}

TEST(RemoteKvDescriptorTest, RoundTripsExactly) {
  const RemoteKvDescriptor desc = Sample();
  const std::string bytes = desc.Serialize();
  // 8 header + (4 + 9) address + 4 count + 2 * (24 + 4) + 8 + 6 rkeys.
  EXPECT_EQ(bytes.size(), 8u + 13u + 4u + 56u + 14u);
  auto parsed = RemoteKvDescriptor::Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->worker_address, desc.worker_address);
  ASSERT_EQ(parsed->regions.size(), 2u);
  EXPECT_EQ(parsed->regions[0].base_address, 0x7f0000001000ull);
  EXPECT_EQ(parsed->regions[0].num_blocks, 64);
  EXPECT_EQ(parsed->regions[0].block_bytes, 2048);
  EXPECT_EQ(parsed->regions[0].rkey, std::string("rkey-a\0z", 8));
  EXPECT_EQ(parsed->regions[1].base_address, 0x7f0000100000ull);
  EXPECT_EQ(parsed->regions[1].num_blocks, 128);
  EXPECT_EQ(parsed->regions[1].block_bytes, 512);
  EXPECT_EQ(parsed->regions[1].rkey, "rkey-b");
  EXPECT_EQ(parsed->Serialize(), bytes);
}

TEST(RemoteKvDescriptorTest, EveryTruncationIsInvalidArgument) {
  const std::string bytes = Sample().Serialize();
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(RemoteKvDescriptor::Parse(bytes.substr(0, n)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "prefix of " << n << " bytes";
  }
  EXPECT_EQ(RemoteKvDescriptor::Parse(bytes + "x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RemoteKvDescriptorTest, RejectsGarbageAndBadGeometry) {
  EXPECT_EQ(RemoteKvDescriptor::Parse("hello world, not a descriptor").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string bytes = Sample().Serialize();
  bytes[4] = 2;  // version 2
  EXPECT_EQ(RemoteKvDescriptor::Parse(bytes).status().code(), absl::StatusCode::kInvalidArgument);

  RemoteKvDescriptor desc = Sample();
  desc.regions[1].block_bytes = 0;
  EXPECT_EQ(RemoteKvDescriptor::Parse(desc.Serialize()).status().code(),
            absl::StatusCode::kInvalidArgument);
  desc = Sample();
  desc.regions[0].base_address = ~0ull - 4096;  // region would wrap past 2^64
  EXPECT_EQ(RemoteKvDescriptor::Parse(desc.Serialize()).status().code(),
            absl::StatusCode::kInvalidArgument);
  desc = Sample();
  desc.regions[0].num_blocks = -1;
  EXPECT_EQ(RemoteKvDescriptor::Parse(desc.Serialize()).status().code(),
            absl::StatusCode::kInvalidArgument);
  desc = Sample();
  desc.regions[0].rkey.clear();
  EXPECT_EQ(RemoteKvDescriptor::Parse(desc.Serialize()).status().code(),
            absl::StatusCode::kInvalidArgument);
  desc = Sample();
  desc.worker_address.clear();
  EXPECT_EQ(RemoteKvDescriptor::Parse(desc.Serialize()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RemoteKvDescriptorTest, SelectRegions) {
  const RemoteKvDescriptor desc = Sample();
  auto second = desc.SelectRegions(1, 1);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->worker_address, desc.worker_address);
  ASSERT_EQ(second->regions.size(), 1u);
  EXPECT_EQ(second->regions[0].rkey, "rkey-b");
  EXPECT_TRUE(desc.SelectRegions(2, 0).ok());
  EXPECT_EQ(desc.SelectRegions(1, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(desc.SelectRegions(3, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::transfer
