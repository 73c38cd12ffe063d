// KV connector (engine/kv/kv_connector.h): block serialization, and two LLMEngines sharing a
// fake block store through AsyncKvConnector: engine A writes its full blocks through, engine B
// loads them at admission and computes only the tail; a block the store cannot verify cuts the
// loaded run there; a store that is down or a request aborted while loading still ends
// correctly with every block freed. Outputs are checked against ChecksumModel::Reference (its
// next token sums every token read back from the paged cache, so wrongly loaded KV shows).
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_connector.h"
#include "engine/sched/llm_engine.h"
#include "tests/util/fake_kv_store.h"
#include "tests/util/fake_models.h"

namespace sluice {
namespace {

using testing::ChecksumModel;
using testing::FakeKvBackend;
using testing::FakeKvStore;

struct Node {
  std::shared_ptr<AsyncKvConnector> connector;
  std::unique_ptr<LLMEngine> engine;
};

Node MakeNode(FakeKvStore* store) {
  Node node;
  AsyncKvConnectorOptions connector_options;
  connector_options.failure_backoff = absl::Hours(1);  // never runs out within a test
  node.connector =
      std::make_shared<AsyncKvConnector>(std::make_unique<FakeKvBackend>(store), connector_options);
  EngineOptions options;
  options.block_size = 4;
  options.num_kv_blocks = 64;
  options.max_model_len = 64;
  options.max_num_batched_tokens = 16;
  options.model_id = "checksum";
  options.kv_connector = node.connector;
  auto engine = LLMEngine::Create(std::make_unique<ChecksumModel>(), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  node.engine = std::move(engine).value();
  return node;
}

// Run: steps `node` until `id` finishes, letting connector calls complete between steps (the
// test never depends on timing). Returns the generated tokens; `last` gets the final output.
std::vector<int32_t> Run(Node& node, const std::string& id, RequestOutput* last) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 1000 && node.engine->HasUnfinishedRequests(); ++i) {
    EXPECT_TRUE(node.connector->WaitIdle(absl::Now() + absl::Seconds(30)));
    for (const RequestOutput& out : node.engine->Step()) {
      EXPECT_EQ(out.request_id, id);
      for (const SampledToken& t : out.new_tokens) tokens.push_back(t.token_id);
      if (out.finished()) *last = out;
    }
  }
  EXPECT_FALSE(node.engine->HasUnfinishedRequests());
  EXPECT_TRUE(node.connector->WaitIdle(absl::Now() + absl::Seconds(30)));  // write-through
  return tokens;
}

std::vector<int32_t> RunChecked(Node& node, const std::string& id,
                                const std::vector<int32_t>& prompt, int max_tokens,
                                RequestOutput* last) {
  EXPECT_TRUE(node.engine->AddRequest(testing::GreedyRequest(id, prompt, max_tokens)).ok());
  std::vector<int32_t> tokens = Run(node, id, last);
  EXPECT_EQ(tokens, ChecksumModel::Reference(prompt, max_tokens)) << id;
  EXPECT_EQ(node.engine->num_free_blocks(), node.engine->num_total_blocks());
  return tokens;
}

// FillStore: a fresh engine computes `prompt` and writes its blocks through to `store`; returns
// the engine's KV identity (seeds the block hashes).
std::string FillStore(FakeKvStore* store, const std::vector<int32_t>& prompt, int max_tokens) {
  Node a = MakeNode(store);
  RequestOutput out;
  RunChecked(a, "a", prompt, max_tokens, &out);
  return a.engine->kv_identity();
}

TEST(KvConnectorTest, BlockSerializationIsPerLayerKThenV) {
  const KvCacheSpec spec{2, 3, 2};  // 2 layers, K 3 floats/token, V 2 floats/token
  KvCache cache(spec, 4, 2);
  ASSERT_EQ(KvBlockBytes(spec, 2), 2 * (3 + 2) * 2 * 4);
  for (int64_t l = 0; l < 2; ++l) {
    for (int i = 0; i < 4 * 2 * 3; ++i) cache.k(l)[i] = static_cast<float>(1000 * l + i);
    for (int i = 0; i < 4 * 2 * 2; ++i) cache.v(l)[i] = static_cast<float>(1000 * l + 500 + i);
  }
  std::vector<uint8_t> bytes(KvBlockBytes(spec, 2));
  GatherKvBlock(cache, 1, absl::MakeSpan(bytes));
  std::vector<float> f(bytes.size() / 4);
  std::memcpy(f.data(), bytes.data(), bytes.size());
  // Block 1 = tokens 2..3: layer 0 K floats 6..11, layer 0 V 4..7, layer 1 K, layer 1 V.
  const std::vector<float> expected = {6,    7,    8,    9,    10,   11,   504,  505,  506,  507,
                                       1006, 1007, 1008, 1009, 1010, 1011, 1504, 1505, 1506, 1507};
  EXPECT_EQ(f, expected);
  ScatterKvBlock(bytes, 3, cache);
  EXPECT_EQ(cache.k(1)[3 * 6], 1006.0f);
  EXPECT_EQ(cache.v(1)[3 * 4 + 3], 1507.0f);
  EXPECT_EQ(cache.k(0)[1 * 6], 6.0f);  // the source block is untouched
}

TEST(KvConnectorTest, SecondEngineLoadsWrittenThroughBlocksAndComputesOnlyTheTail) {
  FakeKvStore store;
  Node a = MakeNode(&store);
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 1);
  RequestOutput out;
  RunChecked(a, "a", prompt, 5, &out);
  EXPECT_EQ(out.num_cached_tokens, 0);
  // 30 prompt + 4 fed-back outputs computed = 34 tokens: 8 full blocks of 4 written through.
  EXPECT_EQ(store.blocks.size(), 8u);
  EXPECT_EQ(a.engine->counters().kv_connector.num_saved_blocks, 8);

  Node b = MakeNode(&store);
  RunChecked(b, "b", prompt, 5, &out);
  // At most (30 - 1) / 4 = 7 blocks load (the last prompt token is computed for its logits).
  EXPECT_EQ(out.num_cached_tokens, 28);
  const EngineCounters c = b.engine->counters();
  EXPECT_EQ(c.num_prompt_tokens_computed, 2);
  EXPECT_EQ(c.num_prompt_tokens_cached, 28);
  EXPECT_EQ(c.num_prompt_tokens_cached_external, 28);
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, 7);
  EXPECT_EQ(c.kv_connector.num_saved_blocks, 0);  // B's blocks are all in the store already
  // Loaded blocks entered B's prefix cache: a third request hits locally, no new lookup.
  const int64_t exists_calls = store.num_exists_calls;
  RunChecked(b, "b2", prompt, 5, &out);
  EXPECT_EQ(out.num_cached_tokens, 28);
  EXPECT_EQ(b.engine->counters().num_prompt_tokens_cached_external, 28);
  EXPECT_EQ(store.num_exists_calls, exists_calls);
}

TEST(KvConnectorTest, UnverifiedBlockCutsTheLoadedRunAndTheRestIsComputed) {
  FakeKvStore store;
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 2);
  const BlockHasher hasher(FillStore(&store, prompt, 3), 4);
  // Mark the 4th block (tokens 12..15) as failing its checksum.
  std::vector<BlockHash> hashes;
  hasher.ExtendFullBlockHashes(hasher.RootHash(""), prompt, hashes);
  store.corrupt.insert(hashes[3]);

  Node b = MakeNode(&store);
  RequestOutput out;
  RunChecked(b, "b", prompt, 3, &out);
  EXPECT_EQ(out.num_cached_tokens, 12);
  EXPECT_EQ(b.engine->counters().num_prompt_tokens_computed, 30 - 12);
  EXPECT_EQ(b.engine->counters().kv_connector.num_load_errors, 1);
}

TEST(KvConnectorTest, StoreDownComputesEverything) {
  FakeKvStore store;
  store.down = true;
  Node b = MakeNode(&store);
  RequestOutput out;
  RunChecked(b, "b", testing::ChecksumPrompt(30, 3), 3, &out);
  EXPECT_EQ(out.num_cached_tokens, 0);
  const EngineCounters c = b.engine->counters();
  EXPECT_EQ(c.num_prompt_tokens_computed, 30);
  EXPECT_EQ(c.kv_connector.num_load_errors, 1);
  EXPECT_GT(c.kv_connector.num_save_failed_blocks, 0);
  // Within the failure back-off the next load makes no store call at all.
  const int64_t exists_calls = store.num_exists_calls;
  RunChecked(b, "b2", testing::ChecksumPrompt(30, 5), 3, &out);
  EXPECT_EQ(out.num_cached_tokens, 0);
  EXPECT_EQ(store.num_exists_calls, exists_calls);
  EXPECT_EQ(b.engine->counters().kv_connector.num_load_skipped, 1);
}

TEST(KvConnectorTest, AbortWhileLoadingFreesBlocksAndDropsTheLoad) {
  FakeKvStore store;
  const std::vector<int32_t> prompt = testing::ChecksumPrompt(30, 4);
  FillStore(&store, prompt, 3);
  RequestOutput out;
  // B already has the first 2 blocks locally (a 9-token prompt), so it holds them while loading.
  Node b = MakeNode(&store);
  RunChecked(b, "warm", std::vector<int32_t>(prompt.begin(), prompt.begin() + 9), 1, &out);
  {
    std::lock_guard<std::mutex> lock(store.mu);
    store.block_gets = true;
  }
  ASSERT_TRUE(b.engine->AddRequest(testing::GreedyRequest("b", prompt, 3)).ok());
  EXPECT_TRUE(b.engine->Step().empty());  // parked: loading
  EXPECT_TRUE(b.engine->HasPendingTimers());
  EXPECT_FALSE(b.engine->HasStepWork());
  b.engine->AbortRequest("b");
  std::vector<RequestOutput> outs = b.engine->Step();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].finish_reason, FinishReason::kAbort);
  {
    std::lock_guard<std::mutex> lock(store.mu);
    store.block_gets = false;
  }
  store.cv.notify_all();
  ASSERT_TRUE(b.connector->WaitIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_TRUE(b.engine->Step().empty());  // the finished load finds nobody
  EXPECT_FALSE(b.engine->HasPendingTimers());
  EXPECT_EQ(b.engine->num_free_blocks(), b.engine->num_total_blocks());
  // The same id again loads normally.
  RunChecked(b, "b", prompt, 3, &out);
  EXPECT_EQ(out.num_cached_tokens, 28);
}

}  // namespace
}  // namespace sluice
