#include "engine/vision/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sluice::vision {
namespace {

double Cubic(double x) {  // Keys (1981), a = -0.5
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

double Triangle(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// One pass's taps: output i reads inputs [xmin[i], xmin[i] + xsize[i]) with weights
// w16[i * max_taps + k].
struct PassWeights {
  std::vector<int64_t> xmin, xsize;
  std::vector<int16_t> w16;
  int64_t max_taps = 0;
  int precision = 0;
};

PassWeights ComputeWeights(int64_t in_size, int64_t out_size, ResizeFilter filter) {
  const double filter_support = filter == ResizeFilter::kBicubic ? 2.0 : 1.0;
  double (*fn)(double) = filter == ResizeFilter::kBicubic ? Cubic : Triangle;
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double support = scale >= 1.0 ? filter_support * scale : filter_support;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  PassWeights p;
  p.max_taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  p.xmin.resize(out_size);
  p.xsize.resize(out_size);
  std::vector<double> w(static_cast<size_t>(out_size * p.max_taps), 0.0);
  double w_max = 0.0;
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    const int64_t xmin = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t xsize = std::clamp<int64_t>(
        std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size) - xmin, 0,
        p.max_taps);
    double* wi = w.data() + i * p.max_taps;
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      wi[j] = fn((static_cast<double>(j + xmin) - center + 0.5) * invscale);
      total += wi[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < xsize; ++j) wi[j] /= total;
    }
    for (int64_t j = 0; j < p.max_taps; ++j) w_max = std::max(w_max, wi[j]);
    p.xmin[i] = xmin;
    p.xsize[i] = xsize;
  }
  for (p.precision = 0; p.precision < 22; ++p.precision) {
    const int next = static_cast<int>(0.5 + w_max * static_cast<double>(1 << (p.precision + 1)));
    if (next >= (1 << 15)) break;
  }
  p.w16.resize(w.size());
  const double one = static_cast<double>(1 << p.precision);
  for (size_t k = 0; k < w.size(); ++k) {
    const double v = w[k] * one;
    p.w16[k] = static_cast<int16_t>(v < 0 ? v - 0.5 : v + 0.5);
  }
  return p;
}

uint8_t Clamp8(int32_t v) { return static_cast<uint8_t>(std::clamp(v, 0, 255)); }

}  // namespace

std::vector<uint8_t> ResizeAntialiasU8(const uint8_t* src, int64_t in_h, int64_t in_w,
                                       int64_t ch, int64_t out_h, int64_t out_w,
                                       ResizeFilter filter) {
  std::vector<uint8_t> cur(src, src + in_h * in_w * ch);
  int64_t cur_w = in_w;
  if (out_w != in_w) {
    const PassWeights p = ComputeWeights(in_w, out_w, filter);
    std::vector<uint8_t> next(static_cast<size_t>(in_h * out_w * ch));
    const int32_t round = 1 << (p.precision - 1);
    for (int64_t y = 0; y < in_h; ++y) {
      const uint8_t* row = cur.data() + y * in_w * ch;
      for (int64_t x = 0; x < out_w; ++x) {
        const int16_t* w = p.w16.data() + x * p.max_taps;
        for (int64_t c = 0; c < ch; ++c) {
          int32_t acc = round;
          for (int64_t k = 0; k < p.xsize[x]; ++k) {
            acc += static_cast<int32_t>(row[(p.xmin[x] + k) * ch + c]) * w[k];
          }
          next[(y * out_w + x) * ch + c] = Clamp8(acc >> p.precision);
        }
      }
    }
    cur.swap(next);
    cur_w = out_w;
  }
  if (out_h != in_h) {
    const PassWeights p = ComputeWeights(in_h, out_h, filter);
    std::vector<uint8_t> next(static_cast<size_t>(out_h * cur_w * ch));
    const int32_t round = 1 << (p.precision - 1);
    const int64_t stride = cur_w * ch;
    for (int64_t y = 0; y < out_h; ++y) {
      const int16_t* w = p.w16.data() + y * p.max_taps;
      for (int64_t xc = 0; xc < stride; ++xc) {
        int32_t acc = round;
        for (int64_t k = 0; k < p.xsize[y]; ++k) {
          acc += static_cast<int32_t>(cur[(p.xmin[y] + k) * stride + xc]) * w[k];
        }
        next[y * stride + xc] = Clamp8(acc >> p.precision);
      }
    }
    cur.swap(next);
  }
  return cur;
}

}  // namespace sluice::vision
