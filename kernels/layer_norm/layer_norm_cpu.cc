#include <algorithm>
#include <cmath>

#include "kernels/common/parallel.h"
#include "kernels/layer_norm/layer_norm.h"

namespace sluice::kernels {

void LayerNormCpu(const float* x, const float* weight, const float* bias, float* out,
                  int64_t rows, int64_t dim, float eps) {
  const int64_t min_rows = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, dim));
  ParallelFor(rows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * dim;
      float* o = out + r * dim;
      double sum = 0.0;
      for (int64_t i = 0; i < dim; ++i) sum += xr[i];
      const double mean = sum / static_cast<double>(dim);
      double sq = 0.0;
      for (int64_t i = 0; i < dim; ++i) {
        const double d = xr[i] - mean;
        sq += d * d;
      }
      const double inv = 1.0 / std::sqrt(sq / static_cast<double>(dim) + eps);
      for (int64_t i = 0; i < dim; ++i) {
        const float norm = static_cast<float>((xr[i] - mean) * inv);
        o[i] = norm * weight[i] + (bias != nullptr ? bias[i] : 0.0f);
      }
    }
  });
}

void AddLayerNormCpu(float* h, const float* delta, const float* weight, const float* bias,
                     float* out, int64_t rows, int64_t dim, float eps) {
  if (delta != nullptr) {
    for (int64_t i = 0; i < rows * dim; ++i) h[i] += delta[i];
  }
  if (out != nullptr) LayerNormCpu(h, weight, bias, out, rows, dim, eps);
}

}  // namespace sluice::kernels
