// Golden tests of the Llama / Qwen3 CPU models against transformers float32 reference logits
// (shared/fixtures/README.md, shared/models/README.md): logits at every prompt position, argmax
// at every position, and the greedy continuation decoded one token at a time through the paged
// KV cache — with whole-prompt prefill (block_size 16), with chunked prefill (7 tokens per
// chunk over the cached prefix, block_size 4), and with several prompts batched in one Forward.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "tests/util/golden_suite.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

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

class ModelGoldenTest : public ::testing::TestWithParam<GoldenModel> {
 protected:
  sluice::testing::GoldenExpectations Expect() const {
    return {GetParam().name, GetParam().greedy_tokens, GetParam().tolerance};
  }
};

TEST_P(ModelGoldenTest, WholePromptPrefillBlockSize16) {
  GoldenRunOptions opt;
  opt.block_size = 16;
  sluice::testing::CheckGoldenCases(ModelDir(GetParam()), Expect(), opt, "block16");
}

TEST_P(ModelGoldenTest, ChunkedPrefillBlockSize4IsBitwiseEqualToWholePrompt) {
  sluice::testing::CheckChunkedPrefillIsBitwiseWhole(ModelDir(GetParam()), Expect());
}

TEST_P(ModelGoldenTest, BatchedPromptsMatchSingleRuns) {
  // Three prompts of different lengths in the same Forward calls: with chunk 7 the short one
  // finishes prefill first and decodes while the others still prefill (mixed steps).
  GoldenRunOptions opt;
  opt.block_size = 4;
  opt.prefill_chunk = 7;
  sluice::testing::CheckBatchedMatchesGolden(ModelDir(GetParam()), Expect(), {1, 0, 3}, opt, opt);
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
