// Antialiased image resizing of 8-bit images, bit-exact with torch's uint8 path of
// `interpolate(..., antialias=True)` (aten/src/ATen/native/cpu/UpSampleKernel.cpp and its AVX2
// twin, both derived from Pillow-SIMD's resampler), which torchvision's `resize` takes for
// uint8 tensors and the transformers "fast" image processors use.
//
// Separable: a horizontal pass, then a vertical pass over the uint8 result of the first (a pass
// whose size does not change is skipped). Per output index i of a pass with
// scale = in_size / out_size:
//   support = filter_support · max(scale, 1), center = scale · (i + 0.5)
//   taps j in [xmin, xmax) with xmin = max(int(center − support + 0.5), 0),
//   xmax = min(int(center + support + 0.5), in_size),
//   w_j = filter((j − center + 0.5) / max(scale, 1)), normalized to sum 1 (float64).
// The weights become int16 with `precision` fraction bits, the largest p < 22 such that
// round(max_w · 2^(p+1)) < 2^15 (max over the whole pass), rounded half away from zero; an output
// is clamp((Σ in_j · w16_j + 2^(p−1)) >> p, 0, 255).
#ifndef SLUICE_ENGINE_VISION_RESIZE_H_
#define SLUICE_ENGINE_VISION_RESIZE_H_

#include <cstdint>
#include <vector>

namespace sluice::vision {

// ResizeFilter: the interpolation kernel. kBicubic is Keys' cubic convolution with a = −0.5
// (support 2), the antialiasing kernel torch and Pillow use; kBilinear the triangle (support 1).
enum class ResizeFilter { kBilinear, kBicubic };

// ResizeAntialiasU8 resizes `src` [in_height, in_width, channels] (uint8, HWC) to
// [out_height, out_width, channels]. All sizes must be positive.
std::vector<uint8_t> ResizeAntialiasU8(const uint8_t* src, int64_t in_height, int64_t in_width,
                                       int64_t channels, int64_t out_height, int64_t out_width,
                                       ResizeFilter filter);

}  // namespace sluice::vision

#endif  // SLUICE_ENGINE_VISION_RESIZE_H_
