#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention/paged_attention_bounded.h"
#include "kernels/common/parallel.h"

namespace sluice::kernels {

void PagedAttentionBoundedCpu(const float* q, int64_t q_token_stride, const float* k_cache,
                              const float* v_cache, const PagedSequence* sequences,
                              const int32_t* key_start, int64_t num_sequences,
                              const PagedAttentionParams& p, float* out) {
  struct Row {
    int32_t token, position, first_key;
    const int32_t* block_table;
  };
  std::vector<Row> rows;
  for (int64_t s = 0; s < num_sequences; ++s) {
    const PagedSequence& seq = sequences[s];
    const int32_t start = key_start != nullptr ? key_start[s] : 0;
    for (int32_t t = 0; t < seq.num_query_tokens; ++t) {
      const int32_t pos = seq.num_context_tokens + t;
      const int64_t window_lo = p.sliding_window > 0 ? pos - p.sliding_window + 1 : 0;
      rows.push_back({seq.query_start + t, pos,
                      static_cast<int32_t>(std::max<int64_t>(start, window_lo)),
                      seq.block_table});
    }
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t k_stride = p.num_kv_heads * p.head_dim;
  const int64_t v_stride = p.num_kv_heads * p.v_head_dim;
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  ParallelFor(num_rows * p.num_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(p.v_head_dim));
    for (int64_t u = begin; u < end; ++u) {
      const Row& r = rows[static_cast<size_t>(u / p.num_heads)];
      const int64_t h = u % p.num_heads, g = h / group;
      const float* qh = q + int64_t{r.token} * q_token_stride + h * p.head_dim;
      const int64_t n = int64_t{r.position} - r.first_key + 1;
      scores.resize(static_cast<size_t>(n));
      float max_score = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t key = r.first_key + j;
        const int64_t slot = int64_t{r.block_table[key / p.block_size]} * p.block_size +
                             key % p.block_size;
        const float* kh = k_cache + slot * k_stride + g * p.head_dim;
        float dot = 0.0f;
        for (int64_t d = 0; d < p.head_dim; ++d) dot += qh[d] * kh[d];
        scores[j] = dot * p.scale;
        max_score = std::max(max_score, scores[j]);
      }
      float sum = 0.0f;
      for (float& s : scores) {
        s = std::exp(s - max_score);
        sum += s;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t key = r.first_key + j;
        const int64_t slot = int64_t{r.block_table[key / p.block_size]} * p.block_size +
                             key % p.block_size;
        const float* vh = v_cache + slot * v_stride + g * p.v_head_dim;
        for (int64_t d = 0; d < p.v_head_dim; ++d) acc[d] += scores[j] * vh[d];
      }
      float* oh = out + int64_t{r.token} * p.num_heads * p.v_head_dim + h * p.v_head_dim;
      for (int64_t d = 0; d < p.v_head_dim; ++d) oh[d] = acc[d] / sum;
    }
  });
}

}  // namespace sluice::kernels
