#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention/paged_attention.h"
#include "kernels/common/parallel.h"

namespace sluice::kernels {
namespace {

// Dot product with 16 independent lanes (vectorizable without reassociation), fixed-order sum.
inline float Dot(const float* a, const float* b, int64_t n) {
  float lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) lane[l] += a[i + l] * b[i + l];
  }
  for (int w = 8; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  }
  float s = lane[0];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Work item: one query token with all query heads of one KV head.
struct Item {
  int32_t token;     // row in q / out
  int32_t position;  // absolute position of the query
  int32_t seq;
};

}  // namespace

void PagedAttentionCpu(const float* q, int64_t q_token_stride, const float* k_cache,
                       const float* v_cache, const PagedSequence* sequences,
                       int64_t num_sequences, const PagedAttentionParams& p, float* out) {
  std::vector<Item> items;
  for (int64_t s = 0; s < num_sequences; ++s) {
    const PagedSequence& seq = sequences[s];
    for (int32_t t = 0; t < seq.num_query_tokens; ++t) {
      items.push_back({seq.query_start + t, seq.num_context_tokens + t, static_cast<int32_t>(s)});
    }
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t kv_k_stride = p.num_kv_heads * p.head_dim;    // floats per cached token (K)
  const int64_t kv_v_stride = p.num_kv_heads * p.v_head_dim;  // floats per cached token (V)
  // A work unit is one query token and a run of query heads sharing a KV head (so its K/V rows
  // are reused from cache). With few units (small decode batches) each head is its own unit,
  // so long contexts still spread over all threads. Per-head arithmetic is the same either way.
  const int64_t num_items = static_cast<int64_t>(items.size());
  const int64_t heads_per_unit =
      num_items * p.num_kv_heads >= 2 * NumCpuThreads() ? group : 1;
  const int64_t units_per_token = p.num_heads / heads_per_unit;
  ParallelFor(num_items * units_per_token, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(p.v_head_dim));
    for (int64_t u = begin; u < end; ++u) {
      const Item& item = items[static_cast<size_t>(u / units_per_token)];
      const int64_t h0 = (u % units_per_token) * heads_per_unit;
      const int64_t kvh = h0 / group;
      const PagedSequence& seq = sequences[item.seq];
      const int64_t last = item.position;  // inclusive
      int64_t first = 0;
      if (p.sliding_window > 0) first = std::max<int64_t>(0, last - p.sliding_window + 1);
      const int64_t n_keys = last - first + 1;
      scores.resize(static_cast<size_t>(n_keys));
      for (int64_t h = h0; h < h0 + heads_per_unit; ++h) {
        const float* qh = q + item.token * q_token_stride + h * p.head_dim;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t j = first; j <= last; ++j) {
          const int64_t slot =
              static_cast<int64_t>(seq.block_table[j / p.block_size]) * p.block_size +
              j % p.block_size;
          const float s = Dot(qh, k_cache + slot * kv_k_stride + kvh * p.head_dim, p.head_dim) *
                          p.scale;
          scores[j - first] = s;
          max_score = std::max(max_score, s);
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < n_keys; ++i) {
          scores[i] = std::exp(scores[i] - max_score);
          sum += scores[i];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = first; j <= last; ++j) {
          const int64_t slot =
              static_cast<int64_t>(seq.block_table[j / p.block_size]) * p.block_size +
              j % p.block_size;
          const float* vj = v_cache + slot * kv_v_stride + kvh * p.v_head_dim;
          const float w = scores[j - first];
          for (int64_t d = 0; d < p.v_head_dim; ++d) acc[d] += w * vj[d];
        }
        const float inv = 1.0f / sum;
        float* o = out + (item.token * p.num_heads + h) * p.v_head_dim;
        for (int64_t d = 0; d < p.v_head_dim; ++d) o[d] = acc[d] * inv;
      }
    }
  });
}

void WriteKvCacheCpu(const float* k, int64_t k_token_stride, const float* v,
                     int64_t v_token_stride, const int64_t* slot_mapping, int64_t num_tokens,
                     int64_t k_floats_per_token, int64_t v_floats_per_token, float* k_cache,
                     float* v_cache) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    std::memcpy(k_cache + slot * k_floats_per_token, k + t * k_token_stride,
                static_cast<size_t>(k_floats_per_token) * sizeof(float));
    if (v_floats_per_token > 0) {
      std::memcpy(v_cache + slot * v_floats_per_token, v + t * v_token_stride,
                  static_cast<size_t>(v_floats_per_token) * sizeof(float));
    }
  }
}

}  // namespace sluice::kernels
