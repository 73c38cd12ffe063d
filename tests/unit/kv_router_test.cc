// KvRouter over real gRPC: workers' KvEventPublisher serve engine KV event logs, the router polls
// them into its KvIndex (resyncing from a snapshot when a reader fell behind), hashes prompts with
// the identity the workers report, picks by overlap, records its decision, forgets departed
// workers; round-robin and policy-name parsing.
#include "services/router/kv_router.h"

#include <memory>
#include <string>
#include <vector>

#include "engine/kv/block_hash.h"
#include "engine/kv/kv_events.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/common/kv_event_publisher.h"

namespace sluice {
namespace {

constexpr int64_t kBlock = 4;

// FakeWorker: a KV event log served over gRPC on a free loopback port.
struct FakeWorker {
  explicit FakeWorker(const std::string& identity, size_t capacity = 64)
      : log(capacity),
        publisher([this](uint64_t after, size_t max) { return log.Read(after, max); },
                  [this] { return log.Snapshot(); }, identity, kBlock) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&publisher);
    server = builder.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~FakeWorker() { server->Shutdown(); }

  KvEventLog log;
  KvEventPublisher publisher;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

class KvRouterTest : public ::testing::Test {
 protected:
  KvRouterTest() : hasher_(identity_, kBlock) {}

  std::vector<BlockHash> Hashes(const std::vector<int32_t>& tokens) const {
    std::vector<BlockHash> hashes;
    hasher_.ExtendFullBlockHashes(hasher_.RootHash(""), tokens, hashes);
    return hashes;
  }
  std::string Add(const FakeWorker& worker) {
    auto registration = registry_.Register(WorkerRole::kPrefill, worker.address,
                                           WorkerLoad{0, 0, 100, 100, kBlock});
    EXPECT_TRUE(registration.ok()) << registration.status();
    return registration.ok() ? registration->worker_id : "";
  }
  static KvRouterOptions Options(RoutingPolicy policy) {
    KvRouterOptions options;
    options.policy = policy;
    options.start_poller = false;
    return options;
  }

  const std::string identity_ = KvLayoutIdentity("router-test", kBlock, "f32", 2, 8, 8);
  BlockHasher hasher_;
  WorkerRegistry registry_;
  // 14 tokens: three full blocks and a partial one.
  const std::vector<int32_t> prompt_ = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
};

TEST_F(KvRouterTest, PicksTheWorkerHoldingThePrefixAndRecordsIt) {
  FakeWorker a(identity_), b(identity_);
  const std::string id_a = Add(a);
  const std::string id_b = Add(b);
  KvRouter router(&registry_, Options(RoutingPolicy::kKv));
  const std::vector<BlockHash> hashes = Hashes(prompt_);
  ASSERT_EQ(hashes.size(), 3u);
  b.log.Stored(std::nullopt, {hashes[0], hashes[1]});
  router.PollOnce();  // snapshots (both new), then nothing further to read
  EXPECT_EQ(router.counters().num_resyncs, 2);
  EXPECT_EQ(router.index().MatchPrefix(hashes), (std::map<std::string, int64_t>{{id_b, 2}}));

  std::optional<WorkerSnapshot> picked =
      router.Pick(WorkerRole::kPrefill, "r1", prompt_, "", 30, {});
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ(picked->worker_id, id_b);
  EXPECT_EQ(registry_.Get(id_b)->num_assigned, 1);
  KvRouterCounters counters = router.counters();
  EXPECT_EQ(counters.num_picks, 1);
  EXPECT_EQ(counters.num_picks_with_overlap, 1);
  EXPECT_EQ(counters.predicted_cached_tokens, 8);
  // Recorded at once: b now holds all three blocks (the third provisionally).
  EXPECT_EQ(router.index().MatchPrefix(hashes), (std::map<std::string, int64_t>{{id_b, 3}}));
  router.Release(id_b, "r1");
  EXPECT_EQ(registry_.Get(id_b)->num_assigned, 0);
  // Another tenant's salt hashes to other blocks: no overlap anywhere, so the less-picked a.
  picked = router.Pick(WorkerRole::kPrefill, "r2", prompt_, "tenant-2", 30, {});
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ(picked->worker_id, id_a);
  EXPECT_EQ(router.counters().num_picks_with_overlap, 1);
  router.Release(id_a, "r2");

  // Events after the snapshot are applied in order; a's stored event shows up after a poll.
  a.log.Stored(std::nullopt, hashes);
  b.log.Removed({hashes[0]});
  router.PollOnce();
  EXPECT_EQ(router.index().MatchPrefix(hashes), (std::map<std::string, int64_t>{{id_a, 3}}));
  EXPECT_EQ(router.counters().num_resyncs, 2);
  EXPECT_EQ(router.index().WorkerState(id_a).last_seq, 1u);
  EXPECT_EQ(router.index().WorkerState(id_b).last_seq, 2u);
}

TEST_F(KvRouterTest, ReaderThatFellBehindResyncsFromSnapshot) {
  FakeWorker a(identity_, /*capacity=*/2);
  const std::string id_a = Add(a);
  KvRouter router(&registry_, Options(RoutingPolicy::kKv));
  router.PollOnce();
  const std::vector<BlockHash> hashes = Hashes(prompt_);
  // Four events into a buffer of two: events 1 and 2 are dropped before the router reads.
  a.log.Stored(std::nullopt, {hashes[0]});
  a.log.Stored(hashes[0], {hashes[1]});
  a.log.Stored(hashes[1], {hashes[2]});
  a.log.Removed({hashes[2]});
  router.PollOnce();
  EXPECT_EQ(router.counters().num_resyncs, 2);
  const KvIndexWorkerState state = router.index().WorkerState(id_a);
  EXPECT_FALSE(state.needs_resync);
  EXPECT_EQ(state.last_seq, 4u);
  EXPECT_EQ(state.num_confirmed_blocks, 2);
  EXPECT_EQ(router.index().MatchPrefix(hashes), (std::map<std::string, int64_t>{{id_a, 2}}));
}

TEST_F(KvRouterTest, DepartedWorkerIsDroppedFromTheIndex) {
  FakeWorker a(identity_), b(identity_);
  const std::string id_a = Add(a);
  const std::string id_b = Add(b);
  KvRouter router(&registry_, Options(RoutingPolicy::kKv));
  const std::vector<BlockHash> hashes = Hashes(prompt_);
  a.log.Stored(std::nullopt, hashes);
  b.log.Stored(std::nullopt, hashes);
  router.PollOnce();
  ASSERT_EQ(router.index().MatchPrefix(hashes).size(), 2u);
  ASSERT_TRUE(registry_.Deregister(id_a).ok());
  router.PollOnce();
  EXPECT_EQ(router.index().MatchPrefix(hashes), (std::map<std::string, int64_t>{{id_b, 3}}));
  EXPECT_EQ(router.index().Workers(), std::vector<std::string>{id_b});
}

// Workers that restart get a new id, here also a new address (as a pod does): the router keeps
// one index slot and one channel per registered worker, however many came and went.
TEST_F(KvRouterTest, RestartedWorkersLeaveNoSlotsOrChannelsBehind) {
  FakeWorker stays(identity_);
  const std::string id_stays = Add(stays);
  KvRouter router(&registry_, Options(RoutingPolicy::kKv));
  const std::vector<BlockHash> hashes = Hashes(prompt_);
  stays.log.Stored(std::nullopt, {hashes[0]});
  for (int i = 0; i < 12; ++i) {
    auto worker = std::make_unique<FakeWorker>(identity_);
    const std::string id = Add(*worker);
    worker->log.Stored(std::nullopt, hashes);
    router.PollOnce();
    ASSERT_EQ(router.index().MatchPrefix(hashes),
              (std::map<std::string, int64_t>{{id_stays, 1}, {id, 3}}));
    EXPECT_EQ(router.NumChannels(), 2u);
    ASSERT_TRUE(registry_.Deregister(id).ok());
    worker.reset();
    router.PollOnce();
    EXPECT_EQ(router.index().Workers(), std::vector<std::string>{id_stays});
    EXPECT_EQ(router.NumChannels(), 1u);
  }
  EXPECT_EQ(router.index().NumSlots(), 2);
  EXPECT_EQ(router.index().NumHashes(), 1);
  EXPECT_EQ(router.index().MatchPrefix(hashes),
            (std::map<std::string, int64_t>{{id_stays, 1}}));
}

TEST_F(KvRouterTest, RoundRobinCyclesAndPolicyNamesParse) {
  FakeWorker a(identity_), b(identity_);
  const std::string id_a = Add(a);
  const std::string id_b = Add(b);
  KvRouter router(&registry_, Options(RoutingPolicy::kRoundRobin));
  std::vector<std::string> picks;
  for (int i = 0; i < 4; ++i) {
    const std::string request_id = "r" + std::to_string(i);
    std::optional<WorkerSnapshot> picked =
        router.Pick(WorkerRole::kPrefill, request_id, prompt_, "", 30, {});
    ASSERT_TRUE(picked.has_value());
    picks.push_back(picked->worker_id);
    router.Release(picked->worker_id, request_id);
  }
  EXPECT_EQ(picks, (std::vector<std::string>{id_a, id_b, id_a, id_b}));
  EXPECT_FALSE(router.Pick(WorkerRole::kDecode, "r8", prompt_, "", 30, {}).has_value());
  // Decode picks have their own cycle: the prefill cycle goes on with a.
  ASSERT_TRUE(
      registry_.Register(WorkerRole::kDecode, "127.0.0.1:9", WorkerLoad{0, 0, 100, 100, kBlock})
          .ok());
  EXPECT_TRUE(router.Pick(WorkerRole::kDecode, "r9", prompt_, "", 30, {}).has_value());
  EXPECT_EQ(router.Pick(WorkerRole::kPrefill, "r10", prompt_, "", 30, {})->worker_id, id_a);

  EXPECT_EQ(*ParseRoutingPolicy("kv"), RoutingPolicy::kKv);
  EXPECT_EQ(*ParseRoutingPolicy("load"), RoutingPolicy::kLoad);
  EXPECT_EQ(*ParseRoutingPolicy("round_robin"), RoutingPolicy::kRoundRobin);
  const absl::StatusOr<RoutingPolicy> bad = ParseRoutingPolicy("random");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "unknown routing policy 'random' (expected kv, load or round_robin)");
}

}  // namespace
}  // namespace sluice
