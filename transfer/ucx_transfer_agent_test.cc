#include "transfer/ucx_transfer_agent.h"

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "transfer/block_runs.h"
#include "transfer/kv_transfer.h"

namespace sluice::transfer {
namespace {

constexpr int kNumRegions = 3;  // e.g. k(0), v(0), k(1) of a KV cache
constexpr int kNumBlocks = 64;
constexpr int kBlockBytes = 2048;

// A KV-cache-shaped set of buffers: kNumRegions arrays of [kNumBlocks,
// kBlockBytes] bytes, registered with one agent.
struct KvBuffers {
  std::vector<std::vector<uint8_t>> data;
  std::vector<KvRegion> regions;

  // Fills byte o of block b of region r with a value unique to (seed, r, b, o)
  // mod 251.
  explicit KvBuffers(int seed) : data(kNumRegions, std::vector<uint8_t>(kNumBlocks * kBlockBytes)) {
    for (int r = 0; r < kNumRegions; ++r) {
      for (int b = 0; b < kNumBlocks; ++b) {
        for (int o = 0; o < kBlockBytes; ++o) data[r][b * kBlockBytes + o] = Pattern(seed, r, b, o);
      }
      regions.push_back({data[r].data(), kNumBlocks, kBlockBytes});
    }
  }
  static uint8_t Pattern(int seed, int r, int b, int o) {
    return static_cast<uint8_t>((seed * 7919 + r * 104729 + b * 131 + o * 7) % 251);
  }
  void Register(KvTransferAgent& agent) {
    for (const KvRegion& r : regions) {
      auto handle = agent.RegisterRegion(r.base, r.num_blocks * r.block_bytes);
      ASSERT_TRUE(handle.ok()) << handle.status();
      EXPECT_FALSE(handle->rkey.empty());
    }
  }
  // True iff block `b` of every region holds the pattern of block `src_block`
  // of `seed`.
  bool BlockHolds(int b, int seed, int src_block) const {
    for (int r = 0; r < kNumRegions; ++r) {
      for (int o = 0; o < kBlockBytes; ++o) {
        if (data[r][b * kBlockBytes + o] != Pattern(seed, r, src_block, o)) return false;
      }
    }
    return true;
  }
};

std::unique_ptr<KvTransferAgent> MakeAgent(const std::string& transports,
                                           bool progress_thread = true) {
  KvTransferOptions options;
  options.transports = transports;
  options.progress_thread = progress_thread;
  // Debian's UCX 1.13 posix/sysv have no peer failure handler (see
  // KvTransferOptions).
  options.peer_failure_detection = transports != "sm";
  auto agent = KvTransferAgent::Create(options);
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? std::move(*agent) : nullptr;
}

class KvTransferAgentTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KvTransferAgentTest, PullsScatteredBlocksExactly) {
  auto remote_agent = MakeAgent(GetParam());
  auto local_agent = MakeAgent(GetParam());
  ASSERT_NE(remote_agent, nullptr);
  ASSERT_NE(local_agent, nullptr);
  KvBuffers remote(/*seed=*/1), local(/*seed=*/2);
  remote.Register(*remote_agent);
  local.Register(*local_agent);
  auto desc = remote_agent->Describe(remote.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto parsed = RemoteKvDescriptor::Parse(desc->Serialize());  // as it crosses gRPC
  ASSERT_TRUE(parsed.ok()) << parsed.status();

  const std::vector<int32_t> src = {5, 6, 7, 20, 21, 40};
  const std::vector<int32_t> dst = {10, 11, 12, 13, 50, 51};
  absl::Status s = local_agent->Pull(*parsed, CoalesceBlocks(src), local.regions,
                                     CoalesceBlocks(dst), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s;
  for (int b = 0; b < kNumBlocks; ++b) {
    auto it = std::find(dst.begin(), dst.end(), b);
    const int expected_seed = it == dst.end() ? 2 : 1;
    const int expected_block = it == dst.end() ? b : src[it - dst.begin()];
    EXPECT_TRUE(local.BlockHolds(b, expected_seed, expected_block)) << "local block " << b;
    EXPECT_TRUE(remote.BlockHolds(b, 1, b)) << "remote block " << b;
  }
  const KvTransferStats stats = local_agent->stats();
  EXPECT_EQ(stats.bytes_pulled, 6 * kBlockBytes * kNumRegions);
  // Runs {5,3},{20,2},{40,1} against {10,4},{50,2}: pairs (5->10,3) (20->13,1)
  // (21->50,1) (40->51,1): 4 operations per region, not 6.
  EXPECT_EQ(stats.num_rma_ops, 4 * kNumRegions);
  EXPECT_EQ(stats.num_transfers_ok, 1);
  EXPECT_EQ(stats.num_endpoints, 1);

  // The cached endpoint is reused for a second pull.
  const std::vector<int32_t> src2 = {63};
  const std::vector<int32_t> dst2 = {0};
  s = local_agent->Pull(*parsed, CoalesceBlocks(src2), local.regions, CoalesceBlocks(dst2),
                        absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(local.BlockHolds(0, 1, 63));
  EXPECT_EQ(local_agent->stats().num_endpoints, 1);
}

TEST_P(KvTransferAgentTest, PushesScatteredBlocksExactly) {
  auto remote_agent = MakeAgent(GetParam());
  auto local_agent = MakeAgent(GetParam());
  ASSERT_NE(remote_agent, nullptr);
  ASSERT_NE(local_agent, nullptr);
  KvBuffers remote(/*seed=*/3), local(/*seed=*/4);
  remote.Register(*remote_agent);
  local.Register(*local_agent);
  auto desc = remote_agent->Describe(remote.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();

  const std::vector<int32_t> src = {0, 1, 2, 3, 33, 62, 63};   // local blocks
  const std::vector<int32_t> dst = {5, 6, 7, 20, 21, 40, 41};  // remote blocks
  absl::Status s = local_agent->Push(*desc, CoalesceBlocks(dst), local.regions, CoalesceBlocks(src),
                                     absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s;
  // Push returns only once the bytes are at the target: check without further
  // progress.
  for (int b = 0; b < kNumBlocks; ++b) {
    auto it = std::find(dst.begin(), dst.end(), b);
    const int expected_seed = it == dst.end() ? 3 : 4;
    const int expected_block = it == dst.end() ? b : src[it - dst.begin()];
    EXPECT_TRUE(remote.BlockHolds(b, expected_seed, expected_block)) << "remote block " << b;
    EXPECT_TRUE(local.BlockHolds(b, 4, b)) << "local block " << b;
  }
  EXPECT_EQ(local_agent->stats().bytes_pushed, 7 * kBlockBytes * kNumRegions);
}

TEST_P(KvTransferAgentTest, LayerByLayerPushWithSelectedRegions) {
  auto remote_agent = MakeAgent(GetParam());
  auto local_agent = MakeAgent(GetParam());
  ASSERT_NE(remote_agent, nullptr);
  ASSERT_NE(local_agent, nullptr);
  KvBuffers remote(/*seed=*/5), local(/*seed=*/6);
  remote.Register(*remote_agent);
  local.Register(*local_agent);
  auto desc = remote_agent->Describe(remote.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto layer1 = desc->SelectRegions(1, 1);
  ASSERT_TRUE(layer1.ok()) << layer1.status();
  const std::vector<BlockRun> runs = {{8, 2}};
  absl::Status s =
      local_agent->Push(*layer1, runs, absl::MakeConstSpan(local.regions).subspan(1, 1), runs,
                        absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s;
  for (int o = 0; o < kBlockBytes; ++o) {
    ASSERT_EQ(remote.data[1][8 * kBlockBytes + o], KvBuffers::Pattern(6, 1, 8, o));
    ASSERT_EQ(remote.data[0][8 * kBlockBytes + o], KvBuffers::Pattern(5, 0, 8, o));
    ASSERT_EQ(remote.data[2][9 * kBlockBytes + o], KvBuffers::Pattern(5, 2, 9, o));
  }
  EXPECT_EQ(desc->SelectRegions(2, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(KvTransferAgentTest, RejectsBadRequestsWithoutTouchingMemory) {
  auto remote_agent = MakeAgent(GetParam());
  auto local_agent = MakeAgent(GetParam());
  ASSERT_NE(remote_agent, nullptr);
  ASSERT_NE(local_agent, nullptr);
  KvBuffers remote(/*seed=*/7), local(/*seed=*/8);
  remote.Register(*remote_agent);
  local.Register(*local_agent);
  auto desc = remote_agent->Describe(remote.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  const std::vector<BlockRun> ok_runs = {{1, 2}};

  // Region count mismatch.
  EXPECT_EQ(
      local_agent
          ->Pull(*desc, ok_runs, absl::MakeConstSpan(local.regions).first(2), ok_runs, deadline)
          .code(),
      absl::StatusCode::kInvalidArgument);
  // Runs past the end of the remote region.
  const std::vector<BlockRun> past_end = {{63, 2}};
  EXPECT_EQ(local_agent->Pull(*desc, past_end, local.regions, ok_runs, deadline).code(),
            absl::StatusCode::kInvalidArgument);
  // Different block totals.
  const std::vector<BlockRun> three = {{1, 3}};
  EXPECT_EQ(local_agent->Pull(*desc, three, local.regions, ok_runs, deadline).code(),
            absl::StatusCode::kInvalidArgument);
  // block_bytes mismatch.
  RemoteKvDescriptor wrong_geometry = *desc;
  wrong_geometry.regions[1].block_bytes = 1024;
  EXPECT_EQ(local_agent->Pull(wrong_geometry, ok_runs, local.regions, ok_runs, deadline).code(),
            absl::StatusCode::kInvalidArgument);
  // Local memory that is not registered.
  KvBuffers unregistered(/*seed=*/9);
  EXPECT_EQ(local_agent->Pull(*desc, ok_runs, unregistered.regions, ok_runs, deadline).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(local_agent->Describe(unregistered.regions).status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (int b = 0; b < kNumBlocks; ++b) ASSERT_TRUE(local.BlockHolds(b, 8, b));
  for (int b = 0; b < kNumBlocks; ++b) ASSERT_TRUE(unregistered.BlockHolds(b, 9, b));
  EXPECT_EQ(local_agent->stats().num_rma_ops, 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, KvTransferAgentTest, ::testing::Values("sm", "tcp"),
                         [](const auto& info) { return info.param; });

TEST(KvTransferAgentFailureTest, PeerGoneIsAnErrorWithinTheDeadline) {
  auto remote_agent = MakeAgent("tcp");
  auto local_agent = MakeAgent("tcp");
  ASSERT_NE(remote_agent, nullptr);
  ASSERT_NE(local_agent, nullptr);
  KvBuffers remote(/*seed=*/1), local(/*seed=*/2);
  remote.Register(*remote_agent);
  local.Register(*local_agent);
  auto desc = remote_agent->Describe(remote.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();
  const std::vector<BlockRun> runs = {{3, 4}};
  ASSERT_TRUE(
      local_agent->Pull(*desc, runs, local.regions, runs, absl::Now() + absl::Seconds(10)).ok());

  remote_agent.reset();  // the peer goes away (its buffers stay mapped in this process)
  const absl::Time start = absl::Now();
  absl::Status s = local_agent->Pull(*desc, runs, local.regions, runs, start + absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  EXPECT_LT(took, absl::Seconds(4)) << "deadline 2 s plus close_timeout 1 s";
  EXPECT_EQ(local_agent->stats().num_transfers_failed, 1);
  EXPECT_EQ(local_agent->stats().num_endpoints, 0) << "a failed peer's endpoint is dropped";
}

TEST(KvTransferAgentFailureTest, StuckPeerGivesDeadlineExceededAndAgentStaysUsable) {
  // Over tcp, RMA is emulated with active messages: a target that never
  // progresses never answers, like a hung process.
  auto stuck_agent = MakeAgent("tcp", /*progress_thread=*/false);
  auto live_agent = MakeAgent("tcp");
  auto local_agent = MakeAgent("tcp");
  ASSERT_NE(stuck_agent, nullptr);
  ASSERT_NE(live_agent, nullptr);
  ASSERT_NE(local_agent, nullptr);
  KvBuffers stuck(/*seed=*/1), live(/*seed=*/3), local(/*seed=*/2);
  stuck.Register(*stuck_agent);
  live.Register(*live_agent);
  local.Register(*local_agent);
  auto stuck_desc = stuck_agent->Describe(stuck.regions);
  auto live_desc = live_agent->Describe(live.regions);
  ASSERT_TRUE(stuck_desc.ok() && live_desc.ok());
  const std::vector<BlockRun> runs = {{10, 2}};

  const absl::Time start = absl::Now();
  absl::Status s =
      local_agent->Pull(*stuck_desc, runs, local.regions, runs, start + absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(2));

  s = local_agent->Pull(*live_desc, runs, local.regions, runs, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(local.BlockHolds(10, 3, 10));
  EXPECT_TRUE(local.BlockHolds(11, 3, 11));
}

// Remote keys are unpacked once per distinct packed key of a peer and reused (registrations of
// plain user memory may pack to identical bytes: then one unpacked key serves them all); a
// re-registered region is reached through its new key; dropping the peer releases them.
TEST_P(KvTransferAgentTest, CachesRemoteKeysPerPeerRegistration) {
  auto remote_agent = MakeAgent(GetParam());
  auto local_agent = MakeAgent(GetParam());
  ASSERT_NE(remote_agent, nullptr);
  ASSERT_NE(local_agent, nullptr);
  KvBuffers remote(/*seed=*/7), local(/*seed=*/8);
  remote.Register(*remote_agent);
  local.Register(*local_agent);
  auto desc = remote_agent->Describe(remote.regions);
  ASSERT_TRUE(desc.ok()) << desc.status();
  auto distinct_keys = [](std::initializer_list<const RemoteKvDescriptor*> descs) {
    std::set<std::string> keys;
    for (const RemoteKvDescriptor* d : descs) {
      for (const RemoteRegion& r : d->regions) keys.insert(r.rkey);
    }
    return static_cast<int64_t>(keys.size());
  };
  for (int i = 0; i < 3; ++i) {
    const std::vector<BlockRun> src = {{i, 1}}, dst = {{10 + i, 1}};
    ASSERT_TRUE(local_agent->Pull(*desc, src, local.regions, dst, absl::Now() + absl::Seconds(10))
                    .ok());
    EXPECT_TRUE(local.BlockHolds(10 + i, 7, i));
  }
  EXPECT_EQ(local_agent->stats().num_cached_rkeys, distinct_keys({&*desc}));
  EXPECT_GE(local_agent->stats().num_cached_rkeys, 1);

  // The peer moves region 0 to a new registration.
  std::vector<uint8_t> moved(kNumBlocks * kBlockBytes);
  for (int b = 0; b < kNumBlocks; ++b) {
    for (int o = 0; o < kBlockBytes; ++o) {
      moved[b * kBlockBytes + o] = KvBuffers::Pattern(9, 0, b, o);
    }
  }
  ASSERT_TRUE(remote_agent->RegisterRegion(moved.data(), moved.size()).ok());
  std::vector<KvRegion> regions = remote.regions;
  regions[0].base = moved.data();
  auto desc2 = remote_agent->Describe(regions);
  ASSERT_TRUE(desc2.ok()) << desc2.status();
  const std::vector<BlockRun> src = {{30, 1}}, dst = {{40, 1}};
  ASSERT_TRUE(
      local_agent->Pull(*desc2, src, local.regions, dst, absl::Now() + absl::Seconds(10)).ok());
  for (int o = 0; o < kBlockBytes; ++o) {
    ASSERT_EQ(local.data[0][40 * kBlockBytes + o], KvBuffers::Pattern(9, 0, 30, o));
    ASSERT_EQ(local.data[1][40 * kBlockBytes + o], KvBuffers::Pattern(7, 1, 30, o));
  }
  EXPECT_EQ(local_agent->stats().num_cached_rkeys, distinct_keys({&*desc, &*desc2}));

  local_agent->DropPeer(desc->worker_address);
  EXPECT_EQ(local_agent->stats().num_cached_rkeys, 0);
  EXPECT_EQ(local_agent->stats().num_endpoints, 0);
  // And a new endpoint unpacks again.
  ASSERT_TRUE(
      local_agent->Pull(*desc, src, local.regions, dst, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(local.BlockHolds(40, 7, 30));
  EXPECT_EQ(local_agent->stats().num_cached_rkeys, distinct_keys({&*desc}));
}

// Device memory: registered only where the linked UCX is CUDA-aware and found a device; else a
// clear FailedPrecondition (never a host registration of a device pointer).
TEST(KvTransferAgentTest, DeviceMemoryNeedsACudaAwareUcxWithADevice) {
  auto agent = MakeAgent("tcp");
  ASSERT_NE(agent, nullptr);
  EXPECT_TRUE(agent->SupportsMemoryType(MemoryType::kHost));
  if (agent->SupportsMemoryType(MemoryType::kCuda)) {
    GTEST_SKIP() << "a CUDA device is visible: the GPU scripts cover device registration";
  }
  std::vector<uint8_t> buf(4096);
  auto handle = agent->RegisterRegion(buf.data(), buf.size(), MemoryType::kCuda);
  ASSERT_EQ(handle.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(handle.status().message().find("cannot register cuda memory"), std::string::npos)
      << handle.status();
  EXPECT_NE(handle.status().message().find(LinkedUcxIsCudaAware() ? "no CUDA device"
                                                                  : "without CUDA"),
            std::string::npos)
      << handle.status();
  EXPECT_STREQ(MemoryTypeName(MemoryType::kCuda), "cuda");
  EXPECT_TRUE(agent->RegisterRegion(buf.data(), buf.size(), MemoryType::kHost).ok());
}

TEST(KvTransferAgentTest, UnknownTransportIsAnError) {
  KvTransferOptions options;
  options.transports = "no_such_transport";
  auto agent = KvTransferAgent::Create(options);
  EXPECT_FALSE(agent.ok());
}

TEST(KvTransferAgentTest, RegisterAndDeregister) {
  auto agent = MakeAgent("sm");
  ASSERT_NE(agent, nullptr);
  std::vector<uint8_t> buf(4096);
  EXPECT_EQ(agent->RegisterRegion(nullptr, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agent->RegisterRegion(buf.data(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto handle = agent->RegisterRegion(buf.data(), 4096);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_NE(handle->id, 0u);
  const KvRegion region{buf.data(), 2, 2048};
  EXPECT_TRUE(agent->Describe({&region, 1}).ok());
  EXPECT_TRUE(agent->DeregisterRegion(handle->id).ok());
  EXPECT_EQ(agent->DeregisterRegion(handle->id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(agent->Describe({&region, 1}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sluice::transfer
