// llava-tiny against the reference (../shared/fixtures/llava-tiny, README "llava-tiny"): the
// vision tower's selected hidden state, the projected image features, the chat prompts'
// tokenization with image-token expansion, logits at every prompt position and 32 greedy tokens,
// for the PNG, PNG and JPEG images and the two-image prompt. Tolerance: the fixture README's
// suggested float32 acceptance (max |Δ| ≤ 1e-4, identical argmax and greedy tokens).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/model.h"
#include "engine/model/safetensors.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/vision/image.h"
#include "engine/vision/image_placeholders.h"
#include "engine/vision/vision_encoder.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/golden_runner.h"
#include "tests/util/test_paths.h"

namespace sluice::vision {
namespace {

using sluice::testing::ReadFileBytes;

const char* kImages[] = {"image_0.png", "image_1.png", "image_2.jpg"};

std::vector<float> Tensor(const SafetensorsFile& f, const std::string& name) {
  const TensorView* v = f.Find(name);
  EXPECT_NE(v, nullptr) << name;
  if (v == nullptr) return {};
  auto t = ToFloat32(*v);
  EXPECT_TRUE(t.ok());
  return t.ok() ? *t : std::vector<float>{};
}

std::vector<int32_t> Ints(const SafetensorsFile& f, const std::string& name) {
  const TensorView* v = f.Find(name);
  EXPECT_NE(v, nullptr) << name;
  if (v == nullptr) return {};
  auto t = ToInt64(*v);
  return std::vector<int32_t>(t->begin(), t->end());
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

class LlavaGoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FixtureDir("llava-tiny");
    auto golden = SafetensorsFile::Open(dir_ + "/golden.safetensors");
    ASSERT_TRUE(golden.ok()) << golden.status();
    golden_ = std::move(*golden);
    auto encoder = VisionEncoder::Load(dir_);
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    encoder_ = std::move(*encoder);
  }
  // The image's features through the serving path: bytes → decode → preprocess → encode.
  std::vector<float> Features(int k) {
    auto image = DecodeImage(ReadFileBytes(dir_ + "/" + kImages[k]), ImageDecodeLimits{});
    EXPECT_TRUE(image.ok()) << image.status();
    auto f = encoder_->EncodeImage(*image);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *f : std::vector<float>{};
  }
  std::string dir_;
  std::unique_ptr<SafetensorsFile> golden_;
  std::unique_ptr<VisionEncoder> encoder_;
};

TEST_F(LlavaGoldenTest, VisionHiddenStateAndProjectedFeatures) {
  EXPECT_EQ(encoder_->tokens_per_image(), 16);
  EXPECT_EQ(encoder_->embedding_dim(), 64);
  EXPECT_EQ(encoder_->image_token_id(), 6);
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(kImages[k]);
    // From the reference pixel values: the tower and projector alone.
    const std::vector<float> pixels = Tensor(*golden_, absl::StrCat("pixel_values_", k));
    auto hidden = encoder_->SelectedHiddenState(pixels, 1);
    ASSERT_TRUE(hidden.ok()) << hidden.status();
    EXPECT_LE(MaxAbsDiff(*hidden, Tensor(*golden_, absl::StrCat("vision_hidden_", k))), 1e-4f);
    auto features = encoder_->Encode(pixels, 1);
    ASSERT_TRUE(features.ok()) << features.status();
    const std::vector<float> want = Tensor(*golden_, absl::StrCat("image_features_", k));
    std::cout << "[golden] llava-tiny image " << k << " max|dfeature|="
              << MaxAbsDiff(*features, want) << "\n";
    EXPECT_LE(MaxAbsDiff(*features, want), 1e-4f);
    // And from the image file.
    EXPECT_LE(MaxAbsDiff(Features(k), want), 1e-4f);
  }
  // A batch of three gives each image's own features.
  std::vector<float> batch;
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> p = Tensor(*golden_, absl::StrCat("pixel_values_", k));
    batch.insert(batch.end(), p.begin(), p.end());
  }
  auto features = encoder_->Encode(batch, 3);
  ASSERT_TRUE(features.ok());
  std::vector<float> want;
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> f = Tensor(*golden_, absl::StrCat("image_features_", k));
    want.insert(want.end(), f.begin(), f.end());
  }
  EXPECT_LE(MaxAbsDiff(*features, want), 1e-4f);
  EXPECT_FALSE(encoder_->Encode(batch, 2).ok());
}

TEST_F(LlavaGoldenTest, PromptsTokenizeAndExpandToTheReferenceIds) {
  auto tokenizer = Tokenizer::FromFile(dir_ + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const auto report = nlohmann::json::parse(ReadFileBytes(dir_ + "/golden_report.json"));
  for (int i = 0; i < 2; ++i) {
    const auto& prompt = report["prompts"][i];
    const std::vector<int32_t> ids =
        (*tokenizer)->Encode(prompt["text"].get<std::string>(), /*add_special_tokens=*/false);
    const int64_t num_images = static_cast<int64_t>(prompt["images"].size());
    auto expanded = ExpandImagePlaceholders(ids, 6, 16, num_images);
    ASSERT_TRUE(expanded.ok()) << expanded.status();
    EXPECT_EQ(expanded->token_ids, Ints(*golden_, absl::StrCat("input_ids_", i)));
    EXPECT_EQ(static_cast<int64_t>(expanded->image_offsets.size()), num_images);
    auto wrong = ExpandImagePlaceholders(ids, 6, 16, num_images + 1);
    ASSERT_FALSE(wrong.ok());
    EXPECT_EQ(wrong.status().message(),
              absl::StrCat("the prompt has ", num_images, " image placeholders for ",
                           num_images + 1, " images"));
  }
}

// Prefill in chunks of `chunk` tokens (0: whole prompt) with the image features spliced at the
// placeholder tokens, then greedy decode; returns the prompt logits and the greedy tokens.
struct PromptRun {
  std::vector<float> logits;
  std::vector<int32_t> greedy;
};
PromptRun RunPrompt(Model& model, const std::vector<int32_t>& ids, const std::vector<float>& features,
              int32_t image_token, int64_t chunk, int num_new) {
  const int64_t V = model.config().vocab_size, H = model.config().hidden_size;
  const int64_t bs = 16, T = static_cast<int64_t>(ids.size());
  KvCache cache(model.kv_cache_spec(), 8, bs);
  std::vector<int32_t> table = {5, 2, 7, 0, 3, 6, 1, 4};  // scattered blocks
  PromptRun run;
  std::vector<int32_t> tokens = ids;
  int64_t image_row = 0;
  auto step = [&](int64_t start, int64_t n, bool all_logits) {
    ForwardInput in;
    for (int64_t p = start; p < start + n; ++p) {
      in.token_ids.push_back(tokens[p]);
      in.positions.push_back(static_cast<int32_t>(p));
      in.slot_mapping.push_back(int64_t{table[p / bs]} * bs + p % bs);
      if (p < T && tokens[p] == image_token) {
        in.embedding_rows.push_back(static_cast<int32_t>(p - start));
        in.embedding_values.insert(in.embedding_values.end(),
                                   features.begin() + image_row * H,
                                   features.begin() + (image_row + 1) * H);
        ++image_row;
      }
      if (all_logits || p == start + n - 1) {
        in.logits_indices.push_back(static_cast<int32_t>(p - start));
      }
    }
    in.sequences.push_back({0, static_cast<int32_t>(n), static_cast<int32_t>(start), table});
    std::vector<float> logits(in.logits_indices.size() * V);
    const absl::Status s = model.Forward(in, cache, absl::MakeSpan(logits));
    EXPECT_TRUE(s.ok()) << s;
    return logits;
  };
  const int64_t c = chunk > 0 ? chunk : T;
  for (int64_t start = 0; start < T; start += c) {
    std::vector<float> l = step(start, std::min(c, T - start), true);
    run.logits.insert(run.logits.end(), l.begin(), l.end());
  }
  run.greedy.push_back(testing::ArgMax(run.logits.data() + (T - 1) * V, V));
  while (static_cast<int>(run.greedy.size()) < num_new) {
    tokens.push_back(run.greedy.back());
    std::vector<float> l = step(static_cast<int64_t>(tokens.size()) - 1, 1, false);
    run.greedy.push_back(testing::ArgMax(l.data(), V));
  }
  return run;
}

TEST_F(LlavaGoldenTest, LogitsAndGreedyTokensOfBothPrompts) {
  auto model = LoadModel(dir_);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().multimodal_architecture, "LlavaForConditionalGeneration");
  EXPECT_EQ((*model)->config().image_token_index, 6);
  ASSERT_TRUE((*model)->SupportsInputEmbeddings());
  const int64_t V = (*model)->config().vocab_size;
  for (int i = 0; i < 2; ++i) {
    const std::vector<int32_t> ids = Ints(*golden_, absl::StrCat("input_ids_", i));
    std::vector<float> features;
    for (int k : Ints(*golden_, absl::StrCat("prompt_images_", i))) {
      const std::vector<float> f = Features(k);
      features.insert(features.end(), f.begin(), f.end());
    }
    const std::vector<float> want = Tensor(*golden_, absl::StrCat("logits_", i));
    const std::vector<int32_t> greedy = Ints(*golden_, absl::StrCat("greedy_", i));
    for (int64_t chunk : {0, 7}) {  // 7: chunk boundaries fall inside the images
      SCOPED_TRACE(absl::StrCat("prompt ", i, " chunk ", chunk));
      PromptRun run = RunPrompt(**model, ids, features, 6, chunk, static_cast<int>(greedy.size()));
      const float diff = MaxAbsDiff(run.logits, want);
      std::cout << "[golden] llava-tiny prompt " << i << " chunk " << chunk
                << " max|dlogit|=" << diff << "\n";
      EXPECT_LE(diff, 1e-4f);
      int64_t argmax_mismatches = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        argmax_mismatches += testing::ArgMax(run.logits.data() + t * V, V) !=
                             testing::ArgMax(want.data() + t * V, V);
      }
      EXPECT_EQ(argmax_mismatches, 0);
      EXPECT_EQ(run.greedy, greedy);
    }
  }
}

TEST_F(LlavaGoldenTest, WithoutTheImageFeaturesTheLogitsDiffer) {
  // Guards against a splice that silently does nothing: the placeholder tokens' own embeddings
  // give different logits.
  auto model = LoadModel(dir_);
  ASSERT_TRUE(model.ok());
  const std::vector<int32_t> ids = Ints(*golden_, "input_ids_0");
  PromptRun run = RunPrompt(**model, ids, {}, /*image_token=*/-1, 0, 1);
  EXPECT_GT(MaxAbsDiff(run.logits, Tensor(*golden_, "logits_0")), 1e-2f);
}

}  // namespace
}  // namespace sluice::vision
