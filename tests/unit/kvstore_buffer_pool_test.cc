// KvStoreBufferPool (services/kvstore/kvstore_buffer_pool.h): buffers lent from a UCX-registered
// arena, first fit, merged on release, heap memory when the arena is full.
#include "services/kvstore/kvstore_buffer_pool.h"

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "transfer/kv_transfer.h"

namespace sluice::kvstore {
namespace {

class KvStoreBufferPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto agent = transfer::KvTransferAgent::Create({});
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = *std::move(agent);
    auto pool = KvStoreBufferPool::Create(agent_.get(), 1024);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }
  std::unique_ptr<transfer::KvTransferAgent> agent_;
  std::unique_ptr<KvStoreBufferPool> pool_;
};

TEST_F(KvStoreBufferPoolTest, LendsFirstFitAndMergesOnRelease) {
  KvBlockBuffer a = pool_->Allocate(100);  // 128 with alignment
  KvBlockBuffer b = pool_->Allocate(256);
  KvBlockBuffer c = pool_->Allocate(512);
  ASSERT_TRUE(a.lent() && b.lent() && c.lent());
  EXPECT_EQ(a.size(), 100u);
  EXPECT_EQ(b.data(), a.data() + 128);
  EXPECT_EQ(c.data(), b.data() + 256);
  EXPECT_TRUE(pool_->Contains(c.data(), 512));
  EXPECT_EQ(pool_->stats().lent_bytes, 896);
  // 128 bytes are left: a 256-byte buffer comes from the heap.
  KvBlockBuffer d = pool_->Allocate(256);
  EXPECT_FALSE(d.lent());
  EXPECT_FALSE(pool_->Contains(d.data(), d.size()));
  EXPECT_EQ(pool_->stats().num_heap_fallbacks, 1);
  // a and b given back merge into one 384-byte range at the start.
  uint8_t* const start = a.data();
  a = KvBlockBuffer();
  b = KvBlockBuffer();
  KvBlockBuffer e = pool_->Allocate(384);
  ASSERT_TRUE(e.lent());
  EXPECT_EQ(e.data(), start);
  // A moved buffer gives its range back once.
  KvBlockBuffer moved = std::move(c);
  EXPECT_FALSE(c.lent());
  moved = KvBlockBuffer();
  e = KvBlockBuffer();
  EXPECT_EQ(pool_->stats().lent_bytes, 0);
  KvBlockBuffer whole = pool_->Allocate(1024);
  EXPECT_TRUE(whole.lent());
  EXPECT_EQ(pool_->stats().num_lent, 5);
}

TEST_F(KvStoreBufferPoolTest, ShrinkKeepsTheLease) {
  KvBlockBuffer a = pool_->Allocate(1024);
  a.Shrink(10);
  EXPECT_EQ(a.size(), 10u);
  a = KvBlockBuffer();
  EXPECT_EQ(pool_->stats().lent_bytes, 0);
  EXPECT_TRUE(pool_->Allocate(1024).lent());
}

TEST_F(KvStoreBufferPoolTest, BuffersMayOutliveThePool) {
  KvBlockBuffer a = pool_->Allocate(64);
  pool_.reset();
  a = KvBlockBuffer();  // no-op release, no crash
  EXPECT_EQ(KvStoreBufferPool::Create(agent_.get(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvStoreBufferPool::Create(nullptr, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kvstore
