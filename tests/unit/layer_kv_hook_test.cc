// The engine's per-layer KV completion hook for layer-by-layer push (EngineRequest::
// kv_layer_observer, ForwardInput::on_layer_kv_written): in the step with a held request's last
// prompt chunk the observer gets the prompt's blocks once, then every layer in order, each at a
// moment its K/V of every prompt token already hold their final values; other steps and other
// requests never call it. Real CPU models (llama-tiny, deepseek-v3-tiny: dummy weights) report
// during the forward; a model without the hook (the fake ChecksumModel) after it.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/kv/kv_block_allocator.h"
#include "engine/model/dummy_weights.h"
#include "engine/sched/llm_engine.h"
#include "tests/util/fake_models.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

constexpr int64_t kBlockSize = 4;

// Records the calls and, at each layer, a copy of that layer's K/V in the prompt's blocks.
class RecordingObserver final : public KvLayerObserver {
 public:
  explicit RecordingObserver(LLMEngine* engine) : engine_(engine) {}
  void OnPromptBlocks(absl::Span<const int32_t> block_ids) override {
    ++num_prompt_block_calls;
    blocks.assign(block_ids.begin(), block_ids.end());
  }
  void OnLayerReady(int32_t layer, std::function<absl::Status()> wait) override {
    if (wait) EXPECT_TRUE(wait().ok());
    layers.push_back(layer);
    snapshots.push_back(LayerKv(*engine_, layer, blocks));
  }

  // The K then V floats of `layer` in `block_ids`, in order.
  static std::vector<float> LayerKv(LLMEngine& engine, int32_t layer,
                                    const std::vector<int32_t>& block_ids) {
    KvCache& cache = engine.kv_cache();
    std::vector<float> out;
    for (const auto& [base, per_token] :
         {std::pair{cache.k(layer), cache.spec().k_floats_per_token},
          std::pair{cache.v(layer), cache.spec().v_floats_per_token}}) {
      const int64_t block_floats = per_token * cache.block_size();
      for (int32_t b : block_ids) {
        out.insert(out.end(), base + b * block_floats, base + (b + 1) * block_floats);
      }
    }
    return out;
  }

  int num_prompt_block_calls = 0;
  std::vector<int32_t> blocks;
  std::vector<int32_t> layers;
  std::vector<std::vector<float>> snapshots;

 private:
  LLMEngine* engine_;
};

std::unique_ptr<LLMEngine> MakeEngine(std::unique_ptr<Model> model) {
  EngineOptions options;
  options.block_size = kBlockSize;
  options.num_kv_blocks = 64;
  options.max_model_len = 128;
  options.max_num_batched_tokens = 16;  // a 37-token prompt takes three chunks
  auto engine = LLMEngine::Create(std::move(model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

EngineRequest Held(const std::string& id, int len, int vocab, int salt = 0) {
  EngineRequest r;
  r.request_id = id;
  for (int i = 0; i < len; ++i) {
    r.prompt_token_ids.push_back(3 + (i * 7 + 5 + salt * 11) % (vocab - 3));
  }
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 4;
  r.hold_kv_blocks = true;
  return r;
}

// Runs a held request with an observer beside a plain one; checks the observer's record.
void CheckObserved(std::unique_ptr<Model> model, bool hook_during_forward) {
  ASSERT_NE(model, nullptr);
  const int vocab = static_cast<int>(model->config().vocab_size);
  const int64_t num_layers = model->kv_cache_spec().num_layers;
  EXPECT_EQ(model->SupportsLayerKvHook(), hook_during_forward);
  std::unique_ptr<LLMEngine> engine = MakeEngine(std::move(model));
  ASSERT_NE(engine, nullptr);
  auto observer = std::make_shared<RecordingObserver>(engine.get());
  EngineRequest held = Held("held", 37, vocab);
  held.kv_layer_observer = observer;
  ASSERT_TRUE(engine->AddRequest(std::move(held)).ok());
  EngineRequest other = Held("other", 21, vocab, /*salt=*/1);  // no shared prefix
  other.hold_kv_blocks = false;
  ASSERT_TRUE(engine->AddRequest(std::move(other)).ok());

  std::vector<int32_t> held_blocks;
  int steps_before_final = 0;
  for (int i = 0; i < 100 && held_blocks.empty(); ++i) {
    if (observer->layers.empty()) ++steps_before_final;
    for (const RequestOutput& out : engine->Step()) {
      if (out.request_id == "held" && out.kv_held) held_blocks = out.held_block_ids;
    }
  }
  ASSERT_FALSE(held_blocks.empty());
  EXPECT_GE(steps_before_final, 3);  // the earlier chunks' steps reported nothing
  EXPECT_EQ(observer->num_prompt_block_calls, 1);
  const size_t prompt_blocks = static_cast<size_t>(NumBlocksFor(37, kBlockSize));
  EXPECT_EQ(observer->blocks, std::vector<int32_t>(held_blocks.begin(),
                                                   held_blocks.begin() + prompt_blocks));
  std::vector<int32_t> expected_layers;
  for (int32_t l = 0; l < num_layers; ++l) expected_layers.push_back(l);
  ASSERT_EQ(observer->layers, expected_layers);
  // Each layer's KV was already final when reported (later layers' compute did not touch it).
  for (int32_t l = 0; l < num_layers; ++l) {
    const std::vector<float> now = RecordingObserver::LayerKv(*engine, l, observer->blocks);
    EXPECT_EQ(observer->snapshots[l], now) << "layer " << l;
    bool any_nonzero = false;
    for (float f : now) any_nonzero = any_nonzero || f != 0.0f;
    EXPECT_TRUE(any_nonzero) << "layer " << l << " holds no KV";
  }
  // Later steps (the other request's decode) report nothing more.
  for (int i = 0; i < 10; ++i) engine->Step();
  EXPECT_EQ(observer->layers.size(), static_cast<size_t>(num_layers));
  EXPECT_EQ(observer->num_prompt_block_calls, 1);
}

TEST(LayerKvHookTest, LlamaReportsEveryLayerDuringTheLastChunk) {
  auto model = LoadDummyModel(testing::FixtureDir("llama-tiny"), 3);
  ASSERT_TRUE(model.ok()) << model.status();
  CheckObserved(*std::move(model), /*hook_during_forward=*/true);
}

TEST(LayerKvHookTest, DeepseekReportsEveryLayerDuringTheLastChunk) {
  auto model = LoadDummyModel(testing::FixtureDir("deepseek-v3-tiny"), 3);
  ASSERT_TRUE(model.ok()) << model.status();
  CheckObserved(*std::move(model), /*hook_during_forward=*/true);
}

TEST(LayerKvHookTest, ModelWithoutTheHookReportsAfterTheForward) {
  CheckObserved(std::make_unique<testing::ChecksumModel>(), /*hook_during_forward=*/false);
}

// The hook runs between the layers of the forward: when layer l is reported, layer l + 1's KV
// of the new tokens is not written yet.
TEST(LayerKvHookTest, LayerIsReportedBeforeTheNextLayerIsWritten) {
  auto loaded = LoadDummyModel(testing::FixtureDir("llama-tiny"), 3);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::unique_ptr<LLMEngine> engine = MakeEngine(*std::move(loaded));
  ASSERT_NE(engine, nullptr);
  const int vocab = static_cast<int>(engine->model().config().vocab_size);
  class NextLayerEmpty final : public KvLayerObserver {
   public:
    explicit NextLayerEmpty(LLMEngine* e) : engine_(e) {}
    void OnPromptBlocks(absl::Span<const int32_t> ids) override { blocks_.assign(ids.begin(), ids.end()); }
    void OnLayerReady(int32_t layer, std::function<absl::Status()>) override {
      const int64_t layers = engine_->kv_cache().spec().num_layers;
      if (layer + 1 >= layers) return;
      for (float f : RecordingObserver::LayerKv(*engine_, layer + 1, blocks_)) {
        if (f != 0.0f) ++next_layer_written;
      }
      ++checked;
    }
    int checked = 0;
    int next_layer_written = 0;

   private:
    LLMEngine* engine_;
    std::vector<int32_t> blocks_;
  };
  auto observer = std::make_shared<NextLayerEmpty>(engine.get());
  EngineRequest held = Held("held", 9, vocab);  // one chunk: the cache starts all zero
  held.kv_layer_observer = observer;
  ASSERT_TRUE(engine->AddRequest(std::move(held)).ok());
  for (int i = 0; i < 5; ++i) engine->Step();
  EXPECT_EQ(observer->checked, engine->kv_cache().spec().num_layers - 1);
  EXPECT_EQ(observer->next_layer_written, 0);
}

}  // namespace
}  // namespace sluice
