// CPU MLA attention, absorbed form; see mla_attention.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/parallel.h"
#include "kernels/mla_attention/mla_attention.h"

namespace sluice::kernels {
namespace {

// Dot with 16 independent partial sums (vectorizable without -ffast-math); the summation order
// depends only on n.
inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
  return (acc[0] + acc[2]) + (acc[1] + acc[3]) + tail;
}

// Axpy: y += a * x.
inline void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

absl::Status MlaWriteCacheCpu(const float* latent, const int64_t* slot_mapping,
                              int64_t num_tokens, const MlaDims& dims, MlaPagedCache cache) {
  const int64_t width = dims.LatentWidth();
  const int64_t num_slots = cache.num_blocks * cache.block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0 || slot >= num_slots) {
      return absl::InvalidArgumentError(absl::StrCat("mla: token ", t, " slot ", slot,
                                                     " outside the cache of ", num_slots,
                                                     " slots"));
    }
    std::memcpy(cache.data + slot * width, latent + t * width, width * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status MlaAttentionCpu(const float* q, int64_t q_token_stride, const float* w_kv_b,
                             absl::Span<const MlaSequence> sequences, const MlaDims& dims,
                             const MlaPagedCache& cache, float* out) {
  const int64_t heads = dims.num_heads;
  const int64_t rank = dims.kv_lora_rank;
  const int64_t dn = dims.qk_nope_head_dim;
  const int64_t dr = dims.qk_rope_head_dim;
  const int64_t dv = dims.v_head_dim;
  const int64_t width = dims.LatentWidth();
  const int64_t bs = cache.block_size;

  // Validate the plan and map work items (token, head) to their sequence.
  int64_t num_tokens = 0;
  for (const MlaSequence& s : sequences) {
    const int64_t total = int64_t{s.num_context_tokens} + s.num_query_tokens;
    if (static_cast<int64_t>(s.block_table.size()) * bs < total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mla: block table of ", s.block_table.size(), " blocks cannot hold ", total, " tokens"));
    }
    const int64_t needed_blocks = (total + bs - 1) / bs;
    for (int64_t b = 0; b < needed_blocks; ++b) {
      if (s.block_table[b] < 0 || s.block_table[b] >= cache.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("mla: block id ", s.block_table[b],
                                                       " outside the cache of ",
                                                       cache.num_blocks, " blocks"));
      }
    }
    num_tokens = std::max<int64_t>(num_tokens, int64_t{s.query_start} + s.num_query_tokens);
  }
  // The calling thread's buffer; workers read it through the plain pointer below (a
  // thread_local named inside the lambda would be each worker's own instance).
  thread_local std::vector<int32_t> token_seq_buffer;
  token_seq_buffer.assign(num_tokens, -1);
  for (size_t i = 0; i < sequences.size(); ++i) {
    for (int32_t t = 0; t < sequences[i].num_query_tokens; ++t) {
      token_seq_buffer[sequences[i].query_start + t] = static_cast<int32_t>(i);
    }
  }
  const int32_t* token_seq = token_seq_buffer.data();

  ParallelFor(num_tokens * heads, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / heads;
      const int64_t h = item % heads;
      if (token_seq[t] < 0) continue;  // token not in any sequence: left untouched
      const MlaSequence& s = sequences[token_seq[t]];
      const int64_t num_keys = int64_t{s.num_context_tokens} + (t - s.query_start) + 1;
      scratch.resize(2 * rank + num_keys);
      float* q_lat = scratch.data();
      float* out_lat = q_lat + rank;
      float* scores = out_lat + rank;

      const float* q_nope = q + t * q_token_stride + h * (dn + dr);
      const float* q_pe = q_nope + dn;
      const float* w_uk = w_kv_b + h * (dn + dv) * rank;  // [dn, R]
      const float* w_uv = w_uk + dn * rank;               // [dv, R]
      std::fill(q_lat, q_lat + rank, 0.0f);
      for (int64_t d = 0; d < dn; ++d) Axpy(q_nope[d], w_uk + d * rank, q_lat, rank);

      float max_score = -INFINITY;
      for (int64_t j = 0; j < num_keys; ++j) {
        const int64_t slot = int64_t{s.block_table[j / bs]} * bs + j % bs;
        const float* entry = cache.data + slot * width;
        const float score =
            (Dot(q_lat, entry, rank) + Dot(q_pe, entry + rank, dr)) * dims.softmax_scale;
        scores[j] = score;
        max_score = std::max(max_score, score);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < num_keys; ++j) {
        scores[j] = std::exp(scores[j] - max_score);
        sum += scores[j];
      }
      const float inv_sum = 1.0f / sum;
      std::fill(out_lat, out_lat + rank, 0.0f);
      for (int64_t j = 0; j < num_keys; ++j) {
        const int64_t slot = int64_t{s.block_table[j / bs]} * bs + j % bs;
        Axpy(scores[j] * inv_sum, cache.data + slot * width, out_lat, rank);
      }
      float* o = out + t * heads * dv + h * dv;
      for (int64_t v = 0; v < dv; ++v) o[v] = Dot(w_uv + v * rank, out_lat, rank);
    }
  });
  return absl::OkStatus();
}

}  // namespace sluice::kernels
