#include <algorithm>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/vision/image.h"
#include "engine/vision/image_codecs.h"

namespace sluice::vision {
namespace {

bool StartsWith(absl::Span<const uint8_t> b, const char* magic, size_t n, size_t at = 0) {
  return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
}

// SVG is XML text: after an optional BOM and whitespace, an XML declaration, comment, doctype or
// the <svg element itself, with "<svg" somewhere in the first few KiB.
bool LooksLikeSvg(absl::Span<const uint8_t> b) {
  absl::string_view text(reinterpret_cast<const char*>(b.data()), std::min<size_t>(b.size(), 4096));
  if (absl::StartsWith(text, "\xEF\xBB\xBF")) text.remove_prefix(3);
  text = absl::StripLeadingAsciiWhitespace(text);
  if (!absl::StartsWith(text, "<")) return false;
  const std::string lower = absl::AsciiStrToLower(text);
  return lower.find("<svg") != std::string::npos;
}

}  // namespace

const char* ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kGif: return "GIF";
    case ImageFormat::kBmp: return "BMP";
    case ImageFormat::kTiff: return "TIFF";
    case ImageFormat::kSvg: return "SVG";
    case ImageFormat::kUnknown: break;
  }
  return "unknown";
}

ImageFormat SniffImageFormat(absl::Span<const uint8_t> b) {
  if (StartsWith(b, "\x89PNG\r\n\x1a\n", 8)) return ImageFormat::kPng;
  if (StartsWith(b, "\xFF\xD8\xFF", 3)) return ImageFormat::kJpeg;
  if (StartsWith(b, "RIFF", 4) && StartsWith(b, "WEBP", 4, 8)) return ImageFormat::kWebp;
  if (StartsWith(b, "GIF87a", 6) || StartsWith(b, "GIF89a", 6)) return ImageFormat::kGif;
  if (StartsWith(b, "BM", 2)) return ImageFormat::kBmp;
  if (StartsWith(b, "II*\0", 4) || StartsWith(b, "MM\0*", 4)) return ImageFormat::kTiff;
  if (LooksLikeSvg(b)) return ImageFormat::kSvg;
  return ImageFormat::kUnknown;
}

absl::StatusOr<RgbImage> DecodeImage(absl::Span<const uint8_t> bytes,
                                     const ImageDecodeLimits& limits) {
  if (static_cast<int64_t>(bytes.size()) > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("image is ", bytes.size(),
                                                   " bytes, over the limit of ", limits.max_bytes,
                                                   " bytes"));
  }
  if (bytes.empty()) return absl::InvalidArgumentError("image data is empty");
  const ImageFormat format = SniffImageFormat(bytes);
  switch (format) {
    case ImageFormat::kPng: return internal::DecodePng(bytes, limits);
    case ImageFormat::kJpeg: return internal::DecodeJpeg(bytes, limits);
    case ImageFormat::kWebp: return internal::DecodeWebp(bytes, limits);
    case ImageFormat::kSvg:
      return absl::InvalidArgumentError(
          "SVG images are not supported (vector graphics are not rasterized; send PNG, JPEG or "
          "WebP)");
    case ImageFormat::kGif:
    case ImageFormat::kBmp:
    case ImageFormat::kTiff:
      return absl::InvalidArgumentError(absl::StrCat(ImageFormatName(format),
                                                     " images are not supported (send PNG, JPEG "
                                                     "or WebP)"));
    case ImageFormat::kUnknown: break;
  }
  return absl::InvalidArgumentError("image data is not a PNG, JPEG or WebP image");
}

namespace internal {

absl::Status CheckDeclaredSize(int64_t width, int64_t height, const ImageDecodeLimits& limits) {
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image declares an empty size ", width, "x", height));
  }
  // Both factors are below 2^32 for every format, so the product fits in int64.
  const int64_t pixels = width * height;
  if (pixels > limits.max_pixels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image declares ", width, "x", height, " = ", pixels, " pixels, over the limit of ",
        limits.max_pixels, " pixels (decompression bomb?)"));
  }
  return absl::OkStatus();
}

}  // namespace internal

// Pillow's alpha_composite with dst = opaque white: blend = 255·(255 − a), outa255 = 255², so
// coef1 = a·128 and coef2 = (255 − a)·128 exactly (PRECISION_BITS = 7).
void CompositeOnWhite(const uint8_t* rgba, int64_t num_pixels, uint8_t* rgb) {
  constexpr uint32_t kPrecisionBits = 7;
  for (int64_t i = 0; i < num_pixels; ++i) {
    const uint8_t* s = rgba + 4 * i;
    uint8_t* d = rgb + 3 * i;
    const uint32_t a = s[3];
    if (a == 0) {
      d[0] = d[1] = d[2] = 255;
      continue;
    }
    const uint32_t outa255 = a * 255 + 255 * (255 - a);
    const uint32_t coef1 = a * 255 * 255 * (1u << kPrecisionBits) / outa255;
    const uint32_t coef2 = 255 * (1u << kPrecisionBits) - coef1;
    for (int c = 0; c < 3; ++c) {
      const uint32_t tmp = s[c] * coef1 + 255u * coef2 + (0x80u << kPrecisionBits);
      d[c] = static_cast<uint8_t>((((tmp >> 8) + tmp) >> 8) >> kPrecisionBits);
    }
  }
}

}  // namespace sluice::vision
