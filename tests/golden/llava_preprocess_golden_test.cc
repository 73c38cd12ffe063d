// llava-tiny image preprocessing against the reference processor's outputs
// (../shared/fixtures/llava-tiny/golden.safetensors: image_rgb_<k>, pixel_values_<k>).
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model/safetensors.h"
#include "engine/vision/image.h"
#include "engine/vision/image_processor.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace sluice::vision {
namespace {

using sluice::testing::ReadFileBytes;

const char* kImages[] = {"image_0.png", "image_1.png", "image_2.jpg"};

TEST(LlavaPreprocessGoldenTest, DecodedPixelsAndPixelValuesMatchTheReference) {
  const std::string dir = testing::FixtureDir("llava-tiny");
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  auto config = ImageProcessorConfig::Load(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->shortest_edge, 32);
  EXPECT_EQ(config->filter, ResizeFilter::kBicubic);
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(kImages[k]);
    auto image = DecodeImage(ReadFileBytes(dir + "/" + kImages[k]), ImageDecodeLimits{});
    ASSERT_TRUE(image.ok()) << image.status();
    const TensorView* rgb = (*golden)->Find(absl::StrCat("image_rgb_", k));
    ASSERT_NE(rgb, nullptr);
    ASSERT_EQ(rgb->shape, (std::vector<int64_t>{image->height, image->width, 3}));
    EXPECT_EQ(0, std::memcmp(rgb->data, image->pixels.data(), rgb->num_bytes));

    const std::vector<float> pixels = Preprocess(*image, *config);
    const TensorView* want_view = (*golden)->Find(absl::StrCat("pixel_values_", k));
    ASSERT_NE(want_view, nullptr);
    auto want = ToFloat32(*want_view);
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(pixels.size(), want->size());
    float max_diff = 0;
    for (size_t i = 0; i < pixels.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(pixels[i] - (*want)[i]));
    }
    // The reference's float32 arithmetic is reproduced step for step; one uint8 level off in the
    // resize would show as ~0.015.
    std::cout << "[golden] llava-tiny " << kImages[k] << " max|dpixel|=" << max_diff << "\n";
    EXPECT_LE(max_diff, 1e-6f);
  }
}

TEST(LlavaPreprocessGoldenTest, OutputSizeFollowsShortestEdgeThenCrop) {
  auto config = ImageProcessorConfig::Load(testing::FixtureDir("llava-tiny"));
  ASSERT_TRUE(config.ok());
  ImageProcessorConfig no_crop = *config;
  no_crop.do_center_crop = false;
  EXPECT_EQ(no_crop.OutputSize(48, 64), (std::array<int64_t, 2>{32, 42}));  // int(32·64/48)
  EXPECT_EQ(no_crop.OutputSize(100, 7), (std::array<int64_t, 2>{457, 32}));
  EXPECT_EQ(config->OutputSize(100, 7), (std::array<int64_t, 2>{32, 32}));
}

}  // namespace
}  // namespace sluice::vision
