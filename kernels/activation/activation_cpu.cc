#include <algorithm>
#include <cmath>

#include "kernels/activation/activation.h"
#include "kernels/common/parallel.h"

namespace sluice::kernels {

void SiluMulCpu(const float* gate_up, float* out, int64_t rows, int64_t d) {
  const int64_t min_rows = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, d));
  ParallelFor(rows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gate_up + r * 2 * d;
      const float* u = g + d;
      float* o = out + r * d;
      for (int64_t i = 0; i < d; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

void GeluCpu(const float* x, float* out, int64_t n) {
  ParallelFor(n, 8192, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      out[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * static_cast<float>(M_SQRT1_2)));
    }
  });
}

void QuickGeluCpu(const float* x, float* out, int64_t n) {
  ParallelFor(n, 8192, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = x[i] / (1.0f + std::exp(-1.702f * x[i]));
  });
}

}  // namespace sluice::kernels
