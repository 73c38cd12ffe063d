#include "transfer/staged_transfer.h"
#include "transfer/staging_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "transfer/block_runs.h"
#include "transfer/device_copier.h"
#include "transfer/kv_transfer.h"

namespace sluice::transfer {
namespace {

constexpr int kNumRegions = 3;
constexpr int kNumBlocks = 48;
constexpr int kBlockBytes = 1024;

uint8_t Pattern(int seed, int r, int b, int o) {
  return static_cast<uint8_t>((seed * 7919 + r * 104729 + b * 131 + o * 7) % 251);
}

// KV-shaped buffers; `registered` only for the peer (the local side stands in for device
// memory, which the transport cannot reach).
struct Buffers {
  std::vector<std::vector<uint8_t>> data;
  std::vector<KvRegion> regions;
  explicit Buffers(int seed) : data(kNumRegions, std::vector<uint8_t>(kNumBlocks * kBlockBytes)) {
    for (int r = 0; r < kNumRegions; ++r) {
      for (int b = 0; b < kNumBlocks; ++b) {
        for (int o = 0; o < kBlockBytes; ++o) data[r][b * kBlockBytes + o] = Pattern(seed, r, b, o);
      }
      regions.push_back({data[r].data(), kNumBlocks, kBlockBytes});
    }
  }
  bool BlockHolds(int r, int b, int seed, int src_block) const {
    for (int o = 0; o < kBlockBytes; ++o) {
      if (data[r][b * kBlockBytes + o] != Pattern(seed, r, src_block, o)) return false;
    }
    return true;
  }
};

std::unique_ptr<KvTransferAgent> MakeAgent(const std::string& transports) {
  KvTransferOptions options;
  options.transports = transports;
  options.peer_failure_detection = transports != "sm";
  auto agent = KvTransferAgent::Create(options);
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? std::move(*agent) : nullptr;
}

struct Fixture {
  std::unique_ptr<KvTransferAgent> peer, local;
  Buffers peer_kv{1}, local_kv{2};
  RemoteKvDescriptor desc;
  HostMemcpyCopier copier;  // one lane per slot
  std::unique_ptr<StagedKvTransfer> staged;

  Fixture(const std::string& transports, const StagingOptions& options)
      : copier(options.num_slots) {
    peer = MakeAgent(transports);
    local = MakeAgent(transports);
    if (peer == nullptr || local == nullptr) return;
    for (const KvRegion& r : peer_kv.regions) {
      EXPECT_TRUE(peer->RegisterRegion(r.base, r.num_blocks * r.block_bytes).ok());
    }
    auto d = peer->Describe(peer_kv.regions);
    EXPECT_TRUE(d.ok()) << d.status();
    if (d.ok()) desc = *std::move(d);
    auto s = StagedKvTransfer::Create(local.get(), &copier, options);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) staged = *std::move(s);
  }
};

class StagedKvTransferTest : public ::testing::TestWithParam<std::string> {};

// Scattered runs, slots of 3 blocks (runs split across slots, more chunks than slots): every
// moved block exact, every other block untouched. The copier runs a lane's copies only at its
// Wait, so a slot reused or read before its copies finished would show here.
TEST_P(StagedKvTransferTest, PullThroughStagingIsExact) {
  StagingOptions options;
  options.slot_bytes = 3 * kBlockBytes;
  options.num_slots = 2;
  Fixture f(GetParam(), options);
  ASSERT_NE(f.staged, nullptr);
  const std::vector<int32_t> src = {5, 6, 7, 8, 9, 20, 21, 40, 41, 42, 43, 44, 45, 46, 47};
  const std::vector<int32_t> dst = {0, 1, 2, 3, 30, 31, 32, 33, 34, 35, 10, 11, 12, 13, 14};
  absl::Status s = f.staged->Pull(f.desc, CoalesceBlocks(src), f.local_kv.regions,
                                  CoalesceBlocks(dst), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < kNumRegions; ++r) {
    for (int b = 0; b < kNumBlocks; ++b) {
      auto it = std::find(dst.begin(), dst.end(), b);
      if (it == dst.end()) {
        EXPECT_TRUE(f.local_kv.BlockHolds(r, b, 2, b))
            << "untouched region " << r << " block " << b;
      } else {
        EXPECT_TRUE(f.local_kv.BlockHolds(r, b, 1, src[it - dst.begin()]))
            << "region " << r << " block " << b;
      }
    }
  }
  const StagedTransferStats stats = f.staged->stats();
  // 15 blocks per region in slots of 3: 5 chunks per region.
  EXPECT_EQ(stats.num_chunks, 5 * kNumRegions);
  EXPECT_EQ(stats.bytes_pulled, 15 * kBlockBytes * kNumRegions);
  EXPECT_EQ(f.copier.num_copies(), stats.num_device_copies);
}

TEST_P(StagedKvTransferTest, PushThroughStagingIsExact) {
  for (int slots : {1, 2, 3}) {
    StagingOptions options;
    options.slot_bytes = 4 * kBlockBytes;
    options.num_slots = slots;
    Fixture f(GetParam(), options);
    ASSERT_NE(f.staged, nullptr);
    const std::vector<int32_t> src = {0, 1, 2, 3, 4, 5, 6, 17, 30, 31, 32, 33, 34};  // local
    const std::vector<int32_t> dst = {10, 11, 12, 40, 41, 42, 43, 44, 20, 21, 22, 23, 47};
    absl::Status s = f.staged->Push(f.desc, CoalesceBlocks(dst), f.local_kv.regions,
                                    CoalesceBlocks(src), absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(s.ok()) << s;
    for (int r = 0; r < kNumRegions; ++r) {
      for (int b = 0; b < kNumBlocks; ++b) {
        auto it = std::find(dst.begin(), dst.end(), b);
        const bool moved = it != dst.end();
        EXPECT_TRUE(f.peer_kv.BlockHolds(r, b, moved ? 2 : 1, moved ? src[it - dst.begin()] : b))
            << slots << " slots, peer region " << r << " block " << b;
        EXPECT_TRUE(f.local_kv.BlockHolds(r, b, 2, b));
      }
    }
    EXPECT_EQ(f.staged->stats().bytes_pushed, 13 * kBlockBytes * kNumRegions);
  }
}

// Layer-by-layer push: one layer's regions at a time, as prefill would after each layer.
TEST_P(StagedKvTransferTest, LayerByLayerPush) {
  Fixture f(GetParam(), StagingOptions{2 * kBlockBytes, 2});
  ASSERT_NE(f.staged, nullptr);
  const std::vector<BlockRun> local_runs = {{0, 5}}, remote_runs = {{20, 5}};
  for (int r = 0; r < kNumRegions; ++r) {
    auto layer = f.desc.SelectRegions(r, 1);
    ASSERT_TRUE(layer.ok());
    const auto local_layer = absl::MakeConstSpan(f.local_kv.regions).subspan(r, 1);
    ASSERT_TRUE(f.staged
                    ->Push(*layer, remote_runs, local_layer, local_runs,
                           absl::Now() + absl::Seconds(10))
                    .ok());
    for (int b = 0; b < 5; ++b) EXPECT_TRUE(f.peer_kv.BlockHolds(r, 20 + b, 2, b));
    if (r + 1 < kNumRegions) {
      EXPECT_TRUE(f.peer_kv.BlockHolds(r + 1, 20, 1, 20));  // later layers not yet
    }
  }
}

TEST_P(StagedKvTransferTest, RejectsBadRequestsBeforeMovingBytes) {
  Fixture f(GetParam(), StagingOptions{2 * kBlockBytes, 2});
  ASSERT_NE(f.staged, nullptr);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  const std::vector<BlockRun> one = {{0, 1}};
  // Region count mismatch.
  EXPECT_EQ(f.staged->Pull(f.desc, one, absl::MakeConstSpan(f.local_kv.regions).subspan(0, 2), one,
                           deadline)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Runs past the end.
  const std::vector<BlockRun> far = {{kNumBlocks - 1, 2}};
  EXPECT_EQ(f.staged->Pull(f.desc, far, f.local_kv.regions, far, deadline).code(),
            absl::StatusCode::kInvalidArgument);
  // Block bigger than a slot.
  std::vector<std::vector<uint8_t>> big(kNumRegions, std::vector<uint8_t>(4 * kBlockBytes * 4));
  std::vector<KvRegion> big_regions;
  RemoteKvDescriptor big_desc = f.desc;
  for (int r = 0; r < kNumRegions; ++r) {
    big_regions.push_back({big[r].data(), 4, 4 * kBlockBytes});
    big_desc.regions[r].block_bytes = 4 * kBlockBytes;
    big_desc.regions[r].num_blocks = kNumBlocks / 4;
  }
  EXPECT_EQ(f.staged->Pull(big_desc, one, big_regions, one, deadline).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.staged->stats().num_chunks, 0);
  EXPECT_TRUE(f.local_kv.BlockHolds(0, 0, 2, 0));
}

INSTANTIATE_TEST_SUITE_P(Transports, StagedKvTransferTest, ::testing::Values("sm", "tcp"),
                         [](const auto& info) { return info.param; });

TEST(StagedKvTransferPlanTest, ChunksFillSlotsAndSplitRuns) {
  std::vector<uint8_t> a(64 * 100), b(64 * 200);
  const std::vector<KvRegion> regions = {{a.data(), 64, 100}, {b.data(), 64, 200}};
  const std::vector<RunPair> pairs = {{0, 10, 5}, {20, 15, 2}};
  auto chunks = StagedKvTransfer::PlanChunks(pairs, regions, /*slot_bytes=*/450);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  // Region 0: 4 blocks per slot -> [0..3], [4 | 20..22]... region 1: 2 blocks per slot.
  ASSERT_EQ(chunks->size(), 2u + 4u);
  EXPECT_EQ((*chunks)[0].region, 0u);
  EXPECT_EQ((*chunks)[0].num_blocks, 4);
  ASSERT_EQ((*chunks)[1].pairs.size(), 2u);
  EXPECT_EQ((*chunks)[1].pairs[0].remote_first, 4);
  EXPECT_EQ((*chunks)[1].pairs[0].local_first, 14);
  EXPECT_EQ((*chunks)[1].pairs[1].remote_first, 20);
  EXPECT_EQ((*chunks)[1].num_blocks, 3);
  for (size_t i = 2; i < chunks->size(); ++i) {
    EXPECT_EQ((*chunks)[i].region, 1u);
    EXPECT_LE((*chunks)[i].num_blocks, 2);
  }
  EXPECT_EQ(StagedKvTransfer::PlanChunks(pairs, regions, 150).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StagedKvTransferPlanTest, CreateValidatesOptions) {
  auto agent = MakeAgent("tcp");
  ASSERT_NE(agent, nullptr);
  HostMemcpyCopier copier(1);
  EXPECT_EQ(StagedKvTransfer::Create(agent.get(), &copier, {1024, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);  // 1 lane for 2 slots
  EXPECT_EQ(StagedKvTransfer::Create(agent.get(), &copier, {0, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(StagedKvTransfer::Create(agent.get(), &copier, {1024, 1}).ok());
}

// A peer that is gone: an error within the deadline, every lane drained, and the same staging
// serves the next transfer.
TEST(StagedKvTransferFailureTest, PeerGoneThenNextTransferWorks) {
  StagingOptions options{2 * kBlockBytes, 2};
  Fixture f("tcp", options);
  ASSERT_NE(f.staged, nullptr);
  RemoteKvDescriptor gone_desc;
  {
    auto gone = MakeAgent("tcp");
    ASSERT_NE(gone, nullptr);
    Buffers kv(3);
    for (const KvRegion& r : kv.regions) {
      ASSERT_TRUE(gone->RegisterRegion(r.base, r.num_blocks * r.block_bytes).ok());
    }
    gone_desc = *gone->Describe(kv.regions);
  }
  const std::vector<BlockRun> runs = {{0, 6}};
  absl::Status s = f.staged->Pull(gone_desc, runs, f.local_kv.regions, runs,
                                  absl::Now() + absl::Seconds(3));
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  EXPECT_FALSE(IsStagingCopyFailure(s)) << s;  // the network's error, not a copy's
  ASSERT_TRUE(
      f.staged->Pull(f.desc, runs, f.local_kv.regions, runs, absl::Now() + absl::Seconds(10)).ok());
  for (int b = 0; b < 6; ++b) EXPECT_TRUE(f.local_kv.BlockHolds(1, b, 1, b));
}

// HookCopier: a HostMemcpyCopier that runs `on_first_wait` when a lane is first waited for (a
// staged pull waits for a slot before reusing it: chunks 0 .. num_slots - 1 are then read).
class HookCopier final : public DeviceCopier {
 public:
  explicit HookCopier(int num_lanes) : inner_(num_lanes) {}
  int num_lanes() const override { return inner_.num_lanes(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_.AllocateStaging(bytes);
  }
  void FreeStaging(void* staging) override { inner_.FreeStaging(staging); }
  absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                         CopyDirection direction) override {
    ++num_enqueued_;
    return inner_.CopyAsync(lane, dst, src, bytes, direction);
  }
  absl::Status Wait(int lane) override {
    if (on_first_wait) std::exchange(on_first_wait, nullptr)();
    return inner_.Wait(lane);
  }
  int64_t num_enqueued() const { return num_enqueued_; }
  int64_t num_run() const { return inner_.num_copies(); }
  std::function<void()> on_first_wait;

 private:
  HostMemcpyCopier inner_;
  int64_t num_enqueued_ = 0;
};

// The peer goes away after two of a pull's chunks were read (its next RMA get fails): an error
// within the deadline, the chunks read before landed and nothing after them, no copy left
// pending, nothing counted as pulled, and the same slots serve the next pull exactly.
TEST(StagedKvTransferFailureTest, GetFailingMidPullDrainsAndFreesTheSlots) {
  auto peer = MakeAgent("tcp");
  auto local = MakeAgent("tcp");
  ASSERT_NE(peer, nullptr);
  ASSERT_NE(local, nullptr);
  Buffers peer_kv(1), local_kv(2);
  for (const KvRegion& r : peer_kv.regions) {
    ASSERT_TRUE(peer->RegisterRegion(r.base, r.num_blocks * r.block_bytes).ok());
  }
  auto desc = peer->Describe(peer_kv.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();
  HookCopier copier(2);
  auto staged = StagedKvTransfer::Create(local.get(), &copier, StagingOptions{2 * kBlockBytes, 2});
  ASSERT_TRUE(staged.ok()) << staged.status();
  copier.on_first_wait = [&peer] { peer.reset(); };  // before chunk 2's get
  const std::vector<BlockRun> runs = {{0, 10}};  // 5 chunks of 2 blocks per region
  const absl::Time start = absl::Now();
  absl::Status s = (*staged)->Pull(*desc, runs, local_kv.regions, runs, start + absl::Seconds(3));
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
  for (int b = 0; b < 10; ++b) {
    // Chunks 0 and 1 (region 0, blocks 0..3) were read and copied in; nothing after them.
    EXPECT_TRUE(b < 4 ? local_kv.BlockHolds(0, b, 1, b) : local_kv.BlockHolds(0, b, 2, b)) << b;
    EXPECT_TRUE(local_kv.BlockHolds(1, b, 2, b)) << b;
    EXPECT_TRUE(local_kv.BlockHolds(2, b, 2, b)) << b;
  }
  EXPECT_EQ(copier.num_run(), copier.num_enqueued());  // every lane drained
  StagedTransferStats stats = (*staged)->stats();
  EXPECT_EQ(stats.bytes_pulled, 0);
  EXPECT_EQ(stats.num_chunks, 3);

  auto next_peer = MakeAgent("tcp");
  ASSERT_NE(next_peer, nullptr);
  Buffers next_kv(3);
  for (const KvRegion& r : next_kv.regions) {
    ASSERT_TRUE(next_peer->RegisterRegion(r.base, r.num_blocks * r.block_bytes).ok());
  }
  auto next_desc = next_peer->Describe(next_kv.regions);
  ASSERT_TRUE(next_desc.ok()) << next_desc.status();
  ASSERT_TRUE((*staged)
                  ->Pull(*next_desc, runs, local_kv.regions, runs, absl::Now() + absl::Seconds(10))
                  .ok());
  for (int r = 0; r < kNumRegions; ++r) {
    for (int b = 0; b < 10; ++b) EXPECT_TRUE(local_kv.BlockHolds(r, b, 3, b)) << r << " " << b;
  }
  EXPECT_EQ((*staged)->stats().bytes_pulled, 10 * kBlockBytes * kNumRegions);
  EXPECT_EQ(copier.num_run(), copier.num_enqueued());
}

// FaultyCopier: a HostMemcpyCopier whose `fail_wait`-th Wait (0-based) or `fail_enqueue`-th
// CopyAsync fails with Internal, as a device copy that faulted would (the lane's copies are
// over either way: a failed Wait still ran them, a refused CopyAsync queued nothing).
class FaultyCopier final : public DeviceCopier {
 public:
  explicit FaultyCopier(int num_lanes) : inner_(num_lanes) {}
  int num_lanes() const override { return inner_.num_lanes(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_.AllocateStaging(bytes);
  }
  void FreeStaging(void* staging) override { inner_.FreeStaging(staging); }
  absl::Status CopyAsync(int lane, void* dst, const void* src, int64_t bytes,
                         CopyDirection direction) override {
    if (num_enqueue_calls_++ == fail_enqueue) {
      return absl::InternalError("injected: cudaMemcpyAsync failed");
    }
    ++num_enqueued_;
    return inner_.CopyAsync(lane, dst, src, bytes, direction);
  }
  absl::Status Wait(int lane) override {
    absl::Status s = inner_.Wait(lane);
    if (num_waits_++ == fail_wait) return absl::InternalError("injected: copy faulted");
    return s;
  }
  int64_t num_enqueued() const { return num_enqueued_; }
  int64_t num_run() const { return inner_.num_copies(); }
  int num_enqueue_calls() const { return num_enqueue_calls_; }
  int fail_wait = -1;
  int fail_enqueue = -1;

 private:
  HostMemcpyCopier inner_;
  int num_waits_ = 0;
  int num_enqueue_calls_ = 0;
  int64_t num_enqueued_ = 0;
};

// A device copy that fails mid-pull and mid-push: the error keeps its code and is marked as a
// copy's (IsStagingCopyFailure, naming the direction), every lane is drained, nothing counts as
// moved, and the same staging then serves the next transfer exactly.
TEST(StagedKvTransferFailureTest, DeviceCopyFailureIsMarkedAndDrains) {
  auto peer = MakeAgent("tcp");
  auto local = MakeAgent("tcp");
  ASSERT_NE(peer, nullptr);
  ASSERT_NE(local, nullptr);
  Buffers peer_kv(1), local_kv(2);
  for (const KvRegion& r : peer_kv.regions) {
    ASSERT_TRUE(peer->RegisterRegion(r.base, r.num_blocks * r.block_bytes).ok());
  }
  auto desc = peer->Describe(peer_kv.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();
  FaultyCopier copier(2);
  auto staged = StagedKvTransfer::Create(local.get(), &copier, StagingOptions{2 * kBlockBytes, 2});
  ASSERT_TRUE(staged.ok()) << staged.status();
  const std::vector<BlockRun> runs = {{0, 10}};  // 5 chunks of 2 blocks per region
  const absl::Time deadline = absl::Now() + absl::Seconds(10);

  copier.fail_wait = 0;  // the first slot's host -> device copies (before chunk 2's read)
  absl::Status s = (*staged)->Pull(*desc, runs, local_kv.regions, runs, deadline);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(IsStagingCopyFailure(s)) << s;
  EXPECT_EQ(s.message(),
            "host -> device copy of a staged KV transfer failed: injected: copy faulted");
  EXPECT_EQ(copier.num_run(), copier.num_enqueued());  // every lane drained
  EXPECT_EQ((*staged)->stats().bytes_pulled, 0);
  EXPECT_EQ((*staged)->stats().num_chunks, 2);  // stopped before chunk 2's read

  EXPECT_FALSE(IsStagingCopyFailure(absl::OkStatus()));
  EXPECT_FALSE(IsStagingCopyFailure(absl::InternalError("host -> device copy")));
  ASSERT_TRUE((*staged)->Pull(*desc, runs, local_kv.regions, runs, deadline).ok());
  for (int r = 0; r < kNumRegions; ++r) {
    for (int b = 0; b < 10; ++b) EXPECT_TRUE(local_kv.BlockHolds(r, b, 1, b)) << r << " " << b;
  }
  EXPECT_EQ((*staged)->stats().bytes_pulled, 10 * kBlockBytes * kNumRegions);

  copier.fail_enqueue = copier.num_enqueue_calls() + 3;  // the push's fourth device -> host copy
  s = (*staged)->Push(*desc, runs, local_kv.regions, runs, deadline);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(IsStagingCopyFailure(s)) << s;
  EXPECT_EQ(s.message(),
            "device -> host copy of a staged KV transfer failed: injected: cudaMemcpyAsync failed");
  EXPECT_EQ(copier.num_run(), copier.num_enqueued());
  EXPECT_EQ((*staged)->stats().bytes_pushed, 0);
}

// A staging pool of two members: two pulls run at once, each exact; a third waits for a member
// and, when none comes free before its deadline, fails with DeadlineExceeded having moved
// nothing; once one is free it runs. Stats are the members' summed.
TEST(StagingPoolTest, ConcurrentPullsAndDeadlineWhileBusy) {
  auto peer = MakeAgent("tcp");
  auto local = MakeAgent("tcp");
  ASSERT_NE(peer, nullptr);
  ASSERT_NE(local, nullptr);
  Buffers peer_kv(1), local_kv(2);
  for (const KvRegion& r : peer_kv.regions) {
    ASSERT_TRUE(peer->RegisterRegion(r.base, r.num_blocks * r.block_bytes).ok());
  }
  auto desc = peer->Describe(peer_kv.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();
  std::vector<HookCopier*> copiers;
  auto pool = StagingPool::Create(
      local.get(), 2,
      [&copiers]() -> absl::StatusOr<std::unique_ptr<DeviceCopier>> {
        auto copier = std::make_unique<HookCopier>(2);
        copiers.push_back(copier.get());
        return std::unique_ptr<DeviceCopier>(std::move(copier));
      },
      StagingOptions{2 * kBlockBytes, 2});
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(copiers.size(), 2u);
  EXPECT_EQ(StagingPool::Create(local.get(), 0, nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Both members held: each pull stops at its first lane wait until released.
  absl::Notification release;
  std::atomic<int> waiting{0};
  for (HookCopier* c : copiers) {
    c->on_first_wait = [&] {
      ++waiting;
      release.WaitForNotification();
    };
  }
  const std::vector<BlockRun> first = {{0, 6}}, second = {{10, 6}}, third = {{20, 4}};
  const absl::Time later = absl::Now() + absl::Seconds(30);
  absl::Status s1, s2;
  std::thread t1([&] { s1 = (*pool)->Pull(*desc, first, local_kv.regions, first, later); });
  std::thread t2([&] { s2 = (*pool)->Pull(*desc, second, local_kv.regions, second, later); });
  while (waiting.load() < 2) absl::SleepFor(absl::Milliseconds(1));  // both members busy
  const absl::Time start = absl::Now();
  EXPECT_EQ((*pool)
                ->Pull(*desc, third, local_kv.regions, third, start + absl::Milliseconds(200))
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  release.Notify();
  t1.join();
  t2.join();
  ASSERT_TRUE(s1.ok()) << s1;
  ASSERT_TRUE(s2.ok()) << s2;
  for (int r = 0; r < kNumRegions; ++r) {
    for (int b = 0; b < kNumBlocks; ++b) {
      const bool pulled = b < 6 || (b >= 10 && b < 16);
      EXPECT_TRUE(local_kv.BlockHolds(r, b, pulled ? 1 : 2, b)) << r << " " << b;
    }
  }
  EXPECT_EQ((*pool)->stats().bytes_pulled, 12 * kBlockBytes * kNumRegions);
  ASSERT_TRUE((*pool)->Pull(*desc, third, local_kv.regions, third, later).ok());
  for (int b = 20; b < 24; ++b) EXPECT_TRUE(local_kv.BlockHolds(2, b, 1, b)) << b;
  const StagedTransferStats stats = (*pool)->stats();
  EXPECT_EQ(stats.bytes_pulled, 16 * kBlockBytes * kNumRegions);
  EXPECT_EQ(stats.num_chunks, (*pool)->member(0)->stats().num_chunks +
                                  (*pool)->member(1)->stats().num_chunks);
  EXPECT_EQ(stats.num_chunks, (3 + 3 + 2) * kNumRegions);
}

// Two pushes through a pool of two members (a prefill worker's concurrent PushKv calls or
// layer groups): both are inside their transfers at once — each holds at its first lane wait
// until the other got there too — and each lands its own bytes in the peer's blocks.
TEST(StagingPoolTest, ConcurrentPushesOverlapAndLandExactly) {
  auto peer = MakeAgent("tcp");
  auto local = MakeAgent("tcp");
  ASSERT_NE(peer, nullptr);
  ASSERT_NE(local, nullptr);
  Buffers peer_kv(1), local_kv(2);
  for (const KvRegion& r : peer_kv.regions) {
    ASSERT_TRUE(peer->RegisterRegion(r.base, r.num_blocks * r.block_bytes).ok());
  }
  auto desc = peer->Describe(peer_kv.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();
  std::vector<HookCopier*> copiers;
  auto pool = StagingPool::Create(
      local.get(), 2,
      [&copiers]() -> absl::StatusOr<std::unique_ptr<DeviceCopier>> {
        auto copier = std::make_unique<HookCopier>(2);
        copiers.push_back(copier.get());
        return std::unique_ptr<DeviceCopier>(std::move(copier));
      },
      StagingOptions{2 * kBlockBytes, 2});
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::atomic<int> inside{0}, gave_up{0};
  for (HookCopier* c : copiers) {
    c->on_first_wait = [&inside, &gave_up] {
      ++inside;
      // Held until both pushes are in. A pool that ran them one after the other would hold the
      // first here alone until it gives up.
      const absl::Time until = absl::Now() + absl::Seconds(10);
      while (inside.load() < 2 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
      if (inside.load() < 2) ++gave_up;
    };
  }
  // Local blocks 0..6 -> peer 20..26 and local 10..14 -> peer 40..44: several chunks each.
  const std::vector<BlockRun> local_a = {{0, 7}}, remote_a = {{20, 7}};
  const std::vector<BlockRun> local_b = {{10, 5}}, remote_b = {{40, 5}};
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::Status sa, sb;
  std::thread ta([&] { sa = (*pool)->Push(*desc, remote_a, local_kv.regions, local_a, deadline); });
  std::thread tb([&] { sb = (*pool)->Push(*desc, remote_b, local_kv.regions, local_b, deadline); });
  ta.join();
  tb.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(inside.load(), 2);
  EXPECT_EQ(gave_up.load(), 0);  // both pushes were in their transfers at the same time
  for (int r = 0; r < kNumRegions; ++r) {
    for (int b = 0; b < kNumBlocks; ++b) {
      int src = b;
      int seed = 1;  // untouched: the peer's own
      if (b >= 20 && b < 27) {
        src = b - 20;
        seed = 2;
      } else if (b >= 40 && b < 45) {
        src = b - 30;
        seed = 2;
      }
      EXPECT_TRUE(peer_kv.BlockHolds(r, b, seed, src)) << r << " " << b;
    }
  }
  const StagedTransferStats stats = (*pool)->stats();
  EXPECT_EQ(stats.bytes_pushed, 12 * kBlockBytes * kNumRegions);
  // Each member moved one of them: 4 and 3 slot fills per region.
  EXPECT_EQ((*pool)->member(0)->stats().num_chunks + (*pool)->member(1)->stats().num_chunks,
            (4 + 3) * kNumRegions);
  EXPECT_GT((*pool)->member(0)->stats().bytes_pushed, 0);
  EXPECT_GT((*pool)->member(1)->stats().bytes_pushed, 0);
}

}  // namespace
}  // namespace sluice::transfer
