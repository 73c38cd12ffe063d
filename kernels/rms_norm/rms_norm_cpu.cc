// RMSNorm as transformers' LlamaRMSNorm computes it in float32:
// x * rsqrt(mean(x²) + eps), then * weight.
#include <algorithm>
#include <cmath>

#include "kernels/common/parallel.h"
#include "kernels/rms_norm/rms_norm.h"

namespace sluice::kernels {
namespace {

inline void NormRow(const float* x, const float* weight, float* out, int64_t dim, float eps) {
  // 8 partial sums, combined in a fixed order: vectorizable and independent of the batch.
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    for (int l = 0; l < 8; ++l) part[l] += x[i + l] * x[i + l];
  }
  float sum = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
  for (; i < dim; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
  for (int64_t j = 0; j < dim; ++j) out[j] = (x[j] * inv) * weight[j];
}

}  // namespace

void RmsNormCpu(const float* x, int64_t x_stride, const float* weight, float* out,
                int64_t out_stride, int64_t rows, int64_t dim, float eps) {
  const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, dim));
  ParallelFor(rows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      NormRow(x + r * x_stride, weight, out + r * out_stride, dim, eps);
    }
  });
}

void AddRmsNormCpu(const float* x, float* residual, const float* weight, float* out,
                   int64_t rows, int64_t dim, float eps) {
  const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, dim));
  ParallelFor(rows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* res = residual + r * dim;
      const float* xr = x + r * dim;
      for (int64_t j = 0; j < dim; ++j) res[j] += xr[j];
      NormRow(res, weight, out + r * dim, dim, eps);
    }
  });
}

}  // namespace sluice::kernels
