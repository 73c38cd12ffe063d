#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention/bidirectional_attention.h"
#include "kernels/common/parallel.h"

namespace sluice::kernels {

void BidirectionalAttentionCpu(const float* q, const float* k, const float* v,
                               int64_t row_stride, const BidirectionalAttentionParams& p,
                               float* out) {
  const int64_t L = p.seq_len, H = p.num_heads, D = p.head_dim;
  const int64_t items = p.num_sequences * L * H;
  ParallelFor(items, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(L));
    for (int64_t it = begin; it < end; ++it) {
      const int64_t h = it % H;
      const int64_t row = it / H;  // sequence · L + query
      const int64_t base = (row / L) * L;
      const float* qr = q + row * row_stride + h * D;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < L; ++j) {
        const float* kr = k + (base + j) * row_stride + h * D;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
        scores[j] = dot * p.scale;
        m = std::max(m, scores[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < L; ++j) {
        scores[j] = std::exp(scores[j] - m);
        sum += scores[j];
      }
      float* o = out + row * H * D + h * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t j = 0; j < L; ++j) {
        const float w = scores[j] / sum;
        const float* vr = v + (base + j) * row_stride + h * D;
        for (int64_t d = 0; d < D; ++d) o[d] += w * vr[d];
      }
    }
  });
}

}  // namespace sluice::kernels
