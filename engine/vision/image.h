// Image decoding for vision-language models: PNG, JPEG and WebP bytes to 8-bit RGB pixels, with
// limits checked before any pixel is decoded.
//
// The RGB conversion is the one the Hugging Face processors apply (transformers'
// `image_transforms.convert_to_rgb` over a PIL image): images with alpha (RGBA, gray+alpha,
// palette or gray/RGB with a tRNS chunk) are composited onto an opaque white background with
// Pillow's integer `alpha_composite` arithmetic; gray is replicated to R, G and B; palettes are
// expanded. Decoded pixels equal Pillow's (same libpng / libjpeg-turbo / libwebp decoders,
// JPEG with the default islow DCT and fancy upsampling; 16-bit PNG samples keep their high byte,
// as Pillow's RGB;16B unpacking does). EXIF orientation is not applied (Pillow's Image.open does
// not apply it either).
#ifndef SLUICE_ENGINE_VISION_IMAGE_H_
#define SLUICE_ENGINE_VISION_IMAGE_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace sluice::vision {

// RgbImage: `pixels` [height, width, 3], uint8, row-major (HWC).
struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;
};

// ImageFormat: the container a byte string holds, from its magic bytes.
enum class ImageFormat { kUnknown, kPng, kJpeg, kWebp, kGif, kBmp, kTiff, kSvg };
const char* ImageFormatName(ImageFormat format);  // "PNG", "JPEG", ..., "unknown"
ImageFormat SniffImageFormat(absl::Span<const uint8_t> bytes);

// ImageDecodeLimits bound the work one image may cause.
struct ImageDecodeLimits {
  // Encoded size. 20 MiB by default.
  int64_t max_bytes = 20 << 20;
  // width × height as declared in the header, checked before decoding (a small file declaring a
  // huge canvas — a decompression bomb — is refused without allocating it). Default: Pillow's
  // MAX_IMAGE_PIXELS (89,478,485), the size past which transformers users get its warning.
  int64_t max_pixels = 89478485;
};

// DecodeImage decodes PNG, JPEG or WebP `bytes` to RGB.
// Errors, all InvalidArgument with a message naming the problem:
//   "image is N bytes, over the limit of M bytes"
//   "image declares WxH = P pixels, over the limit of M pixels (decompression bomb?)"
//   "SVG images are not supported ..." / "GIF images are not supported ..." (a known format
//   that is not decoded here)
//   "image data is not a PNG, JPEG or WebP image" (unrecognized bytes, e.g. text)
//   "truncated or corrupt PNG image: <decoder message>" (likewise JPEG, WebP)
//   "animated WebP images are not supported"
absl::StatusOr<RgbImage> DecodeImage(absl::Span<const uint8_t> bytes,
                                     const ImageDecodeLimits& limits);
inline absl::StatusOr<RgbImage> DecodeImage(std::string_view bytes,
                                            const ImageDecodeLimits& limits) {
  return DecodeImage(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), limits);
}

// CompositeOnWhite turns RGBA pixels [n, 4] into RGB [n, 3] as Pillow's
// `Image.alpha_composite(white, image)` followed by convert("RGB") does (7 extra bits of
// precision, divisions by 255 rounded with the (x + (x >> 8)) >> 8 trick; Pillow's
// libImaging/AlphaComposite.c). Fully opaque pixels are unchanged.
void CompositeOnWhite(const uint8_t* rgba, int64_t num_pixels, uint8_t* rgb);

}  // namespace sluice::vision

#endif  // SLUICE_ENGINE_VISION_IMAGE_H_
