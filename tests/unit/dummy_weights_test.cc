// --load-format dummy: the generated layout matches real checkpoints tensor for tensor, values
// are deterministic with the documented scale, and the dummy CPU models run.
#include "engine/model/dummy_weights.h"

#include <cmath>
#include <map>

#include "build_paths.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "gtest/gtest.h"
#include "tests/util/golden_runner.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

// Every tensor of each fixture checkpoint appears in DummyTensorSpecs with the same shape, and
// nothing else does: dummy weights load through exactly the code path real weights take.
TEST(DummyWeightsTest, SpecsMatchFixtureCheckpoints) {
  for (const char* name : {"llama-tiny", "qwen3-hybrid-tiny", "deepseek-v3-tiny"}) {
    SCOPED_TRACE(name);
    const std::string dir = testing::FixtureDir(name);
    auto config = ModelConfig::Load(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    auto ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    auto specs = DummyTensorSpecs(*config);
    ASSERT_TRUE(specs.ok()) << specs.status();
    std::map<std::string, std::vector<int64_t>> dummy;
    for (const DummyTensorSpec& s : *specs) dummy[s.name] = s.shape;
    const std::vector<std::string> names = (*ckpt)->Names();
    EXPECT_EQ(dummy.size(), names.size());
    for (const std::string& n : names) {
      auto it = dummy.find(n);
      ASSERT_NE(it, dummy.end()) << n;
      EXPECT_EQ(it->second, (*ckpt)->Find(n)->shape) << n;
    }
  }
}

TEST(DummyWeightsTest, ValuesAreSeededNormalWithStd002AndNormsAreOne) {
  DummyTensorSpec w{"model.layers.0.mlp.up_proj.weight", {256, 1024}, DummyInit::kNormal};
  std::vector<float> a(static_cast<size_t>(w.NumElements())), b(a.size()), c(a.size());
  FillDummyTensor(w, 1, a.data());
  FillDummyTensor(w, 1, b.data());
  FillDummyTensor(w, 2, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double sum = 0, sum2 = 0;
  for (float v : a) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum2 += double{v} * v;
  }
  const double n = static_cast<double>(a.size());
  const double mean = sum / n, stddev = std::sqrt(sum2 / n - mean * mean);
  // 262,144 samples: the standard error of the mean is 0.02 / 512 ≈ 4e-5.
  EXPECT_NEAR(mean, 0.0, 2e-4);
  EXPECT_NEAR(stddev, kDummyStd, 2e-4);
  DummyTensorSpec norm{"model.norm.weight", {64}, DummyInit::kOnes};
  std::vector<float> ones(64);
  FillDummyTensor(norm, 1, ones.data());
  EXPECT_EQ(ones, std::vector<float>(64, 1.0f));
}

TEST(DummyWeightsTest, BenchConfigsParseWithExpectedShapes) {
  auto llama = ModelConfig::Load(SLUICE_SOURCE_DIR "/bench/configs/llama3-8b");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->hidden_size, 4096);
  EXPECT_EQ(llama->head_dim, 128);
  EXPECT_EQ(llama->num_key_value_heads, 8);
  EXPECT_DOUBLE_EQ(llama->rope.rope_theta, 500000.0);
  auto specs = DummyTensorSpecs(*llama);
  ASSERT_TRUE(specs.ok());
  int64_t params = 0;
  for (const DummyTensorSpec& s : *specs) params += s.NumElements();
  EXPECT_EQ(params, 8030261248);  // Llama-3-8B's published parameter count

  auto dsv2 = ModelConfig::Load(SLUICE_SOURCE_DIR "/bench/configs/deepseek-v2-lite");
  ASSERT_TRUE(dsv2.ok()) << dsv2.status();
  EXPECT_EQ(dsv2->kv_lora_rank, 512);
  EXPECT_EQ(dsv2->n_routed_experts, 64);
  auto dspecs = DummyTensorSpecs(*dsv2);
  ASSERT_TRUE(dspecs.ok());
  int64_t dparams = 0;
  for (const DummyTensorSpec& s : *dspecs) {
    if (s.name.find("e_score_correction_bias") == std::string::npos) dparams += s.NumElements();
  }
  EXPECT_EQ(dparams, 15706484224);  // DeepSeek-V2-Lite: 15.7B parameters
}

// A dummy llama-tiny runs through the CPU engine, deterministically, with a greedy continuation
// that is not constant (the scale keeps the logits informative).
TEST(DummyWeightsTest, DummyCpuModelRunsDeterministically) {
  const std::string dir = testing::FixtureDir("llama-tiny");
  auto m1 = LoadDummyModel(dir, 7);
  ASSERT_TRUE(m1.ok()) << m1.status();
  auto m2 = LoadDummyModel(dir, 7);
  ASSERT_TRUE(m2.ok()) << m2.status();
  const std::vector<int32_t> prompt = {0, 47, 554, 86, 1041};
  testing::GoldenRunOptions opt;
  opt.num_new_tokens = 8;
  auto r1 = testing::RunGreedy(**m1, prompt, opt);
  auto r2 = testing::RunGreedy(**m2, prompt, opt);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(r1->logits, r2->logits);
  for (float v : r1->logits) ASSERT_TRUE(std::isfinite(v));
  auto dsv3 = LoadDummyModel(testing::FixtureDir("deepseek-v3-tiny"));
  ASSERT_TRUE(dsv3.ok()) << dsv3.status();
  EXPECT_TRUE(testing::RunGreedy(**dsv3, prompt, opt).ok());
}

TEST(DummyWeightsTest, MissingConfigIsNotFound) {
  auto m = LoadDummyModel("/nonexistent-sluice-dir");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace sluice
