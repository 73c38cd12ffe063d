// WorkerRegistry: leases, drain, re-registration and the load-aware worker
// choice.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "services/router/heartbeat_lease.h"
#include "services/router/worker_registry.h"

namespace sluice {
namespace {

class RouterRegistryTest : public ::testing::Test {
 protected:
  RouterRegistryTest()
      : registry_(WorkerRegistryOptions{absl::Seconds(6), 4.0}, [this] { return now_; }) {}

  static WorkerLoad Load(int64_t waiting, int64_t running, int64_t free_blocks,
                         int64_t total_blocks = 100, int64_t block_size = 16) {
    return WorkerLoad{waiting, running, free_blocks, total_blocks, block_size};
  }
  std::string Add(WorkerRole role, const std::string& address, const WorkerLoad& load) {
    auto registration = registry_.Register(role, address, load);
    EXPECT_TRUE(registration.ok()) << registration.status();
    return registration.ok() ? registration->worker_id : "";
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  WorkerRegistry registry_;
};

TEST_F(RouterRegistryTest, RegisterAssignsIdsAndLease) {
  auto a = registry_.Register(WorkerRole::kPrefill, "127.0.0.1:7101", Load(0, 0, 100));
  auto b = registry_.Register(WorkerRole::kDecode, "127.0.0.1:7201", Load(0, 0, 100));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->worker_id, "prefill-1");
  EXPECT_EQ(b->worker_id, "decode-2");
  EXPECT_EQ(a->lease, absl::Seconds(6));
  EXPECT_EQ(registry_.CountLive(WorkerRole::kPrefill), 1);
  EXPECT_EQ(registry_.CountLive(WorkerRole::kDecode), 1);
  EXPECT_EQ(registry_.Register(WorkerRole::kDecode, "", Load(0, 0, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A lapsed lease makes a worker suspect (not picked, still registered, the lease-lapsed
// callback runs once); its next heartbeat clears that; only silence past the grace removes it.
TEST_F(RouterRegistryTest, CapabilitiesAreKeptAndCounted) {
  auto old = registry_.Register(WorkerRole::kDecode, "127.0.0.1:7201", Load(0, 0, 100));
  auto capable = registry_.Register(WorkerRole::kDecode, "127.0.0.1:7202", Load(0, 0, 100),
                                    {kGrammarCapability});
  ASSERT_TRUE(old.ok() && capable.ok());
  EXPECT_EQ(registry_.CountLive(WorkerRole::kDecode), 2);
  EXPECT_EQ(registry_.CountLiveWith(WorkerRole::kDecode, kGrammarCapability), 1);
  EXPECT_EQ(registry_.CountLiveWith(WorkerRole::kPrefill, kGrammarCapability), 0);
  EXPECT_FALSE(registry_.Get(old->worker_id)->Has(kGrammarCapability));
  EXPECT_TRUE(registry_.Get(capable->worker_id)->Has(kGrammarCapability));
  ASSERT_TRUE(registry_.Drain(capable->worker_id).ok());
  EXPECT_EQ(registry_.CountLiveWith(WorkerRole::kDecode, kGrammarCapability), 0);
}

TEST_F(RouterRegistryTest, MissedLeaseMakesWorkerSuspectAndOnlyGraceRemovesIt) {
  const std::string kept = Add(WorkerRole::kDecode, "127.0.0.1:1", Load(0, 0, 100));
  const std::string lost = Add(WorkerRole::kDecode, "127.0.0.1:2", Load(0, 0, 100));
  std::vector<std::string> removed_ids;
  std::vector<std::string> lapsed_ids;
  registry_.OnRemoved([&](const WorkerSnapshot& worker, const absl::Status& why) {
    removed_ids.push_back(worker.worker_id);
    EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable);
  });
  registry_.OnLeaseLapsed([&](const WorkerSnapshot& worker) {
    lapsed_ids.push_back(worker.worker_id);
    EXPECT_TRUE(worker.suspect);
  });
  now_ += absl::Seconds(4);
  ASSERT_TRUE(registry_.Heartbeat(kept, Load(1, 2, 50)).ok());
  EXPECT_TRUE(registry_.ExpireLeases().empty());  // 4 s < 6 s lease
  EXPECT_TRUE(lapsed_ids.empty());
  now_ += absl::Seconds(3);  // lost: 7 s silent; kept: 3 s
  EXPECT_TRUE(registry_.ExpireLeases().empty());
  EXPECT_TRUE(registry_.ExpireLeases().empty());  // the callback runs once per lapse
  EXPECT_EQ(lapsed_ids, std::vector<std::string>{lost});
  EXPECT_TRUE(removed_ids.empty());
  ASSERT_TRUE(registry_.Get(lost).has_value());
  EXPECT_TRUE(registry_.Get(lost)->suspect);
  EXPECT_FALSE(registry_.Get(kept)->suspect);
  // Suspect: no new work, but its assignments stay and it still counts as registered.
  for (int i = 0; i < 3; ++i) {
    auto picked = registry_.Pick(WorkerRole::kDecode, 10);
    ASSERT_TRUE(picked.has_value());
    EXPECT_EQ(picked->worker_id, kept);
  }
  EXPECT_EQ(registry_.CountLive(WorkerRole::kDecode), 2);
  // Its heartbeat (the stall ended) clears the suspicion; it keeps its id.
  ASSERT_TRUE(registry_.Heartbeat(lost, Load(0, 0, 100)).ok());
  EXPECT_FALSE(registry_.Get(lost)->suspect);
  // Silent past lease + grace (60 s): removed.
  now_ += absl::Seconds(6 + 61);
  ASSERT_TRUE(registry_.Heartbeat(kept, Load(1, 2, 50)).ok());
  EXPECT_EQ(registry_.ExpireLeases(), std::vector<std::string>{lost});
  EXPECT_EQ(lapsed_ids, std::vector<std::string>{lost});  // removed at once, not re-suspected
  EXPECT_EQ(removed_ids, std::vector<std::string>{lost});
  EXPECT_FALSE(registry_.Get(lost).has_value());
  EXPECT_EQ(registry_.Get(kept)->load.num_running_requests, 2);
  // A heartbeat after removal asks the worker to register again.
  EXPECT_EQ(registry_.Heartbeat(lost, Load(0, 0, 100)).code(), absl::StatusCode::kNotFound);
}

TEST_F(RouterRegistryTest, ExpiredWorkerIsNotPickedBeforeTheSweep) {
  Add(WorkerRole::kDecode, "127.0.0.1:1", Load(0, 0, 100));
  now_ += absl::Seconds(7);
  EXPECT_FALSE(registry_.Pick(WorkerRole::kDecode, 10).has_value());
}

TEST_F(RouterRegistryTest, SameAddressReplacesTheOldEntry) {
  const std::string old_id = Add(WorkerRole::kDecode, "127.0.0.1:7201", Load(0, 0, 100));
  ASSERT_TRUE(registry_.Pick(WorkerRole::kDecode, 1).has_value());
  std::vector<std::string> removed_ids;
  registry_.OnRemoved([&](const WorkerSnapshot& worker, const absl::Status&) {
    removed_ids.push_back(worker.worker_id);
  });
  const std::string new_id = Add(WorkerRole::kDecode, "127.0.0.1:7201", Load(0, 0, 100));
  EXPECT_NE(new_id, old_id);
  EXPECT_EQ(removed_ids, std::vector<std::string>{old_id});
  ASSERT_EQ(registry_.List().size(), 1u);
  EXPECT_EQ(registry_.List()[0].num_assigned, 0);
}

TEST_F(RouterRegistryTest, DrainStopsNewWorkOnly) {
  const std::string a = Add(WorkerRole::kDecode, "127.0.0.1:1", Load(0, 0, 100));
  const std::string b = Add(WorkerRole::kDecode, "127.0.0.1:2", Load(5, 5, 100));
  auto first = registry_.Pick(WorkerRole::kDecode, 1);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->worker_id, a);
  ASSERT_TRUE(registry_.Drain(a).ok());
  EXPECT_EQ(registry_.CountLive(WorkerRole::kDecode), 1);
  auto second = registry_.Pick(WorkerRole::kDecode, 1);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->worker_id, b);  // busier, but a is draining
  // The draining worker keeps its in-flight assignment until released.
  EXPECT_EQ(registry_.Get(a)->num_assigned, 1);
  registry_.Release(a);
  EXPECT_EQ(registry_.Get(a)->num_assigned, 0);
  EXPECT_EQ(registry_.Drain("nope").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry_.Drain(b).ok());
  EXPECT_FALSE(registry_.Pick(WorkerRole::kDecode, 1).has_value());
}

TEST_F(RouterRegistryTest, PickPrefersLeastLoadedAndSpreadsAssignments) {
  const std::string idle = Add(WorkerRole::kPrefill, "127.0.0.1:1", Load(0, 0, 100));
  const std::string busy = Add(WorkerRole::kPrefill, "127.0.0.1:2", Load(3, 4, 100));
  Add(WorkerRole::kDecode, "127.0.0.1:3", Load(0, 0, 100));  // other role: never picked
  // idle scores max(n, 0), busy max(n, 7): the first 7 picks all go to idle
  // (ties broken by fewer picks: at 7 assigned each side scores 7 and busy has
  // been picked less).
  for (int i = 0; i < 7; ++i) {
    auto pick = registry_.Pick(WorkerRole::kPrefill, 16);
    ASSERT_TRUE(pick.has_value());
    EXPECT_EQ(pick->worker_id, idle) << i;
  }
  auto eighth = registry_.Pick(WorkerRole::kPrefill, 16);
  ASSERT_TRUE(eighth.has_value());
  EXPECT_EQ(eighth->worker_id, busy);
  // Excluding a worker (a retry after it failed) picks the other.
  auto retry = registry_.Pick(WorkerRole::kPrefill, 16, {busy});
  ASSERT_TRUE(retry.has_value());
  EXPECT_EQ(retry->worker_id, idle);
}

TEST_F(RouterRegistryTest, KvPressureAndCapacityShapeTheChoice) {
  // Same queue, different KV usage: 90% used scores 0 + 4 * 0.9 = 3.6 vs 0.4.
  const std::string full = Add(WorkerRole::kDecode, "127.0.0.1:1", Load(0, 0, 10));
  const std::string roomy = Add(WorkerRole::kDecode, "127.0.0.1:2", Load(0, 0, 90));
  EXPECT_EQ(registry_.Pick(WorkerRole::kDecode, 16)->worker_id, roomy);
  registry_.Release(roomy);
  // A request needing more than `full` can hold (10 blocks * 16 = 160 tokens)
  // never goes there while another fits, however busy the other is.
  ASSERT_TRUE(registry_.Heartbeat(roomy, Load(20, 30, 90)).ok());
  EXPECT_EQ(registry_.Pick(WorkerRole::kDecode, 161)->worker_id, roomy);
  registry_.Release(roomy);
  EXPECT_EQ(registry_.Pick(WorkerRole::kDecode, 160)->worker_id, full);
}

TEST_F(RouterRegistryTest, DeregisterRunsTheCallback) {
  const std::string id = Add(WorkerRole::kPrefill, "127.0.0.1:1", Load(0, 0, 100));
  int calls = 0;
  registry_.OnRemoved([&](const WorkerSnapshot& worker, const absl::Status&) {
    ++calls;
    EXPECT_EQ(worker.address, "127.0.0.1:1");
  });
  ASSERT_TRUE(registry_.Deregister(id).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(registry_.Deregister(id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry_.List().empty());
}

// --- Leases tuned from heartbeat jitter ---

// Feeds heartbeats `gaps` seconds apart (the first at t = 0).
HeartbeatLease Fed(const std::vector<double>& gaps, HeartbeatLeaseOptions o = {}) {
  HeartbeatLease lease(o);
  absl::Time t = absl::FromUnixSeconds(1000);
  lease.Observe(t);
  for (double g : gaps) {
    t += absl::Seconds(g);
    lease.Observe(t);
  }
  return lease;
}

TEST(HeartbeatLeaseTest, SteadyHeartbeatsGetTheFloor) {
  // Every 2 s like a clock: mean 2, stddev 0: 2 s < the 6 s floor.
  EXPECT_EQ(Fed(std::vector<double>(20, 2.0)).Lease(), absl::Seconds(6));
  // Too few samples to judge (min_samples 4): the floor, however jittery.
  EXPECT_EQ(Fed({1, 20, 1}).Lease(), absl::Seconds(6));
  EXPECT_EQ(Fed({}).Lease(), absl::Seconds(6));
}

TEST(HeartbeatLeaseTest, JitterEarnsMeanPlusKStddev) {
  std::vector<double> gaps;
  for (int i = 0; i < 16; ++i) gaps.insert(gaps.end(), {1.0, 5.0});
  // 32 gaps of 1 s and 5 s: mean 3, stddev 2: 3 + 4 x 2 = 11 s.
  EXPECT_EQ(Fed(gaps).Lease(), absl::Seconds(11));
  HeartbeatLeaseOptions k2;
  k2.k = 2.0;
  EXPECT_EQ(Fed(gaps, k2).Lease(), absl::Seconds(7));  // 3 + 2 x 2
  // 1 s and 13 s: mean 7, stddev 6: 31 s, capped at 30.
  std::vector<double> wild;
  for (int i = 0; i < 4; ++i) wild.insert(wild.end(), {1.0, 13.0});
  EXPECT_EQ(Fed(wild).Lease(), absl::Seconds(30));
  HeartbeatLeaseOptions fixed;
  fixed.k = 0;  // the fixed lease
  EXPECT_EQ(Fed(wild, fixed).Lease(), absl::Seconds(6));
  HeartbeatLeaseOptions low_cap;
  low_cap.cap = absl::Seconds(2);  // a cap under the floor: the floor
  EXPECT_EQ(Fed(wild, low_cap).Lease(), absl::Seconds(6));
}

TEST(HeartbeatLeaseTest, OnlyTheLastWindowCounts) {
  HeartbeatLeaseOptions o;
  o.window = 8;
  o.floor = absl::Seconds(1);
  std::vector<double> gaps;
  for (int i = 0; i < 4; ++i) gaps.insert(gaps.end(), {1.0, 5.0});
  EXPECT_EQ(Fed(gaps, o).Lease(), absl::Seconds(11));
  // Eight steady 0.5 s gaps push the jittery ones out: mean 0.5, stddev 0: the 1 s floor.
  gaps.insert(gaps.end(), 7, 0.5);
  EXPECT_GT(Fed(gaps, o).Lease(), absl::Seconds(1));  // one 5 s gap is still in the window
  gaps.push_back(0.5);
  EXPECT_EQ(Fed(gaps, o).Lease(), absl::Seconds(1));
}

// In the registry: a worker whose heartbeats arrive irregularly keeps its lease through a
// silence that makes a steady one suspect; each snapshot shows the lease granted.
TEST_F(RouterRegistryTest, EachWorkerGetsALeaseFromItsHeartbeatJitter) {
  const absl::Time t0 = now_;
  const std::string steady = Add(WorkerRole::kDecode, "127.0.0.1:1", Load(0, 0, 100));
  const std::string jittery = Add(WorkerRole::kDecode, "127.0.0.1:2", Load(0, 0, 100));
  EXPECT_EQ(registry_.Get(steady)->lease, absl::Seconds(6));
  // steady: every 2 s up to 24 s; jittery: gaps of 1 s and 5 s (at 1, 6, 7, 12, ..., 24 s).
  std::vector<std::pair<double, std::string>> beats;
  for (int t = 2; t <= 24; t += 2) beats.push_back({t, steady});
  for (double t : {1, 6, 7, 12, 13, 18, 19, 24}) beats.push_back({t, jittery});
  std::sort(beats.begin(), beats.end());
  for (const auto& [t, id] : beats) {
    now_ = t0 + absl::Seconds(t);
    ASSERT_TRUE(registry_.Heartbeat(id, Load(0, 0, 100)).ok());
    EXPECT_TRUE(registry_.ExpireLeases().empty());
  }
  EXPECT_EQ(registry_.Get(steady)->lease, absl::Seconds(6));    // mean 2, stddev 0: the floor
  EXPECT_EQ(registry_.Get(jittery)->lease, absl::Seconds(11));  // mean 3, stddev 2
  std::vector<std::string> lapsed;
  registry_.OnLeaseLapsed([&](const WorkerSnapshot& w) { lapsed.push_back(w.worker_id); });
  now_ = t0 + absl::Seconds(24 + 7);  // both silent for 7 s
  registry_.ExpireLeases();
  EXPECT_EQ(lapsed, std::vector<std::string>{steady});
  EXPECT_EQ(registry_.Pick(WorkerRole::kDecode, 10)->worker_id, jittery);
  now_ = t0 + absl::Seconds(24 + 11.5);
  registry_.ExpireLeases();
  EXPECT_EQ(lapsed, (std::vector<std::string>{steady, jittery}));
  EXPECT_FALSE(registry_.Pick(WorkerRole::kDecode, 10).has_value());
}

// The KV settings of a worker of the test model (the CPU engine's float32 cache).
KvPeerConfig Peer(const std::string& mode, int64_t swa_replay_tokens = 0,
                  int64_t block_size = 16) {
  KvPeerConfig c;
  c.transfer_mode = mode;
  c.swa_replay_tokens = swa_replay_tokens;
  c.block_size = block_size;
  c.num_layers = 4;
  c.values_per_token = 256;
  c.dtype_bytes = 4;
  return c;
}

// A prefill or decode worker whose KV settings differ from a registered one's is refused with
// FAILED_PRECONDITION naming both values and both workers, and is not added; one that agrees
// joins.
TEST_F(RouterRegistryTest, WorkerWhoseKvSettingsDifferFromThePoolIsRefused) {
  ASSERT_TRUE(registry_.Register(WorkerRole::kPrefill, "127.0.0.1:7101", Load(0, 0, 100), {},
                                 false, Peer("push")).ok());
  auto mode = registry_.Register(WorkerRole::kDecode, "127.0.0.1:7201", Load(0, 0, 100), {},
                                 false, Peer("pull"));
  ASSERT_EQ(mode.status().code(), absl::StatusCode::kFailedPrecondition);
  // The mismatch alone: the worker's log line wraps it in "the router at ... refused this
  // decode worker: ..." (a refusal said once).
  EXPECT_EQ(mode.status().message(),
            "KV transfer mode mismatch: decode worker 127.0.0.1:7201 runs --kv-transfer-mode "
            "pull but the registered prefill worker prefill-1 (127.0.0.1:7101) runs "
            "--kv-transfer-mode push; start every prefill and decode worker with the same "
            "--kv-transfer-mode");
  auto replay = registry_.Register(WorkerRole::kDecode, "127.0.0.1:7202", Load(0, 0, 100), {},
                                   false, Peer("push", 128));
  ASSERT_EQ(replay.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(replay.status().message().find(
                "SWA replay mismatch: decode worker 127.0.0.1:7202 runs --swa-replay-tokens 128 "
                "(moves only full-attention layers) but the registered prefill worker prefill-1 "
                "(127.0.0.1:7101) runs --swa-replay-tokens 0 (moves every layer)"),
            absl::string_view::npos)
      << replay.status();
  auto layout = registry_.Register(WorkerRole::kDecode, "127.0.0.1:7203", Load(0, 0, 100), {},
                                   false, Peer("push", 0, 32));
  ASSERT_EQ(layout.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(layout.status().message().find(
                "KV layout mismatch: decode worker 127.0.0.1:7203 has block_size 32, 4 layers, "
                "256 values/token of 4 bytes but the registered prefill worker prefill-1 "
                "(127.0.0.1:7101) has block_size 16"),
            absl::string_view::npos)
      << layout.status();
  EXPECT_EQ(registry_.CountLive(WorkerRole::kDecode), 0);
  EXPECT_FALSE(registry_.Pick(WorkerRole::kDecode, 1).has_value());
  // Replay counts may differ while both replay (each receiver replays its own).
  ASSERT_TRUE(registry_.Register(WorkerRole::kDecode, "127.0.0.1:7204", Load(0, 0, 100), {},
                                 false, Peer("push")).ok());
  EXPECT_EQ(registry_.CountLive(WorkerRole::kDecode), 1);
}

TEST_F(RouterRegistryTest, ReplayCountsMayDifferWhileBothReplay) {
  ASSERT_TRUE(registry_.Register(WorkerRole::kPrefill, "127.0.0.1:7101", Load(0, 0, 100), {},
                                 false, Peer("pull", 64)).ok());
  EXPECT_TRUE(registry_.Register(WorkerRole::kDecode, "127.0.0.1:7201", Load(0, 0, 100), {},
                                 false, Peer("pull", 128)).ok());
}

// Not compared: workers without reported settings (from before the check), draining workers
// (they take no new requests: a rolling restart may change the pool's settings), encoders;
// nor the entry a restart at the same address replaces.
TEST_F(RouterRegistryTest, KvSettingsAreComparedOnlyWithLiveReportingKvWorkers) {
  const std::string legacy = Add(WorkerRole::kPrefill, "127.0.0.1:7101", Load(0, 0, 100));
  EXPECT_TRUE(registry_.Register(WorkerRole::kEncoder, "127.0.0.1:7301", Load(0, 0, 0)).ok());
  auto pull = registry_.Register(WorkerRole::kPrefill, "127.0.0.1:7102", Load(0, 0, 100), {},
                                 false, Peer("pull"));
  ASSERT_TRUE(pull.ok()) << pull.status();
  ASSERT_TRUE(registry_.Drain(pull->worker_id).ok());
  auto push = registry_.Register(WorkerRole::kDecode, "127.0.0.1:7201", Load(0, 0, 100), {},
                                 false, Peer("push"));
  ASSERT_TRUE(push.ok()) << push.status();
  // The only reporting live worker restarts with other settings: its old entry is gone.
  auto restarted = registry_.Register(WorkerRole::kDecode, "127.0.0.1:7201", Load(0, 0, 100),
                                      {}, false, Peer("layerwise"));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(registry_.Get(restarted->worker_id)->kv_peer->transfer_mode, "layerwise");
  EXPECT_FALSE(registry_.Get(legacy)->kv_peer.has_value());
  // A refused restart still removes the entry of the process it replaces.
  ASSERT_TRUE(registry_.Register(WorkerRole::kPrefill, "127.0.0.1:7103", Load(0, 0, 100), {},
                                 false, Peer("layerwise")).ok());
  auto refused = registry_.Register(WorkerRole::kDecode, "127.0.0.1:7201", Load(0, 0, 100), {},
                                    false, Peer("pull"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(registry_.Get(restarted->worker_id).has_value());
}

}  // namespace
}  // namespace sluice
