// JPEG through libjpeg(-turbo) with its defaults (islow DCT, fancy upsampling), as Pillow
// decodes. libjpeg reports errors by longjmp; see png_decode.cc for the setjmp discipline.
#include <cstdio>  // jpeglib.h needs FILE
#include <jerror.h>
#include <jpeglib.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/vision/image_codecs.h"

namespace sluice::vision::internal {
namespace {

struct JpegErrors {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {0};
};

void OnError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Pillow refuses truncated JPEGs ("image file is truncated") unless LOAD_TRUNCATED_IMAGES is
// set; libjpeg only warns and pads with gray. Make that warning an error; others stay warnings.
void OnMessage(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) OnError(cinfo);
}

bool ReadHeader(jpeg_decompress_struct* cinfo, JpegErrors* err, const uint8_t* data,
                size_t size) {
  if (setjmp(err->jump)) return false;
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  return true;
}

// Decodes into `out` ([height, width, out_color_components]) after the caller set the output
// color space.
bool ReadScanlines(jpeg_decompress_struct* cinfo, JpegErrors* err, uint8_t* out) {
  if (setjmp(err->jump)) return false;
  jpeg_start_decompress(cinfo);
  const size_t stride = static_cast<size_t>(cinfo->output_width) * cinfo->output_components;
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + cinfo->output_scanline * stride;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

uint8_t MulDiv255(int a, int b) {
  const int tmp = a * b + 128;
  return static_cast<uint8_t>(((tmp >> 8) + tmp) >> 8);
}

}  // namespace

absl::StatusOr<RgbImage> DecodeJpeg(absl::Span<const uint8_t> bytes,
                                    const ImageDecodeLimits& limits) {
  jpeg_decompress_struct cinfo;
  JpegErrors err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = OnError;
  err.mgr.emit_message = OnMessage;
  auto corrupt = [&]() {
    jpeg_destroy_decompress(&cinfo);
    return absl::InvalidArgumentError(
        absl::StrCat("truncated or corrupt JPEG image: ", err.message));
  };
  if (!ReadHeader(&cinfo, &err, bytes.data(), bytes.size())) return corrupt();
  if (absl::Status s = CheckDeclaredSize(cinfo.image_width, cinfo.image_height, limits);
      !s.ok()) {
    jpeg_destroy_decompress(&cinfo);
    return s;
  }
  const bool cmyk =
      cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  const bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_RGB;
  const int components = cmyk ? 4 : gray ? 1 : 3;
  const int64_t n = static_cast<int64_t>(cinfo.image_width) * cinfo.image_height;
  std::vector<uint8_t> decoded(static_cast<size_t>(n) * components);
  if (!ReadScanlines(&cinfo, &err, decoded.data())) return corrupt();
  RgbImage image;
  image.width = cinfo.output_width;
  image.height = cinfo.output_height;
  jpeg_destroy_decompress(&cinfo);
  if (components == 3) {
    image.pixels = std::move(decoded);
    return image;
  }
  image.pixels.resize(static_cast<size_t>(n) * 3);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* d = image.pixels.data() + 3 * i;
    if (gray) {
      d[0] = d[1] = d[2] = decoded[i];
      continue;
    }
    // Pillow reads CMYK JPEGs as Adobe-inverted ("CMYK;I") and converts with
    // r = 255 - k' - c·(255 - k')/255 (libImaging/Convert.c cmyk2rgb), on inverted values.
    const uint8_t* s = decoded.data() + 4 * i;
    const int nk = s[3];  // 255 - k of the inverted sample
    for (int c = 0; c < 3; ++c) {
      const int cc = 255 - s[c];
      d[c] = static_cast<uint8_t>(std::clamp(nk - MulDiv255(cc, nk), 0, 255));
    }
  }
  return image;
}

}  // namespace sluice::vision::internal
