// WebP through libwebp (the decoder Pillow wraps). Lossy and lossless still images; an image
// with alpha is composited onto white like every other format.
#include <webp/decode.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/vision/image_codecs.h"

namespace sluice::vision::internal {

absl::StatusOr<RgbImage> DecodeWebp(absl::Span<const uint8_t> bytes,
                                    const ImageDecodeLimits& limits) {
  WebPBitstreamFeatures features;
  const VP8StatusCode code = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (code != VP8_STATUS_OK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated or corrupt WebP image: ",
        code == VP8_STATUS_NOT_ENOUGH_DATA ? "not enough data" : "bad header"));
  }
  if (features.has_animation) {
    return absl::InvalidArgumentError("animated WebP images are not supported");
  }
  if (absl::Status s = CheckDeclaredSize(features.width, features.height, limits); !s.ok()) {
    return s;
  }
  const int channels = features.has_alpha ? 4 : 3;
  const int64_t n = static_cast<int64_t>(features.width) * features.height;
  std::vector<uint8_t> decoded(static_cast<size_t>(n) * channels);
  const int stride = features.width * channels;
  const uint8_t* ok =
      features.has_alpha
          ? WebPDecodeRGBAInto(bytes.data(), bytes.size(), decoded.data(), decoded.size(), stride)
          : WebPDecodeRGBInto(bytes.data(), bytes.size(), decoded.data(), decoded.size(), stride);
  if (ok == nullptr) {
    return absl::InvalidArgumentError("truncated or corrupt WebP image: decoding failed");
  }
  RgbImage image;
  image.width = features.width;
  image.height = features.height;
  if (channels == 3) {
    image.pixels = std::move(decoded);
  } else {
    image.pixels.resize(static_cast<size_t>(n) * 3);
    CompositeOnWhite(decoded.data(), n, image.pixels.data());
  }
  return image;
}

}  // namespace sluice::vision::internal
