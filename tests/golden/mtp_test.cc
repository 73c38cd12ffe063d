// MTP drafting (engine/spec/mtp_drafter.h, Model::ForwardMtp) on tests/fixtures/
// deepseek-v3-tiny-mtp: the module's logits against the numpy reference of the same math
// (make_deepseek_v3_mtp.py), the target's exposed hidden states, loading with and without MTP
// weights, and greedy decoding with MTP speculation equal to greedy decoding without it.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "engine/model/model.h"
#include "engine/model/safetensors.h"
#include "engine/sched/llm_engine.h"
#include "engine/spec/mtp_drafter.h"
#include "engine/spec/speculative.h"
#include "nlohmann/json.hpp"
#include "tests/util/fake_models.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

constexpr int64_t kVocab = 8192;
constexpr int64_t kHidden = 64;
// As the deepseek-v3-tiny golden test: every logit within 1e-4 of the reference.
constexpr float kLogitTolerance = 1e-4f;

std::string MtpDir() { return testing::RepoFixtureDir("deepseek-v3-tiny-mtp"); }

std::unique_ptr<Model> Load(const std::string& dir) {
  auto model = LoadModel(dir);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

template <typename File>
std::vector<float> Floats(const File& ckpt, const std::string& name) {
  const TensorView* view = ckpt.Find(name);
  EXPECT_NE(view, nullptr) << name;
  if (view == nullptr) return {};
  auto v = ToFloat32(*view);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : std::vector<float>{};
}

template <typename File>
std::vector<int32_t> Ints(const File& ckpt, const std::string& name) {
  const TensorView* view = ckpt.Find(name);
  EXPECT_NE(view, nullptr) << name;
  if (view == nullptr) return {};
  auto v = ToInt64(*view);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? std::vector<int32_t>(v->begin(), v->end()) : std::vector<int32_t>{};
}

// One sequence's positions [begin, end) planned over `block_table` (blocks of `bs` tokens).
ForwardInput Chunk(const std::vector<int32_t>& next_tokens, int32_t begin, int32_t end,
                   const std::vector<int32_t>& block_table, int64_t bs) {
  ForwardInput in;
  SequenceSlice slice;
  slice.query_start = 0;
  slice.num_context_tokens = begin;
  slice.num_query_tokens = end - begin;
  slice.block_table = absl::MakeConstSpan(block_table);
  for (int32_t p = begin; p < end; ++p) {
    in.token_ids.push_back(next_tokens[p]);
    in.positions.push_back(p);
    in.slot_mapping.push_back(block_table[p / bs] * bs + p % bs);
    in.logits_indices.push_back(p - begin);
  }
  in.sequences.push_back(slice);
  return in;
}

TEST(MtpModelTest, LogitsMatchTheNumpyReferenceInOneChunkAndInPagedChunks) {
  std::unique_ptr<Model> model = Load(MtpDir());
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->MtpStatus().ok()) << model->MtpStatus();
  auto ref = SafetensorsFile::Open(MtpDir() + "/mtp_reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  const std::vector<int32_t> tokens = Ints(**ref, "tokens");
  const std::vector<float> previous = Floats(**ref, "previous_hidden");
  const std::vector<float> want_logits = Floats(**ref, "logits");
  const std::vector<float> want_hidden = Floats(**ref, "hidden_out");
  const int32_t T = static_cast<int32_t>(tokens.size()) - 1;
  ASSERT_EQ(T, 12);
  const std::vector<int32_t> next(tokens.begin() + 1, tokens.end());

  const KvCacheSpec spec = model->mtp_kv_cache_spec();
  EXPECT_EQ(spec.num_layers, 1);
  EXPECT_EQ(spec.k_floats_per_token, 32 + 8);  // kv_lora_rank + qk_rope_head_dim
  // Whole sequence at once, then as chunks [0, 5) and [5, 12) over scattered blocks of 4.
  const std::vector<std::pair<int32_t, int32_t>> one = {{0, T}};
  const std::vector<std::pair<int32_t, int32_t>> two = {{0, 5}, {5, T}};
  for (const auto* chunks : {&one, &two}) {
    const int64_t bs = chunks == &one ? 16 : 4;
    const std::vector<int32_t> blocks = chunks == &one ? std::vector<int32_t>{0}
                                                       : std::vector<int32_t>{5, 1, 3};
    KvCache kv(spec, 8, bs);
    float max_diff = 0.0f, max_hidden_diff = 0.0f;
    for (const auto& [begin, end] : *chunks) {
      const ForwardInput in = Chunk(next, begin, end, blocks, bs);
      std::vector<float> logits((end - begin) * kVocab), hidden((end - begin) * kHidden);
      ASSERT_TRUE(model
                      ->ForwardMtp(in,
                                   absl::MakeConstSpan(previous).subspan(begin * kHidden,
                                                                         (end - begin) * kHidden),
                                   kv, absl::MakeSpan(logits), absl::MakeSpan(hidden))
                      .ok());
      for (int64_t i = 0; i < (end - begin) * kVocab; ++i) {
        max_diff = std::max(max_diff, std::abs(logits[i] - want_logits[begin * kVocab + i]));
      }
      for (int64_t i = 0; i < (end - begin) * kHidden; ++i) {
        max_hidden_diff =
            std::max(max_hidden_diff, std::abs(hidden[i] - want_hidden[begin * kHidden + i]));
      }
    }
    EXPECT_LT(max_diff, kLogitTolerance) << "block size " << bs;
    EXPECT_LT(max_hidden_diff, kLogitTolerance) << "block size " << bs;
  }
}

TEST(MtpModelTest, ForwardMtpRejectsMismatchedHiddenRows) {
  std::unique_ptr<Model> model = Load(MtpDir());
  ASSERT_NE(model, nullptr);
  KvCache kv(model->mtp_kv_cache_spec(), 4, 16);
  const std::vector<int32_t> blocks = {0};  // the plan's spans point here
  const ForwardInput in = Chunk({5, 6, 7}, 0, 3, blocks, 16);
  std::vector<float> previous(2 * kHidden), logits(3 * kVocab), hidden(3 * kHidden);
  const absl::Status st = model->ForwardMtp(in, previous, kv, absl::MakeSpan(logits),
                                            absl::MakeSpan(hidden));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  // The target's own cache layout (3 layers) is not the module's.
  KvCache target_kv(model->kv_cache_spec(), 4, 16);
  previous.resize(3 * kHidden);
  EXPECT_EQ(model->ForwardMtp(in, previous, target_kv, absl::MakeSpan(logits),
                              absl::MakeSpan(hidden)).code(),
            absl::StatusCode::kInvalidArgument);
}

// final_hidden_states is what the final norm and lm_head turn into the logits.
TEST(MtpModelTest, FinalHiddenStatesAreTheLastLayerOutputBeforeTheFinalNorm) {
  std::unique_ptr<Model> model = Load(MtpDir());
  ASSERT_NE(model, nullptr);
  EXPECT_TRUE(model->final_hidden_states().empty());
  auto ckpt = Checkpoint::Open(MtpDir());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const std::vector<float> norm = Floats(**ckpt, "model.norm.weight");
  const std::vector<float> head = Floats(**ckpt, "lm_head.weight");
  const std::vector<int32_t> prompt = {0, 616, 24, 33, 24};
  KvCache kv(model->kv_cache_spec(), 4, 16);
  const std::vector<int32_t> blocks = {2};
  ForwardInput in = Chunk(prompt, 0, 5, blocks, 16);
  std::vector<float> logits(5 * kVocab);
  ASSERT_TRUE(model->Forward(in, kv, absl::MakeSpan(logits)).ok());
  const absl::Span<const float> hidden = model->final_hidden_states();
  ASSERT_EQ(hidden.size(), 5u * kHidden);
  float max_diff = 0.0f;
  for (int t = 0; t < 5; ++t) {
    double ss = 0.0;
    for (int64_t d = 0; d < kHidden; ++d) ss += double(hidden[t * kHidden + d]) * hidden[t * kHidden + d];
    const double inv = 1.0 / std::sqrt(ss / kHidden + 1e-6);
    for (int64_t v = 0; v < kVocab; v += 97) {
      double dot = 0.0;
      for (int64_t d = 0; d < kHidden; ++d) {
        dot += hidden[t * kHidden + d] * inv * norm[d] * head[v * kHidden + d];
      }
      max_diff = std::max(max_diff, static_cast<float>(std::abs(dot - logits[t * kVocab + v])));
    }
  }
  EXPECT_LT(max_diff, 1e-4f);
}

TEST(MtpModelTest, DeclaredButAbsentMtpWeightsLoadTheTargetAndNameTheMissingTensors) {
  // The shared fixture declares num_nextn_predict_layers = 1 and holds no MTP weights.
  std::unique_ptr<Model> model = Load(testing::FixtureDir("deepseek-v3-tiny"));
  ASSERT_NE(model, nullptr);
  const absl::Status st = model->MtpStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("model.layers.3.eh_proj.weight"), std::string::npos) << st;
  EXPECT_EQ(model->mtp_kv_cache_spec().num_layers, 0);
  auto drafter = MtpDrafter::Create(model.get(), MtpOptions{16, 8});
  EXPECT_EQ(drafter.status().code(), absl::StatusCode::kNotFound);
  // Architectures without MTP say so.
  std::unique_ptr<Model> llama = Load(testing::FixtureDir("llama-tiny"));
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(MtpDrafter::Create(llama.get(), MtpOptions{16, 8}).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(MtpModelTest, MtpWeightsPresentInPartAreALoadError) {
  // The fixture's index without one MTP tensor (its shards linked from the fixture).
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("mtp_partial_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* name : {"config.json", "model.safetensors", "mtp.safetensors"}) {
    fs::remove(dir / name);
    fs::create_symlink(fs::canonical(fs::path(MtpDir()) / name), dir / name);
  }
  std::ifstream in(MtpDir() + "/model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(in);
  index["weight_map"].erase("model.layers.3.hnorm.weight");
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  auto model = LoadModel(dir.string());
  fs::remove_all(dir);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(model.status().message().find("model.layers.3.hnorm.weight"), std::string::npos)
      << model.status();
}

TEST(MtpDrafterTest, PendingHiddenStatesAreBoundedAndDraftsStillCome) {
  std::unique_ptr<Model> model = Load(MtpDir());
  ASSERT_NE(model, nullptr);
  MtpOptions options;
  options.num_kv_blocks = 8;
  options.max_pending_positions = 8;  // more than 8 pending: the oldest go, down to 6
  auto drafter = MtpDrafter::Create(model.get(), options);
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  const std::vector<float> row(kHidden, 0.5f);
  for (int32_t p = 0; p < 40; ++p) (*drafter)->ObserveHiddenStates("r", p, row);
  std::vector<int32_t> tokens(41);
  for (int32_t i = 0; i < 41; ++i) tokens[i] = 100 + i;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  DraftInput in;
  in.request_id = "r";
  in.token_ids = tokens;
  in.num_prompt_tokens = 41;
  in.sampling = &greedy;
  in.max_draft_tokens = 3;
  std::vector<DraftOutput> out;
  ASSERT_TRUE((*drafter)->Propose({in}, nullptr, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tokens.size(), 3u);
  EXPECT_GE((*drafter)->num_inexact_positions(), 40 - 8);
  EXPECT_LE((*drafter)->num_inexact_positions(), 40 - 6);
  (*drafter)->Release("r");
  EXPECT_EQ((*drafter)->num_free_blocks(), 8);
}

TEST(MtpDrafterTest, SampledDraftsCarryTheDistributionTheyWereDrawnFrom) {
  std::unique_ptr<Model> model = Load(MtpDir());
  ASSERT_NE(model, nullptr);
  MtpOptions options;
  options.num_kv_blocks = 8;
  auto drafter = MtpDrafter::Create(model.get(), options);
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  const std::vector<int32_t> tokens = {0, 616, 24, 33, 24, 7479};
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  DraftInput in;
  in.request_id = "s";
  in.token_ids = tokens;
  in.num_prompt_tokens = 5;
  in.sampling = &sampled;
  in.first_draft_key = SampleDrawKey{7, 0, 5};
  in.max_draft_tokens = 4;
  std::vector<DraftOutput> out;
  ASSERT_TRUE((*drafter)->Propose({in}, nullptr, &out).ok());
  ASSERT_EQ(out[0].tokens.size(), 4u);
  ASSERT_EQ(out[0].probs.size(), 4u);
  for (size_t j = 0; j < 4; ++j) {
    ASSERT_EQ(out[0].probs[j].size(), static_cast<size_t>(kVocab));
    double total = 0.0;
    for (float p : out[0].probs[j]) total += p;
    EXPECT_NEAR(total, 1.0, 1e-4);
    EXPECT_EQ(out[0].probs[j][out[0].tokens[j]], out[0].confidence[j]);
    EXPECT_GT(out[0].confidence[j], 0.0f);
  }
  // The same key draws the same drafts (the request's own stream, kDraftDraw).
  (*drafter)->Release("s");
  std::vector<DraftOutput> again;
  ASSERT_TRUE((*drafter)->Propose({in}, nullptr, &again).ok());
  EXPECT_EQ(again[0].tokens, out[0].tokens);
}

// --- The drafter in the engine ---

struct MtpRun {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, std::vector<float>> logprobs;
  EngineCounters counters;
};

MtpRun Generate(std::shared_ptr<MtpDrafter>* drafter_out, const std::vector<EngineRequest>& requests,
             bool speculate, VerifyMode mode = VerifyMode::kFixed, bool sequential = false) {
  std::unique_ptr<Model> model = Load(MtpDir());
  EngineOptions options;
  options.block_size = 16;
  options.num_kv_blocks = 128;
  options.max_num_batched_tokens = 64;  // the 150-token prompt runs in chunks
  if (speculate) {
    MtpOptions mtp;
    mtp.block_size = 16;
    mtp.num_kv_blocks = 128;
    mtp.model_id = "deepseek-v3-tiny-mtp";
    auto drafter = MtpDrafter::Create(model.get(), mtp);
    EXPECT_TRUE(drafter.ok()) << drafter.status();
    std::shared_ptr<MtpDrafter> shared(std::move(*drafter));
    if (drafter_out != nullptr) *drafter_out = shared;
    options.speculative.drafter = shared;
    options.speculative.verify = mode;
    options.speculative.num_speculative_tokens = 4;
    options.speculative.cost_clock = CostClock::kProcessCpu;
  }
  auto engine = LLMEngine::Create(std::move(model), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  MtpRun run;
  if (!engine.ok()) return run;
  auto drain = [&] {
    for (int steps = 0; (*engine)->HasUnfinishedRequests() && steps < 5000; ++steps) {
      for (const RequestOutput& out : (*engine)->Step()) {
        for (const SampledToken& t : out.new_tokens) {
          run.tokens[out.request_id].push_back(t.token_id);
          run.logprobs[out.request_id].push_back(t.logprob);
        }
      }
    }
  };
  for (const EngineRequest& r : requests) {
    EXPECT_TRUE((*engine)->AddRequest(r).ok());
    if (sequential) drain();
  }
  drain();
  run.counters = (*engine)->counters();
  return run;
}

std::vector<EngineRequest> GoldenRequests(int max_tokens) {
  auto golden = SafetensorsFile::Open(testing::FixtureDir("deepseek-v3-tiny") + "/golden.safetensors");
  EXPECT_TRUE(golden.ok()) << golden.status();
  std::vector<EngineRequest> requests;
  if (!golden.ok()) return requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(testing::GreedyRequest("g" + std::to_string(i),
                                              Ints(**golden, "input_ids_" + std::to_string(i)),
                                              max_tokens));
  }
  return requests;
}

TEST(MtpSpeculativeEngineTest, GreedyOutputEqualsNoSpeculationAndTheGoldenGreedyTokens) {
  auto golden = SafetensorsFile::Open(testing::FixtureDir("deepseek-v3-tiny") + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::vector<EngineRequest> requests = GoldenRequests(32);
  const MtpRun plain = Generate(nullptr, requests, false);
  for (VerifyMode mode : {VerifyMode::kFixed, VerifyMode::kAuto}) {
    SCOPED_TRACE(mode == VerifyMode::kFixed ? "fixed 4" : "auto");
    std::shared_ptr<MtpDrafter> drafter;
    const MtpRun spec = Generate(&drafter, requests, true, mode);
    for (int i = 0; i < 4; ++i) {
      const std::string id = "g" + std::to_string(i);
      EXPECT_EQ(spec.tokens.at(id), plain.tokens.at(id)) << id;
      EXPECT_EQ(spec.tokens.at(id), Ints(**golden, "greedy_" + std::to_string(i))) << id;
      ASSERT_EQ(spec.logprobs.at(id).size(), plain.logprobs.at(id).size());
      for (size_t t = 0; t < plain.logprobs.at(id).size(); ++t) {
        EXPECT_NEAR(spec.logprobs.at(id)[t], plain.logprobs.at(id)[t], 1e-4) << id << " " << t;
      }
    }
    // The fixture's module predicts the golden continuations well but not perfectly: drafts
    // are accepted and rejected, so both verification outcomes were exercised.
    EXPECT_GT(spec.counters.num_spec_accepted_tokens, 0);
    EXPECT_LT(spec.counters.num_spec_accepted_tokens, spec.counters.num_spec_draft_tokens);
    if (mode == VerifyMode::kFixed) {
      EXPECT_GT(spec.counters.num_spec_accepted_tokens * 2, spec.counters.num_spec_draft_tokens)
          << "accepted " << spec.counters.num_spec_accepted_tokens << " of "
          << spec.counters.num_spec_draft_tokens;
    }
    EXPECT_EQ(drafter->num_inexact_positions(), 0);  // every hidden state was handed over
    EXPECT_EQ(drafter->num_sequences(), 0);          // released at finish
    EXPECT_EQ(drafter->num_free_blocks(), drafter->num_total_blocks());  // none leaked
  }
}

TEST(MtpSpeculativeEngineTest, ARepeatedPromptReusesTheModulesPrefixCache) {
  std::vector<EngineRequest> requests = GoldenRequests(16);
  const EngineRequest first = requests[3];  // 150 tokens: 9 full blocks
  EngineRequest again = first;
  again.request_id = "again";
  const std::vector<EngineRequest> both = {first, again};
  const MtpRun plain = Generate(nullptr, both, false, VerifyMode::kFixed, /*sequential=*/true);
  std::shared_ptr<MtpDrafter> drafter;
  const MtpRun spec = Generate(&drafter, both, true, VerifyMode::kFixed, /*sequential=*/true);
  EXPECT_EQ(spec.tokens.at("g3"), plain.tokens.at("g3"));
  EXPECT_EQ(spec.tokens.at("again"), plain.tokens.at("again"));
  EXPECT_EQ(spec.tokens.at("again"), spec.tokens.at("g3"));
  // The target's prefix cache served the second prompt's first 9 blocks; the module's cache
  // held its entries for them, so no entry lacked the target's hidden state.
  EXPECT_GE(spec.counters.num_prefix_cache_hit_blocks, 9);
  EXPECT_GE(drafter->prefix_cache_stats().num_hit_blocks, 9);
  EXPECT_EQ(drafter->num_inexact_positions(), 0);
}

TEST(MtpSpeculativeEngineTest, WithoutTheTargetsHiddenStatesDraftsStillCompleteExactly) {
  // The module's prefix cache off while the target's is on: the second request's cached target
  // positions have no hidden state here, so their entries are computed from zeros. Only the
  // acceptance may suffer; the output stays the target's.
  std::vector<EngineRequest> requests = GoldenRequests(16);
  EngineRequest again = requests[2];
  again.request_id = "again";
  const std::vector<EngineRequest> both = {requests[2], again};
  std::unique_ptr<Model> model = Load(MtpDir());
  MtpOptions mtp;
  mtp.block_size = 16;
  mtp.num_kv_blocks = 64;
  mtp.enable_prefix_caching = false;
  auto drafter = MtpDrafter::Create(model.get(), mtp);
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  std::shared_ptr<MtpDrafter> shared(std::move(*drafter));
  EngineOptions options;
  options.block_size = 16;
  options.num_kv_blocks = 64;
  options.speculative.drafter = shared;
  options.speculative.verify = VerifyMode::kFixed;
  options.speculative.num_speculative_tokens = 3;
  auto engine = LLMEngine::Create(std::move(model), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::map<std::string, std::vector<int32_t>> tokens;
  for (const EngineRequest& r : both) {
    ASSERT_TRUE((*engine)->AddRequest(r).ok());
    for (int steps = 0; (*engine)->HasUnfinishedRequests() && steps < 1000; ++steps) {
      for (const RequestOutput& out : (*engine)->Step()) {
        for (const SampledToken& t : out.new_tokens) tokens[out.request_id].push_back(t.token_id);
      }
    }
  }
  const MtpRun plain = Generate(nullptr, {requests[2]}, false);
  EXPECT_EQ(tokens.at("g2"), plain.tokens.at("g2"));
  EXPECT_EQ(tokens.at("again"), plain.tokens.at("g2"));
  EXPECT_EQ(shared->num_inexact_positions(), 48);  // the 3 cached blocks of the 64-token prompt
}

}  // namespace
}  // namespace sluice
