// Image bytes as a client sends them (a data: URL's payload, or what an image URL served)
// through DecodeImage: format sniffing, then the PNG, JPEG or WebP decoder with the size limits
// checked before pixels are allocated.
//
// Input: byte 0 picks the limits (bit 0: a 4096-pixel cap, else 1 << 20), the rest is the
// image. Checks beyond "no crash": a decoded image has width × height within the cap and
// exactly width × height × 3 bytes of pixels.
#include <cstdint>

#include "engine/vision/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  sluice::vision::ImageDecodeLimits limits;
  limits.max_bytes = 1 << 20;
  limits.max_pixels = (data[0] & 1) ? 4096 : (1 << 20);
  auto image = sluice::vision::DecodeImage(absl::MakeConstSpan(data + 1, size - 1), limits);
  if (!image.ok()) return 0;
  if (image->width <= 0 || image->height <= 0 ||
      image->width * image->height > limits.max_pixels ||
      static_cast<int64_t>(image->pixels.size()) != image->width * image->height * 3) {
    __builtin_trap();
  }
  return 0;
}
