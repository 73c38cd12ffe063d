// ImageProcessor: `preprocessor_config.json` of a CLIP-style image processor (transformers'
// CLIPImageProcessor and its "fast" torchvision backend, the default in transformers 5), applied
// to decoded RGB images.
//
// Steps, in the reference's order (transformers' TorchvisionBackend.preprocess):
//   1. resize (do_resize): size {shortest_edge: s} scales the shorter side to s and the longer to
//      int(s · long / short) (get_resize_output_image_size, default_to_square=False); size
//      {height, width} resizes to exactly that. Antialiased bicubic (resample 3) or bilinear
//      (resample 2) on the uint8 image (resize.h).
//   2. center crop (do_center_crop) to crop_size: zero padding first where the image is smaller
//      (left/top get the floor half), then top = int((h − ch) / 2), left = int((w − cw) / 2).
//   3. rescale + normalize, fused as the reference does: with both on,
//      x = (float(p) − mean·(1/rescale_factor)) / (std·(1/rescale_factor)), every step float32;
//      with only one of them, p·rescale_factor or (p − mean) / std.
// Output: pixel_values [3, H, W] float32 (CHW).
#ifndef SLUICE_ENGINE_VISION_IMAGE_PROCESSOR_H_
#define SLUICE_ENGINE_VISION_IMAGE_PROCESSOR_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/vision/image.h"
#include "engine/vision/resize.h"

namespace sluice::vision {

struct ImageProcessorConfig {
  bool do_resize = true;
  int64_t shortest_edge = 0;  // size.shortest_edge; 0 when size is {height, width}
  int64_t resize_height = 0;  // size.height / size.width when shortest_edge is 0
  int64_t resize_width = 0;
  ResizeFilter filter = ResizeFilter::kBicubic;  // resample: 3 bicubic, 2 bilinear
  bool do_center_crop = true;
  int64_t crop_height = 0;
  int64_t crop_width = 0;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::array<float, 3> image_mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> image_std = {0.26862954f, 0.26130258f, 0.27577711f};

  // Load reads `<dir>/preprocessor_config.json`. Errors: NotFound (no file), InvalidArgument
  // (bad JSON, a field of the wrong type, an unsupported resample or size form, a processor type
  // other than CLIPImageProcessor(Fast)).
  static absl::StatusOr<ImageProcessorConfig> Load(const std::string& dir);
  static absl::StatusOr<ImageProcessorConfig> FromJsonText(const std::string& text);
  // The output size [height, width] of Preprocess for an input of the given size.
  std::array<int64_t, 2> OutputSize(int64_t height, int64_t width) const;
  // Fingerprint: a canonical text of every field, so an embedding cache keyed by image bytes
  // plus this never mixes results of two preprocessing settings.
  std::string Fingerprint() const;
};

// Preprocess turns `image` into pixel_values [3, H, W] float32 as described above.
std::vector<float> Preprocess(const RgbImage& image, const ImageProcessorConfig& config);

// The resize runs on the whole image before the crop, so a thin strip grows by the square of
// its aspect ratio (1 x 500,000 pixels, 2 KB as a PNG, would become 336 x 168,000,000).
// CheckResizedSize: InvalidArgument naming the image's size when the resize before the crop
// would make more than kMaxResizedTiles times image_size² pixels (image_size: the vision
// tower's input side; an aspect ratio over about 64:1 with a shortest-edge resize).
inline constexpr int64_t kMaxResizedTiles = 64;
absl::Status CheckResizedSize(const ImageProcessorConfig& config, int64_t image_size,
                              int64_t height, int64_t width);

}  // namespace sluice::vision

#endif  // SLUICE_ENGINE_VISION_IMAGE_PROCESSOR_H_
