// LlavaConfig (engine/vision/llava_config.h) and the llava branch of ModelConfig.
#include <fstream>
#include <functional>
#include <utility>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "build_paths.h"
#include "engine/model/model_config.h"
#include "engine/vision/llava_config.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace sluice::vision {
namespace {

nlohmann::json FixtureConfig() {
  std::ifstream in(testing::FixtureDir("llava-tiny") + "/config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

TEST(LlavaConfigTest, ParsesTheFixture) {
  auto c = LlavaConfig::FromJsonText(FixtureConfig().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vision.num_patches(), 16);
  EXPECT_EQ(c->image_seq_length, 16);
  EXPECT_EQ(c->FeatureLayerIndex(), 1);  // -2 of hidden states (h_0, h_1, h_2)
  EXPECT_EQ(c->text_hidden_size, 64);
  auto text = ModelConfig::FromJsonText(FixtureConfig().dump());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->architecture, Architecture::kLlama);
  EXPECT_EQ(text->hidden_size, 64);
  EXPECT_EQ(text->image_token_index, 6);
  EXPECT_EQ(text->multimodal_architecture, "LlavaForConditionalGeneration");
}

TEST(LlavaConfigTest, FullStrategyKeepsCls) {
  nlohmann::json j = FixtureConfig();
  j["vision_feature_select_strategy"] = "full";
  j.erase("image_seq_length");
  auto c = LlavaConfig::FromJsonText(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->image_seq_length, 17);
}

TEST(LlavaConfigTest, UnsupportedSettingsAreNamed) {
  const std::pair<std::function<void(nlohmann::json&)>, std::string> cases[] = {
      {[](nlohmann::json& j) { j["vision_feature_layer"] = {-2, -1}; },
       "lists of layers are not supported"},
      {[](nlohmann::json& j) { j["vision_feature_layer"] = -4; }, "outside the 2-layer"},
      {[](nlohmann::json& j) { j["image_seq_length"] = 20; },
       "image_seq_length 20 does not match the vision tower's 16"},
      {[](nlohmann::json& j) { j["vision_feature_select_strategy"] = "cls"; },
       "unsupported vision_feature_select_strategy cls"},
      {[](nlohmann::json& j) { j["vision_config"]["model_type"] = "siglip_vision_model"; },
       "unsupported vision tower siglip_vision_model"},
      {[](nlohmann::json& j) { j["projector_hidden_act"] = "relu"; },
       "unsupported projector_hidden_act relu"},
      {[](nlohmann::json& j) { j.erase("text_config"); }, "needs vision_config and text_config"},
  };
  for (const auto& [edit, fragment] : cases) {
    nlohmann::json j = FixtureConfig();
    edit(j);
    auto c = LlavaConfig::FromJsonText(j.dump());
    ASSERT_FALSE(c.ok()) << fragment;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status();
  }
}

// bench/configs/llava-1.5-7b (encoder_bench --load-format dummy): LLaVA-1.5-7B's published
// shapes — CLIP ViT-L/14-336 (577 positions), the second-to-last layer, 576 tokens an image,
// a projector to the 7B Llama's 4096.
TEST(LlavaConfigTest, BenchConfigHasLlava15Shapes) {
  const std::string dir = SLUICE_SOURCE_DIR "/bench/configs/llava-1.5-7b";
  auto c = LlavaConfig::Load(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vision.hidden_size, 1024);
  EXPECT_EQ(c->vision.intermediate_size, 4096);
  EXPECT_EQ(c->vision.num_hidden_layers, 24);
  EXPECT_EQ(c->vision.num_attention_heads, 16);
  EXPECT_EQ(c->vision.image_size, 336);
  EXPECT_EQ(c->vision.patch_size, 14);
  EXPECT_EQ(c->vision.hidden_act, "quick_gelu");
  EXPECT_EQ(c->vision.num_positions(), 577);
  EXPECT_EQ(c->image_seq_length, 576);
  EXPECT_EQ(c->FeatureLayerIndex(), 23);
  EXPECT_EQ(c->text_hidden_size, 4096);
  EXPECT_EQ(c->projector_hidden_act, "gelu");
  auto text = ModelConfig::Load(dir);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->multimodal_architecture, "LlavaForConditionalGeneration");
  EXPECT_EQ(text->num_hidden_layers, 32);
  EXPECT_EQ(text->image_token_index, 32000);
}

}  // namespace
}  // namespace sluice::vision
