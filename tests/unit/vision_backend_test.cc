// VisionEncoder's backend seam (engine/vision/vision_backend.h): the encoder parses the configs,
// checks pixel_values and hands the math to the backend the factory made (the CPU tower by
// default; engine/cuda/cuda_vision.h on a GPU, tested in cuda_model_test).
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/vision/image.h"
#include "engine/vision/vision_backend.h"
#include "engine/vision/vision_encoder.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace sluice::vision {
namespace {

// Answers every image with its index + 1, so the caller's batching is visible.
class FakeBackend : public VisionBackend {
 public:
  FakeBackend(const LlavaConfig& c, std::atomic<int>* calls) : config_(c), calls_(calls) {}
  std::string device() const override { return "fake"; }
  absl::StatusOr<std::vector<float>> SelectedHiddenState(absl::Span<const float>,
                                                         int64_t n) const override {
    ++*calls_;
    return std::vector<float>(
        static_cast<size_t>(n * config_.vision.num_positions() * config_.vision.hidden_size),
        -1.0f);
  }
  absl::StatusOr<std::vector<float>> Encode(absl::Span<const float>, int64_t n) const override {
    ++*calls_;
    const int64_t per = config_.image_seq_length * config_.text_hidden_size;
    std::vector<float> out(static_cast<size_t>(n * per));
    for (int64_t i = 0; i < n; ++i) {
      std::fill(out.begin() + i * per, out.begin() + (i + 1) * per, static_cast<float>(i + 1));
    }
    return out;
  }

 private:
  LlavaConfig config_;
  std::atomic<int>* calls_;
};

TEST(VisionBackendTest, EncoderChecksInputsAndDelegatesToTheFactorysBackend) {
  const std::string dir = testing::FixtureDir("llava-tiny");
  std::atomic<int> calls{0};
  LlavaConfig seen;
  auto enc = VisionEncoder::Load(dir, [&](const std::string& d, const LlavaConfig& c) {
    EXPECT_EQ(d, dir);
    seen = c;
    return absl::StatusOr<std::unique_ptr<VisionBackend>>(
        std::make_unique<FakeBackend>(c, &calls));
  });
  ASSERT_TRUE(enc.ok()) << enc.status();
  EXPECT_EQ((*enc)->device(), "fake");
  EXPECT_EQ(seen.image_seq_length, 16);
  EXPECT_EQ(seen.text_hidden_size, 64);
  const std::vector<float> two(2 * 3 * 32 * 32, 0.5f);
  auto features = (*enc)->Encode(two, 2);
  ASSERT_TRUE(features.ok());
  ASSERT_EQ(features->size(), 2u * 16 * 64);
  EXPECT_EQ((*features)[0], 1.0f);
  EXPECT_EQ((*features)[16 * 64], 2.0f);
  EXPECT_EQ(calls.load(), 1);
  // A wrong pixel count never reaches the backend.
  auto bad = (*enc)->Encode(two, 3);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*enc)->SelectedHiddenState(two, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls.load(), 1);
  // EncodeImage: preprocessing on the host, then the backend.
  RgbImage image;
  image.width = 40;
  image.height = 30;
  image.pixels.assign(40 * 30 * 3, 128);
  auto one = (*enc)->EncodeImage(image);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->size(), 16u * 64);
  EXPECT_EQ(calls.load(), 2);
  // A thin strip (shortest edge 1 -> 32 multiplies its pixels by 1024 before the 32x32 crop):
  // 1 x 64 resizes to 32 x 2048 = 64 tiles of 32 x 32, the most allowed; 1 x 65 is refused.
  RgbImage strip;
  strip.width = 1;
  strip.height = 64;
  strip.pixels.assign(64 * 3, 7);
  EXPECT_TRUE((*enc)->EncodeImage(strip).ok());
  strip.height = 65;
  strip.pixels.assign(65 * 3, 7);
  const absl::Status refused = (*enc)->EncodeImage(strip).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("image of 1x65 pixels: its aspect ratio is too extreme"),
            std::string::npos)
      << refused;
  EXPECT_EQ(calls.load(), 3);
}

TEST(VisionBackendTest, FactoryErrorsAreTheLoadsErrors) {
  auto enc = VisionEncoder::Load(testing::FixtureDir("llava-tiny"),
                                 [](const std::string&, const LlavaConfig&)
                                     -> absl::StatusOr<std::unique_ptr<VisionBackend>> {
                                   return absl::InternalError("no device");
                                 });
  EXPECT_EQ(enc.status(), absl::InternalError("no device"));
}

TEST(VisionBackendTest, DefaultIsTheCpuTower) {
  const std::string dir = testing::FixtureDir("llava-tiny");
  auto by_default = VisionEncoder::Load(dir);
  auto explicit_cpu = VisionEncoder::Load(dir, LoadCpuVisionBackend);
  ASSERT_TRUE(by_default.ok() && explicit_cpu.ok());
  EXPECT_EQ((*by_default)->device(), "cpu");
  std::vector<float> pixels(3 * 32 * 32);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i % 17) / 8 - 1;
  auto a = (*by_default)->Encode(pixels, 1);
  auto b = (*explicit_cpu)->Encode(pixels, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

}  // namespace
}  // namespace sluice::vision
