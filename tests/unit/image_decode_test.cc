// Image decoding against Pillow (tests/fixtures/images/expected.json, written by
// make_images.py from what Pillow + transformers' convert_to_rgb produce) and the errors of bad
// images.
#include <string>

#include "engine/vision/image.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace sluice::vision {
namespace {

using sluice::testing::ReadFileBytes;

std::string ImagePath(const std::string& name) {
  return testing::RequirePath(testing::RepoFixtureDir("images") + "/" + name);
}

TEST(ImageDecodeTest, MatchesPillowForEveryModeAndFormat) {
  const auto expected = nlohmann::json::parse(ReadFileBytes(ImagePath("expected.json")));
  ASSERT_GE(expected.size(), 11u);
  for (const auto& [name, want] : expected.items()) {
    SCOPED_TRACE(name);
    auto image = DecodeImage(ReadFileBytes(ImagePath(name)), ImageDecodeLimits{});
    ASSERT_TRUE(image.ok()) << image.status();
    EXPECT_EQ(image->width, want["width"].get<int64_t>());
    EXPECT_EQ(image->height, want["height"].get<int64_t>());
    const std::vector<int> rgb = want["rgb"].get<std::vector<int>>();
    ASSERT_EQ(image->pixels.size(), rgb.size());
    int mismatches = 0;
    for (size_t i = 0; i < rgb.size(); ++i) mismatches += image->pixels[i] != rgb[i];
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(ImageDecodeTest, FixtureImagesDecodeToTheGoldenPixels) {
  // The llava-tiny images as Pillow decoded them (image_rgb_<k> in golden.safetensors) are
  // checked in the golden test; here only their sizes and formats.
  const std::string dir = testing::FixtureDir("llava-tiny");
  auto png = DecodeImage(ReadFileBytes(dir + "/image_1.png"), ImageDecodeLimits{});
  ASSERT_TRUE(png.ok()) << png.status();
  EXPECT_EQ(png->width, 64);
  EXPECT_EQ(png->height, 48);
  const std::string jpg = ReadFileBytes(dir + "/image_2.jpg");
  EXPECT_EQ(SniffImageFormat(absl::MakeConstSpan(
                reinterpret_cast<const uint8_t*>(jpg.data()), jpg.size())),
            ImageFormat::kJpeg);
}

void ExpectError(const std::string& bytes, const ImageDecodeLimits& limits,
                 const std::string& fragment) {
  auto image = DecodeImage(bytes, limits);
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(image.status().message().find(fragment), std::string::npos) << image.status();
}

TEST(ImageDecodeTest, BadImagesAreInvalidArgumentNamingTheProblem) {
  ExpectError(ReadFileBytes(ImagePath("truncated.png")), {}, "truncated or corrupt PNG image");
  ExpectError("this is not an image, just some text bytes", {},
              "not a PNG, JPEG or WebP image");
  ExpectError(ReadFileBytes(ImagePath("image.svg")), {}, "SVG images are not supported");
  ExpectError("GIF89a\x01\x00\x01\x00", {}, "GIF images are not supported");
  ExpectError(ReadFileBytes(ImagePath("bomb.png")), {},
              "declares 100000x100000 = 10000000000 pixels, over the limit of 89478485 pixels "
              "(decompression bomb?)");
  ExpectError("", {}, "image data is empty");
  // A truncated JPEG is an error (Pillow: "image file is truncated"), not a gray-padded image.
  const std::string jpg = ReadFileBytes(testing::FixtureDir("llava-tiny") + "/image_2.jpg");
  ExpectError(jpg.substr(0, jpg.size() * 2 / 3), {}, "truncated or corrupt JPEG image");
  ExpectError(jpg.substr(0, 10), {}, "truncated or corrupt JPEG image");
  const std::string webp = ReadFileBytes(ImagePath("lossy.webp"));
  ExpectError(webp.substr(0, webp.size() - 20), {}, "truncated or corrupt WebP image");
}

TEST(ImageDecodeTest, ByteAndPixelLimits) {
  const std::string png = ReadFileBytes(testing::FixtureDir("llava-tiny") + "/image_1.png");
  ImageDecodeLimits limits;
  limits.max_bytes = static_cast<int64_t>(png.size()) - 1;
  ExpectError(png, limits, "over the limit of " + std::to_string(png.size() - 1) + " bytes");
  limits = ImageDecodeLimits{};
  limits.max_pixels = 64 * 48 - 1;
  ExpectError(png, limits, "declares 64x48 = 3072 pixels, over the limit of 3071 pixels");
  limits.max_pixels = 64 * 48;
  EXPECT_TRUE(DecodeImage(png, limits).ok());
}

}  // namespace
}  // namespace sluice::vision
