// PNG through libpng's classic API (the simplified png_image API would convert 16-bit and
// gAMA-tagged images to sRGB, which Pillow does not). libpng reports errors by longjmp: every
// setjmp sits in a function whose frame holds only trivially destructible state, and the
// buffers it fills are owned by the caller.
#include <png.h>

#include <csetjmp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/vision/image_codecs.h"

namespace sluice::vision::internal {
namespace {

struct PngSource {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  char error[200] = {0};
};

void ReadFromMemory(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->size - src->pos < n) png_error(png, "unexpected end of data");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

void OnError(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->error, sizeof(src->error), "%s", message);
  png_longjmp(png, 1);
}

void OnWarning(png_structp, png_const_charp) {}  // benign chunk issues, as Pillow ignores them

// Header pass: reads up to the image data and sets the transformations to 8-bit RGB(A).
// Returns false on a libpng error (message in src->error).
bool ReadHeader(png_structp png, png_infop info, png_uint_32* width, png_uint_32* height,
                int* channels) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  int bit_depth = 0, color_type = 0, interlace = 0;
  png_get_IHDR(png, info, width, height, &bit_depth, &color_type, &interlace, nullptr, nullptr);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  if (bit_depth == 16) png_set_strip_16(png);
  if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  *channels = png_get_channels(png, info);
  return true;
}

bool ReadRows(png_structp png, png_infop info, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  return true;
}

}  // namespace

absl::StatusOr<RgbImage> DecodePng(absl::Span<const uint8_t> bytes,
                                   const ImageDecodeLimits& limits) {
  PngSource src;
  src.data = bytes.data();
  src.size = bytes.size();
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, OnError, OnWarning);
  if (png == nullptr) return absl::ResourceExhaustedError("libpng: out of memory");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return absl::ResourceExhaustedError("libpng: out of memory");
  }
  // libpng's own sanity limit would reject wide images before ours names the problem.
  png_set_user_limits(png, 0x7fffffffL, 0x7fffffffL);
  png_set_read_fn(png, &src, ReadFromMemory);
  auto fail = [&](absl::Status status) {
    png_destroy_read_struct(&png, &info, nullptr);
    return status;
  };
  png_uint_32 w = 0, h = 0;
  int channels = 0;
  if (!ReadHeader(png, info, &w, &h, &channels)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("truncated or corrupt PNG image: ", src.error)));
  }
  if (absl::Status s = CheckDeclaredSize(w, h, limits); !s.ok()) return fail(s);
  if (channels != 3 && channels != 4) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("unsupported PNG layout (", channels, " channels after expansion)")));
  }
  const size_t row_bytes = static_cast<size_t>(w) * channels;
  std::vector<uint8_t> decoded(row_bytes * h);
  std::vector<png_bytep> rows(h);
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = decoded.data() + y * row_bytes;
  if (!ReadRows(png, info, rows.data())) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("truncated or corrupt PNG image: ", src.error)));
  }
  png_destroy_read_struct(&png, &info, nullptr);
  RgbImage image;
  image.width = w;
  image.height = h;
  if (channels == 3) {
    image.pixels = std::move(decoded);
  } else {
    image.pixels.resize(static_cast<size_t>(w) * h * 3);
    CompositeOnWhite(decoded.data(), static_cast<int64_t>(w) * h, image.pixels.data());
  }
  return image;
}

}  // namespace sluice::vision::internal
