// Prefix caching: the block allocator's cached LRU, PrefixCache registration/lookup/eviction,
// the KV event log, and LLMEngine end to end on the fake ChecksumModel (its next token depends
// on every token read back from the paged KV cache, so a wrongly shared or stale block changes
// the output). Reference tokens come from ChecksumModel::Reference (no cache at all).
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_block_allocator.h"
#include "engine/kv/kv_events.h"
#include "engine/kv/prefix_cache.h"
#include "engine/sched/async_engine.h"
#include "engine/sched/llm_engine.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

using testing::ChecksumModel;

std::vector<int32_t> Prompt(int len, int salt) { return testing::ChecksumPrompt(len, salt); }

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

EngineRequest Greedy(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                     const std::string& salt = "") {
  EngineRequest r = testing::GreedyRequest(id, std::move(prompt), max_tokens);
  r.cache_salt = salt;
  return r;
}

EngineOptions SmallOptions(int64_t num_blocks = 64) {
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = num_blocks;
  options.max_model_len = 64;
  options.max_num_batched_tokens = 16;
  return options;
}

std::unique_ptr<LLMEngine> MakeEngine(const EngineOptions& options) {
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

struct EngineRun {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> last;
};

EngineRun Drain(LLMEngine& engine) {
  EngineRun run;
  for (int i = 0; i < 10000 && engine.HasUnfinishedRequests(); ++i) {
    for (const RequestOutput& out : engine.Step()) {
      for (const SampledToken& t : out.new_tokens) run.tokens[out.request_id].push_back(t.token_id);
      if (out.finished()) run.last[out.request_id] = out;
    }
  }
  EXPECT_FALSE(engine.HasUnfinishedRequests());
  return run;
}

// Runs one request alone to the end; checks its tokens against the cache-free reference.
RequestOutput RunOne(LLMEngine& engine, EngineRequest request) {
  const std::string id = request.request_id;
  const std::vector<int32_t> prompt = request.prompt_token_ids;
  const int max_tokens = request.sampling.max_tokens;
  EXPECT_TRUE(engine.AddRequest(std::move(request)).ok());
  EngineRun run = Drain(engine);
  EXPECT_EQ(run.tokens[id], ChecksumModel::Reference(prompt, max_tokens)) << id;
  return run.last[id];
}

// ---------------------------------------------------------------------------------------------
// KvBlockAllocator: cached blocks and the LRU.

TEST(KvBlockAllocatorTest, CachedBlocksStayFreeButReusableUntilEvictedInLruOrder) {
  KvBlockAllocator alloc(4);
  std::vector<int32_t> a, evicted;
  ASSERT_TRUE(alloc.Allocate(3, a, &evicted));
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  alloc.SetCached(0, true);
  alloc.SetCached(1, true);
  alloc.Free({1, 0, 2});  // 1 then 0 enter the LRU; 2 is empty
  EXPECT_EQ(alloc.num_free_blocks(), 4);
  EXPECT_EQ(alloc.num_evictable_blocks(), 2);

  alloc.Acquire(0);  // reuse a cached free block
  EXPECT_EQ(alloc.ref_count(0), 1);
  EXPECT_EQ(alloc.num_free_blocks(), 3);
  alloc.Free({0});  // now the most recently used

  std::vector<int32_t> b;
  ASSERT_TRUE(alloc.Allocate(3, b, &evicted));  // 2 empty ones first, then evict LRU head (1)
  EXPECT_EQ(b, (std::vector<int32_t>{2, 3, 1}));
  EXPECT_EQ(evicted, (std::vector<int32_t>{1}));
  EXPECT_FALSE(alloc.is_cached(1));
  EXPECT_TRUE(alloc.is_cached(0));
  EXPECT_FALSE(alloc.Allocate(2, b, &evicted));  // one free block left
  EXPECT_EQ(alloc.num_free_blocks(), 1);

  alloc.SetCached(0, false);  // unmarking a free cached block empties it
  EXPECT_EQ(alloc.num_evictable_blocks(), 0);
  EXPECT_EQ(alloc.num_free_blocks(), 1);
}

// ---------------------------------------------------------------------------------------------
// PrefixCache + events.

class PrefixCacheTest : public ::testing::Test {
 protected:
  PrefixCacheTest()
      : hasher_("sluice-kv/1;model=unit", 4),
        events_(std::make_shared<KvEventLog>(64)),
        cache_(8, /*enabled=*/true, events_) {}

  std::vector<BlockHash> Hashes(const std::vector<int32_t>& tokens, const std::string& salt = "") {
    std::vector<BlockHash> h;
    hasher_.ExtendFullBlockHashes(hasher_.RootHash(salt), tokens, h);
    return h;
  }

  BlockHasher hasher_;
  std::shared_ptr<KvEventLog> events_;
  PrefixCache cache_;
};

TEST_F(PrefixCacheTest, RegisterLookupEvictAndEvents) {
  const std::vector<BlockHash> h = Hashes(Prompt(12, 0));  // 3 full blocks
  std::vector<int32_t> blocks;
  ASSERT_TRUE(cache_.Allocate(3, blocks));
  cache_.Register(blocks, h, std::nullopt);
  EXPECT_EQ(cache_.stats().num_cached_blocks, 3);

  // A second sequence sharing the first two blocks.
  const std::vector<int32_t> tokens = Prompt(12, 0);
  std::vector<BlockHash> other =
      Hashes(Concat(std::vector<int32_t>(tokens.begin(), tokens.begin() + 8), Prompt(4, 5)));
  std::vector<int32_t> hit = cache_.AcquirePrefix(other, 3);
  EXPECT_EQ(hit, (std::vector<int32_t>{blocks[0], blocks[1]}));
  EXPECT_EQ(cache_.allocator().ref_count(blocks[0]), 2);
  EXPECT_EQ(cache_.AcquirePrefix(h, 1).size(), 1u);  // max_blocks caps the hit
  cache_.Free({blocks[0]});

  cache_.Free(hit);
  cache_.Free(blocks);  // all three cached and free now
  EXPECT_EQ(cache_.allocator().num_free_blocks(), 8);
  EXPECT_EQ(cache_.allocator().num_evictable_blocks(), 3);

  // Fill the cache: 5 empty blocks first, then the LRU head. Free released the sequence tail
  // first, so its last block (blocks[2]) is evicted before the shared prefix.
  std::vector<int32_t> fill;
  ASSERT_TRUE(cache_.Allocate(6, fill));
  EXPECT_EQ(fill.back(), blocks[2]);
  EXPECT_EQ(cache_.stats().num_evicted_blocks, 1);
  EXPECT_EQ(cache_.AcquirePrefix(h, 3), (std::vector<int32_t>{blocks[0], blocks[1]}));

  KvEventBatch batch = events_->Read(0);
  EXPECT_FALSE(batch.fell_behind);
  ASSERT_EQ(batch.events.size(), 2u);
  EXPECT_EQ(batch.events[0].seq, 1u);
  EXPECT_EQ(batch.events[0].type, KvEventType::kStored);
  EXPECT_EQ(batch.events[0].block_hashes, h);
  EXPECT_FALSE(batch.events[0].parent_hash.has_value());
  EXPECT_EQ(batch.events[1].type, KvEventType::kRemoved);
  EXPECT_EQ(batch.events[1].block_hashes, (std::vector<BlockHash>{h[2]}));
  KvSnapshot snap = events_->Snapshot();
  EXPECT_EQ(snap.seq, 2u);
  EXPECT_EQ(absl::flat_hash_set<BlockHash>(snap.block_hashes.begin(), snap.block_hashes.end()),
            (absl::flat_hash_set<BlockHash>{h[0], h[1]}));
}

TEST_F(PrefixCacheTest, DuplicateBlocksStayPrivateAndSplitStoredRuns) {
  const std::vector<BlockHash> h = Hashes(Prompt(12, 1));
  std::vector<int32_t> a, b;
  ASSERT_TRUE(cache_.Allocate(1, a));
  cache_.Register(a, {h[1]}, h[0]);  // another sequence already registered block 1
  ASSERT_TRUE(cache_.Allocate(3, b));
  cache_.Register(b, h, std::nullopt);  // 0 new, 1 duplicate (stays private), 2 new
  EXPECT_TRUE(cache_.allocator().is_cached(b[0]));
  EXPECT_FALSE(cache_.allocator().is_cached(b[1]));
  EXPECT_TRUE(cache_.allocator().is_cached(b[2]));
  KvEventBatch batch = events_->Read(0);
  ASSERT_EQ(batch.events.size(), 3u);
  EXPECT_EQ(batch.events[1].block_hashes, (std::vector<BlockHash>{h[0]}));
  EXPECT_FALSE(batch.events[1].parent_hash.has_value());
  EXPECT_EQ(batch.events[2].block_hashes, (std::vector<BlockHash>{h[2]}));
  EXPECT_EQ(batch.events[2].parent_hash, h[1]);
  // The lookup follows the registered copies: a's block for h[1].
  EXPECT_EQ(cache_.AcquirePrefix(h, 3), (std::vector<int32_t>{b[0], a[0], b[2]}));

  cache_.Reset();
  EXPECT_EQ(cache_.stats().num_cached_blocks, 0);
  EXPECT_TRUE(cache_.AcquirePrefix(h, 3).empty());
  EXPECT_EQ(events_->Read(3).events.back().type, KvEventType::kAllCleared);
  EXPECT_TRUE(events_->Snapshot().block_hashes.empty());
}

TEST(KvEventLogTest, BoundedBufferReportsFallingBehindAndRestarts) {
  KvEventLog log(3);
  EXPECT_EQ(log.Read(0).last_seq, 0u);
  EXPECT_FALSE(log.Read(0).fell_behind);
  for (uint64_t i = 1; i <= 5; ++i) log.Removed({BlockHash{i, 0}});
  KvEventBatch batch = log.Read(2);  // seqs 3..5 kept
  EXPECT_FALSE(batch.fell_behind);
  ASSERT_EQ(batch.events.size(), 3u);
  EXPECT_EQ(batch.events[0].seq, 3u);
  EXPECT_EQ(batch.events[2].seq, 5u);
  EXPECT_EQ(log.Read(3, /*max_events=*/1).events.size(), 1u);
  EXPECT_TRUE(log.Read(1).fell_behind);  // seq 2 was dropped
  EXPECT_TRUE(log.Read(0).events.empty());
  EXPECT_TRUE(log.Read(9).fell_behind);  // ahead of this log: another (restarted) log's reader
  EXPECT_TRUE(log.Read(5).events.empty());
  EXPECT_FALSE(log.Read(5).fell_behind);
  EXPECT_NE(log.log_id(), KvEventLog(3).log_id());
}

// ---------------------------------------------------------------------------------------------
// LLMEngine with prefix caching.

TEST(PrefixCacheEngineTest, RepeatedPromptReusesFullBlocksAndCountsTokens) {
  auto engine = MakeEngine(SmallOptions());
  const std::vector<int32_t> prompt = Prompt(10, 0);
  RequestOutput first = RunOne(*engine, Greedy("a", prompt, 5));
  EXPECT_EQ(first.num_cached_tokens, 0);
  RequestOutput second = RunOne(*engine, Greedy("b", prompt, 5));
  EXPECT_EQ(second.num_cached_tokens, 8);  // two full blocks of 4; the partial one recomputed
  const EngineCounters c = engine->counters();
  EXPECT_EQ(c.num_prompt_tokens_cached, 8);
  EXPECT_EQ(c.num_prompt_tokens_computed, 10 + 2);
  EXPECT_EQ(c.num_prefix_cache_hit_blocks, 2);
  EXPECT_EQ(engine->num_free_blocks(), engine->num_total_blocks());
}

TEST(PrefixCacheEngineTest, FullyCachedPromptStillComputesItsLastToken) {
  auto engine = MakeEngine(SmallOptions());
  const std::vector<int32_t> prompt = Prompt(8, 1);  // exactly two blocks
  RunOne(*engine, Greedy("a", prompt, 3));
  RequestOutput second = RunOne(*engine, Greedy("b", prompt, 3));
  EXPECT_EQ(second.num_cached_tokens, 4);
  EXPECT_EQ(engine->counters().num_prompt_tokens_computed, 8 + 4);
}

TEST(PrefixCacheEngineTest, MultiTurnReusesPromptAndAnswer) {
  auto engine = MakeEngine(SmallOptions());
  const std::vector<int32_t> turn1 = Prompt(10, 2);
  const std::vector<int32_t> answer1 = ChecksumModel::Reference(turn1, 6);
  RunOne(*engine, Greedy("t1", turn1, 6));
  // Turn 1 held 16 tokens, 15 of them computed (the last answer token never ran): 3 blocks.
  const std::vector<int32_t> turn2 = Concat(Concat(turn1, answer1), Prompt(5, 3));
  RequestOutput second = RunOne(*engine, Greedy("t2", turn2, 6));
  EXPECT_EQ(second.num_cached_tokens, 12);
  EXPECT_EQ(engine->counters().num_prompt_tokens_computed, 10 + (21 - 12));
}

TEST(PrefixCacheEngineTest, DisabledNeverCaches) {
  EngineOptions options = SmallOptions();
  options.enable_prefix_caching = false;
  auto engine = MakeEngine(options);
  RunOne(*engine, Greedy("a", Prompt(12, 0), 4));
  RequestOutput second = RunOne(*engine, Greedy("b", Prompt(12, 0), 4));
  EXPECT_EQ(second.num_cached_tokens, 0);
  EXPECT_EQ(engine->counters().num_prompt_tokens_cached, 0);
  EXPECT_EQ(engine->num_cached_blocks(), 0);
  EXPECT_EQ(engine->kv_events()->Read(0).last_seq, 0u);
}

TEST(PrefixCacheEngineTest, CacheSaltIsolatesTenants) {
  auto engine = MakeEngine(SmallOptions());
  const std::vector<int32_t> prompt = Prompt(13, 4);
  EXPECT_EQ(RunOne(*engine, Greedy("a1", prompt, 3, "tenant-a")).num_cached_tokens, 0);
  EXPECT_EQ(RunOne(*engine, Greedy("b1", prompt, 3, "tenant-b")).num_cached_tokens, 0);
  EXPECT_EQ(RunOne(*engine, Greedy("n1", prompt, 3)).num_cached_tokens, 0);
  EXPECT_EQ(RunOne(*engine, Greedy("a2", prompt, 3, "tenant-a")).num_cached_tokens, 12);
  EXPECT_EQ(RunOne(*engine, Greedy("n2", prompt, 3)).num_cached_tokens, 12);
}

TEST(PrefixCacheEngineTest, EvictsLeastRecentlyUsedUnderBlockPressure) {
  EngineOptions options = SmallOptions(/*num_blocks=*/16);  // one max_model_len sequence
  auto engine = MakeEngine(options);
  const std::vector<int32_t> a = Prompt(12, 5);
  const std::vector<int32_t> b = Prompt(40, 6);
  RunOne(*engine, Greedy("a", a, 4));
  EXPECT_EQ(engine->num_cached_blocks(), 3);
  RunOne(*engine, Greedy("b", b, 20));  // 60 tokens = 15 blocks: evicts a's blocks
  EXPECT_GT(engine->counters().num_prefix_cache_evicted_blocks, 0);
  RequestOutput again = RunOne(*engine, Greedy("a2", a, 4));
  EXPECT_LT(again.num_cached_tokens, 8);  // a's prefix blocks (at least its 2nd) were evicted
  RequestOutput b2 = RunOne(*engine, Greedy("b2", b, 4));
  EXPECT_GT(b2.num_cached_tokens, 0);  // b's prefix survived a2's few new blocks
  EXPECT_EQ(engine->num_free_blocks(), 16);
  // Every eviction was published: the snapshot matches the cache's registered count.
  EXPECT_EQ(static_cast<int64_t>(engine->kv_events()->Snapshot().block_hashes.size()),
            engine->num_cached_blocks());
}

TEST(PrefixCacheEngineTest, PreemptedRequestsRecomputeFromTheCache) {
  EngineOptions options = SmallOptions(/*num_blocks=*/20);
  options.max_num_batched_tokens = 64;
  auto engine = MakeEngine(options);
  std::map<std::string, std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    const std::string id = "r" + std::to_string(i);
    prompts[id] = Prompt(20, 10 + i);
    ASSERT_TRUE(engine->AddRequest(Greedy(id, prompts[id], 30)).ok());
  }
  EngineRun run = Drain(*engine);
  for (const auto& [id, prompt] : prompts) {
    EXPECT_EQ(run.tokens[id], ChecksumModel::Reference(prompt, 30)) << id;
  }
  const EngineCounters c = engine->counters();
  EXPECT_GT(c.num_preemptions, 0);
  EXPECT_GT(c.num_prompt_tokens_cached, 0);  // a readmitted victim found its own blocks
  EXPECT_EQ(engine->num_free_blocks(), 20);
}

TEST(PrefixCacheEngineTest, ChunkedPrefillSharesBlocksWithALaterRequest) {
  auto engine = MakeEngine(SmallOptions());  // 16 tokens per step
  const std::vector<int32_t> shared = Prompt(24, 7);
  const std::vector<int32_t> a = Concat(shared, Prompt(6, 8));
  const std::vector<int32_t> b = Concat(shared, Prompt(9, 9));
  ASSERT_TRUE(engine->AddRequest(Greedy("a", a, 5)).ok());
  ASSERT_TRUE(engine->AddRequest(Greedy("b", b, 5)).ok());
  EngineRun run = Drain(*engine);
  EXPECT_EQ(run.tokens["a"], ChecksumModel::Reference(a, 5));
  EXPECT_EQ(run.tokens["b"], ChecksumModel::Reference(b, 5));
  // a's first chunk (16 tokens) fills step 1; b is admitted in step 2 beside a's last chunk
  // and reuses the 4 blocks a registered after step 1.
  EXPECT_EQ(run.last["b"].num_cached_tokens, 16);
  EXPECT_EQ(engine->counters().num_prompt_tokens_computed, 30 + (33 - 16));
}

TEST(PrefixCacheEngineTest, ConcurrentIdenticalRequestsComputeTwiceAndLeakNothing) {
  auto engine = MakeEngine(SmallOptions());
  const std::vector<int32_t> prompt = Prompt(7, 11);
  ASSERT_TRUE(engine->AddRequest(Greedy("x", prompt, 9)).ok());
  ASSERT_TRUE(engine->AddRequest(Greedy("y", prompt, 9)).ok());  // same step: no hit yet
  EngineRun run = Drain(*engine);
  EXPECT_EQ(run.tokens["x"], ChecksumModel::Reference(prompt, 9));
  EXPECT_EQ(run.tokens["y"], run.tokens["x"]);
  EXPECT_EQ(engine->num_free_blocks(), engine->num_total_blocks());
  // 15 computed tokens each: 3 full blocks, registered once.
  EXPECT_EQ(engine->num_cached_blocks(), 3);
  EXPECT_EQ(RunOne(*engine, Greedy("z", Concat(prompt, run.tokens["x"]), 2)).num_cached_tokens,
            12);
}

TEST(PrefixCacheEngineTest, AbortedRequestLeavesItsComputedBlocksCached) {
  EngineOptions options = SmallOptions();
  options.max_num_batched_tokens = 8;
  auto engine = MakeEngine(options);
  const std::vector<int32_t> prompt = Prompt(30, 12);
  ASSERT_TRUE(engine->AddRequest(Greedy("a", prompt, 5)).ok());
  engine->Step();  // 8 prompt tokens: two full blocks
  engine->Step();  // 16
  engine->AbortRequest("a");
  EngineRun aborted = Drain(*engine);
  EXPECT_EQ(aborted.last["a"].finish_reason, FinishReason::kAbort);
  EXPECT_EQ(engine->num_cached_blocks(), 4);
  EXPECT_EQ(RunOne(*engine, Greedy("b", prompt, 5)).num_cached_tokens, 16);
  EXPECT_EQ(engine->num_free_blocks(), engine->num_total_blocks());
}

TEST(PrefixCacheEngineTest, EventsDescribeTheCacheAndResetClearsIt) {
  auto engine = MakeEngine(SmallOptions());
  const std::vector<int32_t> prompt = Prompt(9, 13);
  RunOne(*engine, Greedy("a", prompt, 2));
  BlockHasher hasher(engine->kv_identity(), 4);
  std::vector<BlockHash> expected;
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), prompt, expected);  // 2 full blocks
  KvEventBatch batch = engine->kv_events()->Read(0);
  ASSERT_FALSE(batch.fell_behind);
  std::vector<BlockHash> stored;
  for (const KvEvent& e : batch.events) {
    ASSERT_EQ(e.type, KvEventType::kStored);
    stored.insert(stored.end(), e.block_hashes.begin(), e.block_hashes.end());
  }
  EXPECT_EQ(stored, expected);  // the router can compute the same hashes from token ids
  EXPECT_FALSE(batch.events[0].parent_hash.has_value());

  engine->ResetPrefixCache();
  EXPECT_EQ(engine->num_cached_blocks(), 0);
  KvEventBatch after = engine->kv_events()->Read(batch.last_seq);
  ASSERT_EQ(after.events.size(), 1u);
  EXPECT_EQ(after.events[0].type, KvEventType::kAllCleared);
  EXPECT_EQ(RunOne(*engine, Greedy("b", prompt, 2)).num_cached_tokens, 0);
  EXPECT_EQ(engine->num_free_blocks(), engine->num_total_blocks());
}

TEST(PrefixCacheEngineTest, IdentityDependsOnModelIdAndBlockSize) {
  EngineOptions options = SmallOptions();
  options.model_id = "checksum";
  auto a = MakeEngine(options);
  EXPECT_EQ(a->kv_identity(), KvLayoutIdentity("checksum", 4, "f32", 1, 1, 0));
  options.block_size = 8;
  EXPECT_NE(MakeEngine(options)->kv_identity(), a->kv_identity());
}

// Decode side: transferred prompt blocks join the cache once the transfer completed.
TEST(PrefixCacheEngineTest, DecodeSideCachesTransferredBlocksAfterCompleteTransfer) {
  auto prefill = MakeEngine(SmallOptions());
  auto decode = MakeEngine(SmallOptions());
  const std::vector<int32_t> prompt = Prompt(14, 14);
  EngineRequest p = Greedy("r", prompt, 6);
  p.hold_kv_blocks = true;
  ASSERT_TRUE(prefill->AddRequest(p).ok());
  EngineRun pr = Drain(*prefill);
  ASSERT_TRUE(pr.last["r"].kv_held);
  EXPECT_EQ(prefill->num_cached_blocks(), 3);  // held blocks are cached (and pinned)

  auto reserved = decode->ReserveForTransfer(Greedy("r", prompt, 6), std::nullopt);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(decode->num_cached_blocks(), 0);  // nothing is shared while the transfer may run
  for (size_t b = 0; b < pr.last["r"].held_block_ids.size(); ++b) {
    std::memcpy(decode->kv_cache().k(0) + (*reserved)[b] * 4,
                prefill->kv_cache().k(0) + pr.last["r"].held_block_ids[b] * 4, 4 * sizeof(float));
  }
  ASSERT_TRUE(prefill->ReleaseHeldBlocks("r").ok());
  ASSERT_TRUE(decode->CompleteTransfer("r", absl::OkStatus(), pr.last["r"].new_tokens[0]).ok());
  EngineRun dr = Drain(*decode);
  std::vector<int32_t> all = pr.tokens["r"];
  all.insert(all.end(), dr.tokens["r"].begin(), dr.tokens["r"].end());
  EXPECT_EQ(all, ChecksumModel::Reference(prompt, 6));
  EXPECT_GE(decode->num_cached_blocks(), 3);
  EXPECT_EQ(RunOne(*decode, Greedy("local", prompt, 3)).num_cached_tokens, 12);

  // A failed transfer registers nothing.
  auto failed = decode->ReserveForTransfer(Greedy("f", Prompt(14, 15), 6), std::nullopt);
  ASSERT_TRUE(failed.ok());
  const int64_t cached = decode->num_cached_blocks();
  ASSERT_TRUE(decode->CompleteTransfer("f", absl::UnavailableError("peer died"), std::nullopt)
                  .ok());
  Drain(*decode);
  EXPECT_EQ(decode->num_cached_blocks(), cached);
  EXPECT_EQ(decode->num_free_blocks(), decode->num_total_blocks());
}

TEST(PrefixCacheEngineTest, AsyncEngineServesEventsAndSnapshotsFromOtherThreads) {
  AsyncEngine engine(MakeEngine(SmallOptions()));
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  ASSERT_TRUE(engine
                  .Submit(Greedy("a", Prompt(17, 16), 3),
                          [&](const RequestOutput& out) {
                            if (!out.finished()) return;
                            std::lock_guard<std::mutex> lock(mu);
                            done = true;
                            cv.notify_all();
                          })
                  .ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
  }
  KvSnapshot snap = engine.KvCacheSnapshot();
  EXPECT_EQ(snap.block_hashes.size(), 4u);  // 20 tokens, 19 computed: 4 full blocks
  KvEventBatch batch = engine.ReadKvEvents(0);
  EXPECT_EQ(batch.log_id, snap.log_id);
  EXPECT_EQ(batch.last_seq, snap.seq);
  size_t stored = 0;
  for (const KvEvent& e : batch.events) stored += e.block_hashes.size();
  EXPECT_EQ(stored, 4u);
}

}  // namespace
}  // namespace sluice
