// Golden tests of the DeepSeek-V3 (MLA + MoE) CPU model against transformers float32 reference
// logits: shared/fixtures/deepseek-v3-tiny (random weights, fp32), tests/fixtures/deepseek-v2-tiny
// (a DeepseekV2ForCausalLM checkpoint, random fp32 weights) and sluice-mini-moe (trained, bf16)
// from shared/models and from the embedded copy in models/. For every prompt: logits at
// every position (max |Δlogit| within the README's suggested bound), identical argmax at every
// position and the exact greedy continuation, decoded through the paged latent cache with
// whole-prompt prefill, with chunked prefill, and with prompts batched in mixed steps. The
// kernels are batch invariant, so all three modes must give bit-identical logits.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/model/deepseek_v3.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/util/golden_suite.h"
#include "tests/util/test_paths.h"

namespace sluice {
namespace {

using ::sluice::testing::GoldenRunOptions;

enum class Where { kFixture, kSharedModel, kEmbedded, kRepoFixture };

struct GoldenModel {
  std::string label;      // test-name label
  std::string name;       // folder name
  Where where;
  int64_t greedy_tokens;  // length of greedy_<i>
  float tolerance;        // max |Δlogit|
};

std::string ModelDir(const GoldenModel& m) {
  switch (m.where) {
    case Where::kFixture:
      return sluice::testing::FixtureDir(m.name);
    case Where::kSharedModel:
      return sluice::testing::SharedModelDir(m.name);
    case Where::kEmbedded:
      return sluice::testing::RequirePath(sluice::testing::EmbeddedModelDir());
    case Where::kRepoFixture:
      return sluice::testing::RepoFixtureDir(m.name);
  }
  return "";
}

class DeepseekV3GoldenTest : public ::testing::TestWithParam<GoldenModel> {
 protected:
  sluice::testing::GoldenExpectations Expect() const {
    return {GetParam().label, GetParam().greedy_tokens, GetParam().tolerance};
  }
};

TEST_P(DeepseekV3GoldenTest, WholePromptAndChunkedPrefillAreBitwiseEqual) {
  sluice::testing::CheckChunkedPrefillIsBitwiseWhole(ModelDir(GetParam()), Expect());
}

TEST_P(DeepseekV3GoldenTest, BatchedPromptsMatchGoldenAndSingleRuns) {
  // All four prompts (5, 17, 64, 150 tokens) in the same steps: with chunk 5 the short ones
  // decode while the long ones still prefill, so steps mix prefill chunks and decode tokens.
  GoldenRunOptions batched;
  batched.block_size = 8;
  batched.prefill_chunk = 5;
  GoldenRunOptions whole;
  whole.block_size = 16;
  sluice::testing::CheckBatchedMatchesGolden(ModelDir(GetParam()), Expect(), {0, 1, 2, 3},
                                             batched, whole);
}

INSTANTIATE_TEST_SUITE_P(
    Models, DeepseekV3GoldenTest,
    ::testing::Values(
        GoldenModel{"deepseek_v3_tiny", "deepseek-v3-tiny", Where::kFixture, 32, 1e-4f},
        // DeepseekV2ForCausalLM (tests/fixtures/make_deepseek_v2_tiny.py: transformers 5.17,
        // float32, softmax routing without a correction bias, q_proj without compression,
        // routed_scaling_factor 2).
        GoldenModel{"deepseek_v2_tiny", "deepseek-v2-tiny", Where::kRepoFixture, 32, 1e-4f},
        // The same with group_limited_greedy routing (4 groups of 2 experts, 2 kept).
        GoldenModel{"deepseek_v2_grouped_tiny", "deepseek-v2-grouped-tiny", Where::kRepoFixture,
                    32, 1e-4f},
        GoldenModel{"sluice_mini_moe_shared", "sluice-mini-moe", Where::kSharedModel, 64, 5e-4f},
        GoldenModel{"sluice_mini_moe_embedded", "sluice-mini-moe", Where::kEmbedded, 64, 5e-4f}),
    [](const ::testing::TestParamInfo<GoldenModel>& info) { return info.param.label; });

// sluice-mini-moe (shared/models/README.md): latent cache of kv_lora_rank 128 + rope 32 floats
// per layer; a decode token reads the active parameters without the input embedding
// (9,354,112), one embedding row (384) and the 7 MoE layers' e_score_correction_bias buffers
// (7 × 16, not counted as parameters by the README), in float32.
TEST(DeepseekV3ModelTest, KvSpecAndWeightBytesOfSluiceMiniMoe) {
  auto model = LoadModel(sluice::testing::SharedModelDir("sluice-mini-moe"));
  ASSERT_TRUE(model.ok()) << model.status();
  const KvCacheSpec spec = (*model)->kv_cache_spec();
  EXPECT_EQ(spec.num_layers, 8);
  EXPECT_EQ(spec.k_floats_per_token, 160);
  EXPECT_EQ(spec.v_floats_per_token, 0);
  EXPECT_EQ((*model)->WeightsPerToken(), 9354112 + 384 + 7 * 16);
  // A bfloat16 checkpoint: 2 bytes per value of the matrices kept as bfloat16 — the output head
  // (8192 x 384), per layer w_a (352 x 384), q_b (192 x 384) and o_proj (384 x 192), layer 0's
  // dense MLP (3 x 1024 x 384), per MoE layer the shared and 2 routed experts (3 x 3 x 96 x 384):
  // 8,908,800 values. Norms, kv_b, the router and the embedding row stay float32.
  EXPECT_EQ((*model)->WeightBytesPerToken(), (9354112 + 384 + 7 * 16) * 4 - 8908800 * 2);
}

// Writes a copy of `src_dir` (config.json + model.safetensors) into a temp folder with the
// safetensors header edited by `edit`.
std::string CopyWithEditedHeader(const std::string& src_dir, const std::string& tag,
                                 const std::function<void(nlohmann::json&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path dst = fs::path(::testing::TempDir()) / ("dsv3_" + tag);
  fs::remove_all(dst);
  fs::create_directories(dst);
  fs::copy_file(fs::path(src_dir) / "config.json", dst / "config.json");
  std::ifstream in(fs::path(src_dir) / "model.safetensors", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(std::string(bytes.data() + 8, header_len));
  edit(header);
  const std::string text = header.dump();
  const uint64_t new_len = text.size();
  std::ofstream out(dst / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&new_len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(bytes.data() + 8 + header_len,
            static_cast<std::streamsize>(bytes.size() - 8 - header_len));
  return dst.string();
}

TEST(DeepseekV3ModelTest, MissingExpertTensorIsNotFoundNamingIt) {
  const std::string src = sluice::testing::FixtureDir("deepseek-v3-tiny");
  const std::string dir = CopyWithEditedHeader(src, "missing", [](nlohmann::json& h) {
    h.erase("model.layers.2.mlp.experts.5.down_proj.weight");
  });
  auto model = LoadModel(dir);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(model.status().message().find("model.layers.2.mlp.experts.5.down_proj.weight"),
            std::string::npos)
      << model.status();
}

TEST(DeepseekV3ModelTest, MisShapedTensorIsInvalidArgumentNamingIt) {
  const std::string src = sluice::testing::FixtureDir("deepseek-v3-tiny");
  const std::string dir = CopyWithEditedHeader(src, "misshaped", [](nlohmann::json& h) {
    // Same element count, transposed shape: [40, 64] → [64, 40].
    h["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"]["shape"] = {64, 40};
  });
  auto model = LoadModel(dir);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("model.layers.1.self_attn.kv_a_proj_with_mqa.weight"),
            std::string::npos)
      << model.status();
}

TEST(DeepseekV3ModelTest, ForwardRejectsInconsistentPlans) {
  auto model = LoadModel(sluice::testing::FixtureDir("deepseek-v3-tiny"));
  ASSERT_TRUE(model.ok()) << model.status();
  KvCache cache((*model)->kv_cache_spec(), 4, 4);
  const std::vector<int32_t> table = {2, 0};
  ForwardInput in;
  in.token_ids = {0, 47, 554};
  in.positions = {0, 1, 2};
  in.slot_mapping = {8, 9, 10};
  in.sequences = {SequenceSlice{0, 3, 0, table}};
  in.logits_indices = {2};
  std::vector<float> logits(8192);
  EXPECT_TRUE((*model)->Forward(in, cache, absl::MakeSpan(logits)).ok());

  ForwardInput bad_token = in;
  bad_token.token_ids[1] = 8192;
  EXPECT_EQ((*model)->Forward(bad_token, cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
  ForwardInput bad_position = in;
  bad_position.positions[2] = 5;
  EXPECT_EQ((*model)->Forward(bad_position, cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
  ForwardInput bad_slot = in;
  bad_slot.slot_mapping[0] = 16;
  EXPECT_EQ((*model)->Forward(bad_slot, cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
  ForwardInput uncovered = in;
  uncovered.sequences[0].num_query_tokens = 2;
  uncovered.logits_indices = {1};
  EXPECT_EQ((*model)->Forward(uncovered, cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> short_logits(100);
  EXPECT_EQ((*model)->Forward(in, cache, absl::MakeSpan(short_logits)).code(),
            absl::StatusCode::kInvalidArgument);
  KvCache wrong_cache(KvCacheSpec{3, 40, 40}, 4, 4);
  EXPECT_EQ((*model)->Forward(in, wrong_cache, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice
