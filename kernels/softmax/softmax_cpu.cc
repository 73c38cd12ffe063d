#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/common/parallel.h"
#include "kernels/softmax/softmax.h"

namespace sluice::kernels {

void ScaledSoftmaxRowsCpu(const float* x, int64_t rows, int64_t n, float scale, float* out) {
  const int64_t min_rows = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, n));
  ParallelFor(rows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * n;
      float* o = out + r * n;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) m = std::max(m, scale * xr[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        o[j] = std::exp(scale * xr[j] - m);
        sum += o[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < n; ++j) o[j] *= inv;
    }
  });
}

}  // namespace sluice::kernels
