// Per-format decoders behind DecodeImage (image.h). Each checks the header's declared size
// against the limits before allocating pixels, and returns RGB as DecodeImage documents.
#ifndef SLUICE_ENGINE_VISION_IMAGE_CODECS_H_
#define SLUICE_ENGINE_VISION_IMAGE_CODECS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/vision/image.h"

namespace sluice::vision::internal {

absl::StatusOr<RgbImage> DecodePng(absl::Span<const uint8_t> bytes,
                                   const ImageDecodeLimits& limits);
absl::StatusOr<RgbImage> DecodeJpeg(absl::Span<const uint8_t> bytes,
                                    const ImageDecodeLimits& limits);
absl::StatusOr<RgbImage> DecodeWebp(absl::Span<const uint8_t> bytes,
                                    const ImageDecodeLimits& limits);

// CheckDeclaredSize: InvalidArgument unless 0 < width, height and width × height <= max_pixels.
absl::Status CheckDeclaredSize(int64_t width, int64_t height, const ImageDecodeLimits& limits);

}  // namespace sluice::vision::internal

#endif  // SLUICE_ENGINE_VISION_IMAGE_CODECS_H_
