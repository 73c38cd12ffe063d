#include "kernels/mla_attention/mla_plumbing.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace sluice::kernels {

void MlaPrologueCpu(const MlaPrologueCpuArgs& a, int64_t num_tokens) {
  const int64_t width = a.R + a.dr;
  std::vector<float> row(static_cast<size_t>(width));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* kv = a.kv + t * a.kv_stride;
    const int32_t pos = a.positions[t];
    // The latent row: RMSNorm of c_kv, then k_pe rotated at the token's position.
    double sumsq = 0.0;
    for (int64_t i = 0; i < a.R; ++i) sumsq += double{kv[i]} * kv[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(sumsq / a.R) + a.eps);
    for (int64_t i = 0; i < a.R; ++i) row[i] = kv[i] * inv * a.kv_norm[i];
    std::copy(kv + a.R, kv + width, row.begin() + a.R);
    RopeCpu(row.data(), 1, 1, width, width, a.R, &pos, *a.rope, a.interleave);
    if (a.slots[t] >= 0) std::copy(row.begin(), row.end(), a.cache + a.slots[t] * width);
    // The queries' rope channels.
    for (int64_t h = 0; h < a.heads; ++h) {
      const float* src = a.q_pe + t * a.q_token_stride + h * a.q_head_stride;
      std::copy(src, src + a.dr, a.q_out + t * a.q_out_token_stride + h * a.q_out_head_stride);
    }
    if (a.heads > 0) {
      RopeCpu(a.q_out + t * a.q_out_token_stride, 1, a.heads, a.q_out_token_stride,
              a.q_out_head_stride, 0, &pos, *a.rope, a.interleave);
    }
  }
}

void MlaAbsorbQueryCpu(const float* q, int64_t q_token_stride, int64_t q_head_stride,
                       const float* w, int64_t w_head_stride, float* out,
                       int64_t out_token_stride, int64_t out_head_stride, int64_t num_tokens,
                       int64_t heads, int64_t dn, int64_t R) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* qh = q + t * q_token_stride + h * q_head_stride;
      const float* wh = w + h * w_head_stride;
      float* o = out + t * out_token_stride + h * out_head_stride;
      for (int64_t r = 0; r < R; ++r) {
        float acc = 0.0f;
        for (int64_t d = 0; d < dn; ++d) acc += qh[d] * wh[d * R + r];
        o[r] = acc;
      }
    }
  }
}

void MlaGatherLatentCpu(const float* cache, int64_t R, int64_t dr, const int32_t* context_lens,
                        const int32_t* query_start_loc, const int32_t* block_tables,
                        int64_t max_blocks_per_seq, int64_t block_size, int64_t num_seqs,
                        int64_t rows_per_seq, float* kv_c, float* k_pe) {
  const int64_t width = R + dr;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t len = context_lens[s] + query_start_loc[s + 1] - query_start_loc[s];
    for (int64_t j = 0; j < rows_per_seq; ++j) {
      float* c = kv_c + (s * rows_per_seq + j) * R;
      float* p = k_pe + (s * rows_per_seq + j) * dr;
      if (j >= len) {
        std::fill(c, c + R, 0.0f);
        std::fill(p, p + dr, 0.0f);
        continue;
      }
      const int64_t slot =
          int64_t{block_tables[s * max_blocks_per_seq + j / block_size]} * block_size +
          j % block_size;
      const float* src = cache + slot * width;
      std::copy(src, src + R, c);
      std::copy(src + R, src + width, p);
    }
  }
}

void MlaAssembleKvCpu(const float* kv_up, const float* k_pe, int64_t rows, int64_t heads,
                      int64_t dn, int64_t dr, int64_t dv, float* k, float* v) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* up = kv_up + (r * heads + h) * (dn + dv);
      float* kh = k + (r * heads + h) * (dn + dr);
      std::copy(up, up + dn, kh);
      std::copy(k_pe + r * dr, k_pe + (r + 1) * dr, kh + dn);
      std::copy(up + dn, up + dn + dv, v + (r * heads + h) * dv);
    }
  }
}

}  // namespace sluice::kernels
