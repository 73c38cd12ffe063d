// KvIndex: event application in sequence order, gap detection and snapshot resync, provisional
// routing records and their expiry, worker removal, longest-prefix matching.
#include "services/router/kv_index.h"

#include <map>
#include <string>
#include <vector>

#include "engine/kv/block_hash.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

class KvIndexTest : public ::testing::Test {
 protected:
  KvIndexTest() : index_(KvIndexOptions{absl::Seconds(10)}, [this] { return now_; }) {
    // Two prompts sharing their first two blocks: a = [0, 1, 2, 3], b = [0, 1, 4, 5] (block ids).
    a_ = Hashes(Tokens({0, 1, 2, 3}));
    b_ = Hashes(Tokens({0, 1, 4, 5}));
  }

  // Token ids of blocks whose tokens are all `id` (block_size 4).
  static std::vector<int32_t> Tokens(const std::vector<int32_t>& block_ids) {
    std::vector<int32_t> tokens;
    for (int32_t id : block_ids) tokens.insert(tokens.end(), 4, id);
    return tokens;
  }
  std::vector<BlockHash> Hashes(const std::vector<int32_t>& tokens) const {
    std::vector<BlockHash> hashes;
    hasher_.ExtendFullBlockHashes(hasher_.RootHash(""), tokens, hashes);
    return hashes;
  }
  static KvEvent Stored(uint64_t seq, std::vector<BlockHash> hashes) {
    return KvEvent{seq, KvEventType::kStored, std::move(hashes), std::nullopt};
  }
  static KvEvent Removed(uint64_t seq, std::vector<BlockHash> hashes) {
    return KvEvent{seq, KvEventType::kRemoved, std::move(hashes), std::nullopt};
  }
  static KvEventBatch Batch(uint64_t log_id, std::vector<KvEvent> events) {
    KvEventBatch batch;
    batch.log_id = log_id;
    batch.last_seq = events.empty() ? 0 : events.back().seq;
    batch.events = std::move(events);
    return batch;
  }
  // Starts `worker` from an empty snapshot of log `log_id` at seq 0.
  void Start(const std::string& worker, uint64_t log_id) {
    index_.ApplySnapshot(worker, KvSnapshot{log_id, 0, {}});
  }
  std::vector<BlockHash> Slice(const std::vector<BlockHash>& h, size_t from, size_t to) {
    return std::vector<BlockHash>(h.begin() + from, h.begin() + to);
  }
  using Matches = std::map<std::string, int64_t>;

  BlockHasher hasher_{KvLayoutIdentity("test-model", 4, "f32", 2, 8, 8), 4};
  std::vector<BlockHash> a_, b_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  KvIndex index_;
};

TEST_F(KvIndexTest, LongestPrefixPerWorker) {
  Start("w1", 7);
  Start("w2", 8);
  ASSERT_TRUE(index_.ApplyEvents("w1", Batch(7, {Stored(1, a_)})));                  // all 4
  ASSERT_TRUE(index_.ApplyEvents("w2", Batch(8, {Stored(1, Slice(b_, 0, 3))})));     // 0, 1, 4
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 4}, {"w2", 2}}));
  EXPECT_EQ(index_.MatchPrefix(b_), (Matches{{"w1", 2}, {"w2", 3}}));
  // Blocks 1, 2, 3 of `a` as a prompt of their own: other chained hashes, nothing held.
  EXPECT_EQ(index_.MatchPrefix(Hashes(Tokens({1, 2, 3}))), Matches{});
  EXPECT_EQ(index_.MatchPrefix({}), Matches{});
  // A hole stops the match even though later blocks are held (as the engine's lookup stops).
  ASSERT_TRUE(index_.ApplyEvents("w1", Batch(7, {Removed(2, {a_[1]})})));
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 1}, {"w2", 2}}));
  EXPECT_EQ(index_.WorkerState("w1").num_confirmed_blocks, 3);
  EXPECT_EQ(index_.WorkerState("w1").last_seq, 2u);
  // Distinct hashes: a0 a1(w2 only) a2 a3 b2.
  EXPECT_EQ(index_.NumHashes(), 5);
}

TEST_F(KvIndexTest, UnknownWorkerNeedsSnapshotFirst) {
  EXPECT_FALSE(index_.ApplyEvents("w1", Batch(7, {Stored(1, a_)})));
  EXPECT_TRUE(index_.WorkerState("w1").needs_resync);
  EXPECT_EQ(index_.MatchPrefix(a_), Matches{});
  index_.ApplySnapshot("w1", KvSnapshot{7, 1, a_});
  EXPECT_FALSE(index_.WorkerState("w1").needs_resync);
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 4}}));
  // The re-read of event 1 (already in the snapshot) is a duplicate, skipped.
  EXPECT_TRUE(index_.ApplyEvents("w1", Batch(7, {Stored(1, a_), Removed(2, {a_[3]})})));
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 3}}));
  EXPECT_EQ(index_.WorkerState("w1").last_seq, 2u);
}

TEST_F(KvIndexTest, SequenceGapMarksResyncAndSnapshotRebuilds) {
  Start("w1", 7);
  ASSERT_TRUE(index_.ApplyEvents("w1", Batch(7, {Stored(1, Slice(a_, 0, 2))})));
  // Event 2 is missing: nothing of the batch is applied, the worker needs a snapshot.
  EXPECT_FALSE(index_.ApplyEvents("w1", Batch(7, {Stored(3, Slice(b_, 2, 4))})));
  KvIndexWorkerState state = index_.WorkerState("w1");
  EXPECT_TRUE(state.needs_resync);
  EXPECT_EQ(state.last_seq, 1u);
  // Still marked: later batches are refused until the snapshot.
  EXPECT_FALSE(index_.ApplyEvents("w1", Batch(7, {Stored(4, a_)})));
  // Stale entries keep serving approximately meanwhile.
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 2}}));
  // The snapshot (through seq 4) replaces every confirmed entry: a0, a1 gone, b's four held.
  index_.ApplySnapshot("w1", KvSnapshot{7, 4, b_});
  state = index_.WorkerState("w1");
  EXPECT_FALSE(state.needs_resync);
  EXPECT_EQ(state.last_seq, 4u);
  EXPECT_EQ(state.num_resyncs, 2);  // Start + this one
  EXPECT_EQ(state.num_confirmed_blocks, 4);
  EXPECT_EQ(index_.MatchPrefix(b_), (Matches{{"w1", 4}}));
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 2}}));  // shared blocks 0, 1 only
  EXPECT_TRUE(index_.ApplyEvents("w1", Batch(7, {Removed(5, {b_[0]})})));
  EXPECT_EQ(index_.MatchPrefix(b_), Matches{});
}

TEST_F(KvIndexTest, FellBehindAndRestartedLogMarkResync) {
  Start("w1", 7);
  KvEventBatch behind = Batch(7, {});
  behind.fell_behind = true;
  EXPECT_FALSE(index_.ApplyEvents("w1", behind));
  EXPECT_TRUE(index_.WorkerState("w1").needs_resync);
  index_.ApplySnapshot("w1", KvSnapshot{7, 9, {}});
  // A batch of another log (the worker restarted its engine) is a gap too.
  EXPECT_FALSE(index_.ApplyEvents("w1", Batch(99, {Stored(10, a_)})));
  EXPECT_TRUE(index_.WorkerState("w1").needs_resync);
  EXPECT_EQ(index_.MatchPrefix(a_), Matches{});
  index_.ApplySnapshot("w1", KvSnapshot{99, 1, a_});
  EXPECT_EQ(index_.WorkerState("w1").log_id, 99u);
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 4}}));
  index_.MarkForResync("w1");
  EXPECT_TRUE(index_.WorkerState("w1").needs_resync);
}

TEST_F(KvIndexTest, AllClearedDropsEverythingOfThatWorker) {
  Start("w1", 7);
  Start("w2", 8);
  ASSERT_TRUE(index_.ApplyEvents("w1", Batch(7, {Stored(1, a_)})));
  ASSERT_TRUE(index_.ApplyEvents("w2", Batch(8, {Stored(1, a_)})));
  index_.RecordRouting("w1", b_);
  KvEvent cleared{2, KvEventType::kAllCleared, {}, std::nullopt};
  ASSERT_TRUE(index_.ApplyEvents("w1", Batch(7, {cleared})));
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w2", 4}}));
  EXPECT_EQ(index_.MatchPrefix(b_), (Matches{{"w2", 2}}));
  EXPECT_EQ(index_.WorkerState("w1").num_confirmed_blocks, 0);
  EXPECT_EQ(index_.WorkerState("w1").num_provisional_blocks, 0);
}

TEST_F(KvIndexTest, ProvisionalRecordsCoverEventLagThenExpire) {
  Start("w1", 7);
  index_.RecordRouting("w1", a_);
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 4}}));
  EXPECT_EQ(index_.WorkerState("w1").num_provisional_blocks, 4);
  // The worker stores only the first three (say the fourth was a partial block after all).
  ASSERT_TRUE(index_.ApplyEvents("w1", Batch(7, {Stored(1, Slice(a_, 0, 3))})));
  KvIndexWorkerState state = index_.WorkerState("w1");
  EXPECT_EQ(state.num_confirmed_blocks, 3);
  EXPECT_EQ(state.num_provisional_blocks, 1);
  now_ += absl::Seconds(9);
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 4}}));  // 9 s < 10 s
  now_ += absl::Seconds(1);
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 3}}));  // expired at exactly 10 s
  EXPECT_EQ(index_.PruneExpired(), 1);
  EXPECT_EQ(index_.WorkerState("w1").num_provisional_blocks, 0);
  EXPECT_EQ(index_.NumHashes(), 3);
  // Confirmed entries never expire.
  now_ += absl::Hours(100);
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w1", 3}}));
}

TEST_F(KvIndexTest, RecordingAgainExtendsExpiryAndRemovedDropsProvisional) {
  Start("w1", 7);
  index_.RecordRouting("w1", b_);
  now_ += absl::Seconds(8);
  index_.RecordRouting("w1", b_);  // expiry now 1018
  now_ += absl::Seconds(8);        // 1016
  EXPECT_EQ(index_.MatchPrefix(b_), (Matches{{"w1", 4}}));
  // A removed event for a block we only recorded: the engine says it is not there.
  ASSERT_TRUE(index_.ApplyEvents("w1", Batch(7, {Removed(1, {b_[2]})})));
  EXPECT_EQ(index_.MatchPrefix(b_), (Matches{{"w1", 2}}));
}

TEST_F(KvIndexTest, RemoveWorkerDropsItsEntriesOnly) {
  Start("w1", 7);
  Start("w2", 8);
  ASSERT_TRUE(index_.ApplyEvents("w1", Batch(7, {Stored(1, a_)})));
  ASSERT_TRUE(index_.ApplyEvents("w2", Batch(8, {Stored(1, Slice(a_, 0, 2))})));
  index_.RecordRouting("w1", b_);
  index_.RemoveWorker("w1");
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w2", 2}}));
  EXPECT_EQ(index_.MatchPrefix(b_), (Matches{{"w2", 2}}));
  EXPECT_EQ(index_.NumHashes(), 2);
  EXPECT_EQ(index_.Workers(), (std::vector<std::string>{"w2"}));
  index_.RemoveWorker("w1");  // no-op
  // The same id coming back starts over: marked for resync, nothing held.
  KvIndexWorkerState state = index_.WorkerState("w1");
  EXPECT_TRUE(state.needs_resync);
  EXPECT_EQ(state.num_confirmed_blocks, 0);
  EXPECT_FALSE(index_.ApplyEvents("w1", Batch(7, {Stored(2, a_)})));
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"w2", 2}}));
}

// Workers restart under new ids (the registry hands out prefill-1, prefill-2, ...): the index
// holds one slot per live worker, and a removed worker's entries are gone, not inherited by the
// next worker that takes its slot.
TEST_F(KvIndexTest, RestartedWorkersReuseSlotsAndLeaveNoEntries) {
  Start("live", 9);
  ASSERT_TRUE(index_.ApplyEvents("live", Batch(9, {Stored(1, a_)})));
  for (int32_t i = 0; i < 50; ++i) {
    const std::string id = "prefill-" + std::to_string(i);
    std::vector<int32_t> blocks;
    for (int32_t b = 0; b < 100; ++b) blocks.push_back(100 + i * 100 + b);
    Start(id, 100 + i);
    ASSERT_TRUE(index_.ApplyEvents(id, Batch(100 + i, {Stored(1, Hashes(Tokens(blocks)))})));
    index_.RecordRouting(id, b_);
    EXPECT_EQ(index_.NumHashes(), 100 + 4 + 2);  // its 100, a's 4, b's last 2
    index_.RemoveWorker(id);
    EXPECT_EQ(index_.NumHashes(), 4);
  }
  EXPECT_EQ(index_.NumSlots(), 2);
  EXPECT_EQ(index_.Workers(), (std::vector<std::string>{"live"}));
  // The reused slot starts empty: the new worker holds nothing until its snapshot says so.
  Start("prefill-50", 150);
  EXPECT_EQ(index_.NumSlots(), 2);
  EXPECT_EQ(index_.WorkerState("prefill-50").num_confirmed_blocks, 0);
  EXPECT_EQ(index_.WorkerState("prefill-50").num_provisional_blocks, 0);
  EXPECT_EQ(index_.MatchPrefix(b_), (Matches{{"live", 2}}));
  EXPECT_EQ(index_.MatchPrefix(a_), (Matches{{"live", 4}}));
  // The removed workers' provisional records do not come back when they would have expired.
  now_ += absl::Seconds(11);
  EXPECT_EQ(index_.PruneExpired(), 0);
}

}  // namespace
}  // namespace sluice
