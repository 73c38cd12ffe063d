// The kvstore behind the CUDA runner's KV cache (GPU only; part of cuda_model_test), as
// `sluice serve --device cuda --kvstore` runs it: an LLMEngine over CudaModel with a KV connector
// to an in-process kvstore shard with UCX (gRPC for control; block bytes by RMA between the
// connector's registered host buffers and the store's DRAM, never inline). Pass 1 computes the
// prompts and writes every full block through (device -> pinned staging -> registered buffer ->
// UCX -> store). Pass 1b runs them again on local prefix-cache hits: the reference, since a
// prefill that starts after a cached prefix runs other kernel shapes than a whole-prompt
// prefill, and bf16 rounding differs between the two. The local GPU prefix cache is then reset,
// so pass 2 finds nothing locally and must load every prompt block past it from the store
// (store -> pinned host -> device): it reports those tokens as cached from the store and its
// greedy tokens equal pass 1b's bit for bit. Pass 3 (local hits on the blocks pass 2 loaded)
// must equal pass 2 too. Free KV blocks return to their baseline after every pass.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "engine/cuda/cuda_model.h"
#include "engine/kv/kv_connector.h"
#include "engine/model/model_config.h"
#include "engine/sched/llm_engine.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_common.h"
#include "services/kvstore/kvstore_connector.h"
#include "tests/util/inprocess_kvstore.h"
#include "tests/util/test_paths.h"

namespace sluice::cuda_runner {
namespace {

constexpr int64_t kBlock = 16;
constexpr int kMaxTokens = 12;

CudaRunnerOptions KvstoreRunnerOptions() {
  CudaRunnerOptions o;
  o.block_size = kBlock;
  o.max_model_len = 512;
  o.max_num_tokens = 512;
  o.max_num_seqs = 64;
  o.graph_batch_sizes = {1, 2, 4, 8, 16, 32, 64};
  o.autotune_gemms = false;  // one runner, but keep the plans independent of timing
  return o;
}

// Prompts of 40 .. 139 tokens (2 .. 8 full blocks), distinct from the first token on.
std::vector<std::vector<int32_t>> Prompts(int n, int32_t vocab) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    for (int t = 0; t < 40 + 9 * i; ++t) p.push_back(1 + (t * 131 + i * 977 + 7) % (vocab - 1));
    out.push_back(std::move(p));
  }
  return out;
}

struct Pass {
  std::map<std::string, std::vector<int32_t>> tokens;  // by prompt index
  std::map<std::string, int32_t> cached;               // num_cached_tokens by prompt index
};

// RunPass runs the prompts one after the other (greedy, ignore_eos) under ids "<tag>-<i>".
// One at a time, so every pass runs each request through the same batch shapes (batch 1): the
// GEMM kernels the runner picks depend on the batch, and the passes must differ only in where
// the prompt's KV came from.
Pass RunPass(LLMEngine& engine, AsyncKvConnector& connector,
             const std::vector<std::vector<int32_t>>& prompts, const std::string& tag) {
  Pass pass;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string key = std::to_string(i);
    EngineRequest r;
    r.request_id = tag + "-" + key;
    r.prompt_token_ids = prompts[i];
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = kMaxTokens;
    r.sampling.ignore_eos = true;
    EXPECT_TRUE(engine.AddRequest(std::move(r)).ok());
    for (int step = 0; step < 1000 && engine.HasUnfinishedRequests(); ++step) {
      // A request parked on a store load leaves no step work: wait for the load, not a spin.
      if (!engine.HasStepWork()) {
        EXPECT_TRUE(connector.WaitIdle(absl::Now() + absl::Seconds(30)));
      }
      for (RequestOutput& out : engine.Step()) {
        EXPECT_TRUE(out.status.ok()) << out.request_id << ": " << out.status;
        for (const SampledToken& t : out.new_tokens) pass.tokens[key].push_back(t.token_id);
        if (out.finished()) pass.cached[key] = out.num_cached_tokens;
      }
    }
    EXPECT_FALSE(engine.HasUnfinishedRequests()) << tag << "-" << key;
    EXPECT_TRUE(connector.WaitIdle(absl::Now() + absl::Seconds(30)));  // write-through done
  }
  EXPECT_EQ(engine.num_free_blocks(), engine.num_total_blocks()) << tag;
  return pass;
}

class CudaKvstoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  }
  std::string Dir() const {
    return GetParam() == "sluice-mini-moe" ? testing::SharedModelDir(GetParam())
                                           : testing::FixtureDir(GetParam());
  }
};

TEST_P(CudaKvstoreTest, SecondPassLoadsEvictedBlocksFromTheStore) {
  const std::string dir = Dir();
  auto config = ModelConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  testing::InProcessKvStore shard(256LL << 20, 16LL << 20, /*with_ucx=*/true);
  ASSERT_TRUE(shard.status().ok()) << shard.status();
  kvstore::KvStoreClientOptions client;
  client.shards = {shard.address()};
  kvstore::KvStoreTransportOptions transport;
  transport.buffer_bytes = 256LL << 20;  // every batch fits: nothing falls back to gRPC
  auto backend = kvstore::KvStoreBlockBackend::Create(client, transport);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const kvstore::KvStoreBlockBackend* store_backend = backend->get();
  auto owned = std::make_shared<AsyncKvConnector>(*std::move(backend), AsyncKvConnectorOptions{});
  AsyncKvConnector* async = owned.get();
  const std::shared_ptr<KvConnector> connector = owned;

  auto model = LoadCudaModel(dir, KvstoreRunnerOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions options;
  options.block_size = kBlock;
  options.num_kv_blocks = 256;
  options.allocate_host_kv_cache = false;
  options.max_model_len = 512;
  options.max_num_seqs = 64;
  options.model_id = "cuda-kvstore-test";
  options.kv_connector = connector;
  auto engine = LLMEngine::Create(*std::move(model), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_NE((*engine)->kv_identity().find(";dtype=bf16;"), std::string::npos);

  const std::vector<std::vector<int32_t>> prompts =
      Prompts(12, static_cast<int32_t>(config->vocab_size));
  int64_t want_saved = 0, want_loaded_tokens = 0;
  for (const auto& p : prompts) {
    // Computed tokens: the prompt and every output but the last.
    want_saved += (static_cast<int64_t>(p.size()) + kMaxTokens - 1) / kBlock;
    want_loaded_tokens += (static_cast<int64_t>(p.size()) - 1) / kBlock * kBlock;
  }

  const Pass first = RunPass(**engine, *async, prompts, "p1");
  EXPECT_EQ(first.tokens.size(), prompts.size());
  EngineCounters c = (*engine)->counters();
  EXPECT_EQ(c.num_prompt_tokens_cached, 0);
  EXPECT_EQ(c.kv_connector.num_saved_blocks, want_saved);
  EXPECT_EQ(c.kv_connector.num_save_failed_blocks, 0);
  EXPECT_EQ(c.kv_connector.num_save_dropped_blocks, 0);
  EXPECT_EQ(c.num_kv_connector_copy_errors, 0);

  // The same prompts on local prefix hits: the shapes pass 2 runs, with KV this runner computed.
  const Pass local = RunPass(**engine, *async, prompts, "p1b");
  c = (*engine)->counters();
  EXPECT_EQ(c.num_prompt_tokens_cached, want_loaded_tokens);
  EXPECT_EQ(c.num_prompt_tokens_cached_external, 0);

  // Evict the local GPU cache: every prompt block past it now comes from the store.
  (*engine)->ResetPrefixCache();
  const Pass second = RunPass(**engine, *async, prompts, "p2");
  c = (*engine)->counters();
  EXPECT_EQ(c.num_prompt_tokens_cached_external, want_loaded_tokens);
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, want_loaded_tokens / kBlock);
  EXPECT_EQ(c.kv_connector.num_load_errors, 0);
  EXPECT_EQ(c.num_kv_connector_copy_errors, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string key = std::to_string(i);
    EXPECT_EQ(second.cached.at(key),
              (static_cast<int32_t>(prompts[i].size()) - 1) / kBlock * kBlock) << key;
    EXPECT_EQ(local.cached.at(key), second.cached.at(key)) << key;
    EXPECT_EQ(second.tokens.at(key), local.tokens.at(key)) << "prompt " << key;
  }

  // The loaded blocks are local prefix-cache hits now: no load, the same tokens bit for bit.
  const Pass third = RunPass(**engine, *async, prompts, "p3");
  c = (*engine)->counters();
  EXPECT_EQ(c.num_prompt_tokens_cached_external, want_loaded_tokens);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string key = std::to_string(i);
    EXPECT_EQ(third.cached.at(key), second.cached.at(key)) << key;
    EXPECT_EQ(third.tokens.at(key), second.tokens.at(key)) << "prompt " << key;
  }
  // Every byte moved by UCX from and into the registered buffers.
  const int64_t block_bytes = KvBlockBytes((*engine)->model().kv_cache_spec(), kBlock, {},
                                           (*engine)->model().KvDtypeBytes());
  const kvstore::KvStoreBackendStats s = store_backend->stats();
  EXPECT_FALSE(s.inline_only);
  EXPECT_EQ(s.num_inline_puts + s.num_inline_gets, 0);
  EXPECT_EQ(s.pool.num_heap_fallbacks, 0);
  // Pass 1b may save blocks of its own where its greedy tokens differ from pass 1's.
  c = (*engine)->counters();
  EXPECT_EQ(c.kv_connector.num_loaded_blocks, want_loaded_tokens / kBlock);
  EXPECT_EQ(s.transfer.bytes_pushed, c.kv_connector.num_saved_blocks * block_bytes);
  EXPECT_EQ(s.transfer.bytes_pulled, want_loaded_tokens / kBlock * block_bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaKvstoreTest,
                         ::testing::Values("llama-tiny", "qwen3-hybrid-tiny", "deepseek-v3-tiny",
                                           "sluice-mini-moe"));

}  // namespace
}  // namespace sluice::cuda_runner
