// Golden tests of the Llama / Qwen3 CPU models against transformers float32 reference logits
// (shared/fixtures/README.md, shared/models/README.md): logits at every prompt position, argmax
// at every position, and the greedy continuation decoded one token at a time through the paged
// KV cache — with whole-prompt prefill (block_size 16), with chunked prefill (7 tokens per
// chunk over the cached prefix, block_size 4), and with several prompts batched in one Forward.
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "engine/model/model.h"
#include "tests/util/golden_runner.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using ::sluice::testing::CompareToGolden;
using ::sluice::testing::GoldenCase;
using ::sluice::testing::GoldenRun;
using ::sluice::testing::GoldenRunOptions;

struct GoldenModel {
  std::string name;
  bool is_fixture;        // shared/fixtures (random weights) vs shared/models (trained)
  int64_t greedy_tokens;  // length of greedy_<i>
  float tolerance;        // max |Δlogit|
};

std::string ModelDir(const GoldenModel& m) {
  return m.is_fixture ? sluice::testing::FixtureDir(m.name)
                      : sluice::testing::SharedModelDir(m.name);
}

// Loaded models and golden cases, shared by the tests of one binary run.
struct Loaded {
  std::unique_ptr<Model> model;
  std::vector<GoldenCase> cases;
};

Loaded* GetLoaded(const GoldenModel& m) {
  static auto* cache = new std::map<std::string, std::unique_ptr<Loaded>>();
  auto it = cache->find(m.name);
  if (it != cache->end()) return it->second.get();
  const std::string dir = ModelDir(m);
  auto model = LoadModel(dir);
  EXPECT_TRUE(model.ok()) << model.status();
  auto cases = sluice::testing::LoadGoldenCases(dir + "/golden.safetensors");
  EXPECT_TRUE(cases.ok()) << cases.status();
  if (!model.ok() || !cases.ok()) return nullptr;
  auto loaded = std::make_unique<Loaded>();
  loaded->model = std::move(*model);
  loaded->cases = std::move(*cases);
  Loaded* ptr = loaded.get();
  (*cache)[m.name] = std::move(loaded);
  return ptr;
}

class ModelGoldenTest : public ::testing::TestWithParam<GoldenModel> {
 protected:
  // Runs every golden prompt alone with `options` and checks logits, argmax and greedy tokens.
  // Returns the runs for further comparison.
  std::vector<GoldenRun> RunAllAndCheck(const GoldenRunOptions& options, const char* label) {
    const GoldenModel& m = GetParam();
    Loaded* loaded = GetLoaded(m);
    if (loaded == nullptr) {
      ADD_FAILURE() << "could not load " << m.name;
      return {};
    }
    EXPECT_EQ(loaded->cases.size(), 4u);
    const int64_t V = loaded->model->config().vocab_size;
    std::vector<GoldenRun> runs;
    float worst = 0;
    for (size_t i = 0; i < loaded->cases.size(); ++i) {
      const GoldenCase& c = loaded->cases[i];
      EXPECT_EQ(static_cast<int64_t>(c.greedy.size()), m.greedy_tokens);
      GoldenRunOptions opt = options;
      opt.num_new_tokens = static_cast<int64_t>(c.greedy.size());
      auto run = sluice::testing::RunGreedy(*loaded->model, c.input_ids, opt);
      EXPECT_TRUE(run.ok()) << run.status();
      if (!run.ok()) return {};
      auto cmp = CompareToGolden(*run, c, V);
      EXPECT_LE(cmp.max_abs_diff, m.tolerance) << m.name << " prompt " << i << " (" << label << ")";
      EXPECT_EQ(cmp.argmax_mismatches, 0) << m.name << " prompt " << i << " (" << label << ")";
      EXPECT_EQ(run->greedy, c.greedy) << m.name << " prompt " << i << " (" << label
                                       << "), first mismatch at " << cmp.first_greedy_mismatch;
      std::cout << "[golden] " << m.name << " " << label << " prompt " << i << " T="
                << c.input_ids.size() << " max|dlogit|=" << cmp.max_abs_diff << "\n";
      worst = std::max(worst, cmp.max_abs_diff);
      runs.push_back(std::move(*run));
    }
    RecordProperty(std::string("max_abs_dlogit_") + label, std::to_string(worst));
    return runs;
  }
};

TEST_P(ModelGoldenTest, WholePromptPrefillBlockSize16) {
  GoldenRunOptions opt;
  opt.block_size = 16;
  RunAllAndCheck(opt, "block16");
}

TEST_P(ModelGoldenTest, ChunkedPrefillBlockSize4IsBitwiseEqualToWholePrompt) {
  GoldenRunOptions whole;
  whole.block_size = 16;
  GoldenRunOptions chunked;
  chunked.block_size = 4;
  chunked.prefill_chunk = 7;
  std::vector<GoldenRun> a = RunAllAndCheck(whole, "block16");
  std::vector<GoldenRun> b = RunAllAndCheck(chunked, "block4_chunk7");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    // Batch-invariant kernels: chunking the prompt changes no bit of any logit.
    EXPECT_TRUE(a[i].logits == b[i].logits) << GetParam().name << " prompt " << i;
    EXPECT_EQ(a[i].greedy, b[i].greedy);
  }
}

TEST_P(ModelGoldenTest, BatchedPromptsMatchSingleRuns) {
  const GoldenModel& m = GetParam();
  Loaded* loaded = GetLoaded(m);
  ASSERT_NE(loaded, nullptr);
  ASSERT_GE(loaded->cases.size(), 4u);
  const int64_t V = loaded->model->config().vocab_size;
  // Three prompts of different lengths in the same Forward calls: with chunk 7 the short one
  // finishes prefill first and decodes while the others still prefill (mixed steps).
  const std::vector<size_t> picked = {1, 0, 3};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i : picked) prompts.push_back(loaded->cases[i].input_ids);
  GoldenRunOptions opt;
  opt.block_size = 4;
  opt.prefill_chunk = 7;
  opt.num_new_tokens = m.greedy_tokens;
  auto batched = sluice::testing::RunGreedyBatch(*loaded->model, prompts, opt);
  ASSERT_TRUE(batched.ok()) << batched.status();
  ASSERT_EQ(batched->size(), picked.size());
  for (size_t j = 0; j < picked.size(); ++j) {
    const GoldenCase& c = loaded->cases[picked[j]];
    auto cmp = CompareToGolden((*batched)[j], c, V);
    EXPECT_LE(cmp.max_abs_diff, m.tolerance) << m.name << " prompt " << picked[j];
    EXPECT_EQ(cmp.argmax_mismatches, 0);
    EXPECT_EQ((*batched)[j].greedy, c.greedy) << m.name << " prompt " << picked[j];
    auto single = sluice::testing::RunGreedy(*loaded->model, c.input_ids, opt);
    ASSERT_TRUE(single.ok()) << single.status();
    // Batch invariance: a sequence's logits do not depend on what it is batched with.
    EXPECT_TRUE(single->logits == (*batched)[j].logits) << m.name << " prompt " << picked[j];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelGoldenTest,
    ::testing::Values(GoldenModel{"llama-tiny", true, 32, 1e-4f},
                      GoldenModel{"qwen3-hybrid-tiny", true, 32, 1e-4f},
                      GoldenModel{"sluice-mini-draft", false, 64, 5e-4f},
                      GoldenModel{"sluice-mini-swa", false, 64, 5e-4f}),
    [](const ::testing::TestParamInfo<GoldenModel>& info) {
      std::string name = info.param.name;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

}  // namespace
}  // namespace sluice
