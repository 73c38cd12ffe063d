#include "tests/util/golden_suite.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <utility>

#include <gtest/gtest.h>

namespace sluice::testing {

GoldenModelCases* LoadGoldenModelCases(const std::string& dir) {
  static auto* cache = new std::map<std::string, std::unique_ptr<GoldenModelCases>>();
  auto it = cache->find(dir);
  if (it != cache->end()) return it->second.get();
  auto model = LoadModel(dir);
  EXPECT_TRUE(model.ok()) << model.status();
  auto cases = LoadGoldenCases(dir + "/golden.safetensors");
  EXPECT_TRUE(cases.ok()) << cases.status();
  if (!model.ok() || !cases.ok()) return nullptr;
  auto loaded = std::make_unique<GoldenModelCases>();
  loaded->model = *std::move(model);
  loaded->cases = *std::move(cases);
  GoldenModelCases* ptr = loaded.get();
  (*cache)[dir] = std::move(loaded);
  return ptr;
}

std::vector<GoldenRun> CheckGoldenCases(const std::string& dir, const GoldenExpectations& expect,
                                        const GoldenRunOptions& options, const std::string& mode) {
  GoldenModelCases* found = LoadGoldenModelCases(dir);
  if (found == nullptr) {
    ADD_FAILURE() << "could not load " << expect.label;
    return {};
  }
  GoldenModelCases& loaded = *found;
  EXPECT_EQ(loaded.cases.size(), 4u);
  const int64_t V = loaded.model->config().vocab_size;
  std::vector<GoldenRun> runs;
  float worst = 0;
  for (size_t i = 0; i < loaded.cases.size(); ++i) {
    const GoldenCase& c = loaded.cases[i];
    EXPECT_EQ(static_cast<int64_t>(c.greedy.size()), expect.greedy_tokens);
    GoldenRunOptions opt = options;
    opt.num_new_tokens = static_cast<int64_t>(c.greedy.size());
    auto run = RunGreedy(*loaded.model, c.input_ids, opt);
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return {};
    const GoldenComparison cmp = CompareToGolden(*run, c, V);
    EXPECT_LE(cmp.max_abs_diff, expect.tolerance)
        << expect.label << " prompt " << i << " (" << mode << ")";
    EXPECT_EQ(cmp.argmax_mismatches, 0) << expect.label << " prompt " << i << " (" << mode << ")";
    EXPECT_EQ(run->greedy, c.greedy) << expect.label << " prompt " << i << " (" << mode
                                     << "), first mismatch at " << cmp.first_greedy_mismatch;
    std::cout << "[golden] " << expect.label << " " << mode << " prompt " << i
              << " T=" << c.input_ids.size() << " max|dlogit|=" << cmp.max_abs_diff << "\n";
    worst = std::max(worst, cmp.max_abs_diff);
    runs.push_back(*std::move(run));
  }
  ::testing::Test::RecordProperty("max_abs_dlogit_" + mode, std::to_string(worst));
  return runs;
}

void CheckChunkedPrefillIsBitwiseWhole(const std::string& dir, const GoldenExpectations& expect) {
  GoldenRunOptions whole;
  whole.block_size = 16;
  GoldenRunOptions chunked;
  chunked.block_size = 4;
  chunked.prefill_chunk = 7;
  const std::vector<GoldenRun> a = CheckGoldenCases(dir, expect, whole, "block16");
  const std::vector<GoldenRun> b = CheckGoldenCases(dir, expect, chunked, "block4_chunk7");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].logits == b[i].logits) << expect.label << " prompt " << i;
    EXPECT_EQ(a[i].greedy, b[i].greedy) << expect.label << " prompt " << i;
  }
}

void CheckBatchedMatchesGolden(const std::string& dir, const GoldenExpectations& expect,
                               const std::vector<size_t>& picked, GoldenRunOptions batched,
                               GoldenRunOptions alone) {
  GoldenModelCases* loaded = LoadGoldenModelCases(dir);
  ASSERT_NE(loaded, nullptr);
  const int64_t V = loaded->model->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i : picked) {
    ASSERT_LT(i, loaded->cases.size());
    prompts.push_back(loaded->cases[i].input_ids);
  }
  batched.num_new_tokens = expect.greedy_tokens;
  alone.num_new_tokens = expect.greedy_tokens;
  auto runs = RunGreedyBatch(*loaded->model, prompts, batched);
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), picked.size());
  for (size_t j = 0; j < picked.size(); ++j) {
    const GoldenCase& c = loaded->cases[picked[j]];
    const GoldenComparison cmp = CompareToGolden((*runs)[j], c, V);
    std::cout << "[golden] " << expect.label << " batched prompt " << picked[j]
              << " max|dlogit|=" << cmp.max_abs_diff << "\n";
    EXPECT_LE(cmp.max_abs_diff, expect.tolerance) << expect.label << " prompt " << picked[j];
    EXPECT_EQ(cmp.argmax_mismatches, 0) << expect.label << " prompt " << picked[j];
    EXPECT_EQ((*runs)[j].greedy, c.greedy) << expect.label << " prompt " << picked[j];
    auto single = RunGreedy(*loaded->model, c.input_ids, alone);
    ASSERT_TRUE(single.ok()) << single.status();
    EXPECT_TRUE(single->logits == (*runs)[j].logits) << expect.label << " prompt " << picked[j];
  }
}

}  // namespace sluice::testing
