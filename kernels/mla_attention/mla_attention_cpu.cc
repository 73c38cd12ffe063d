// CPU MLA attention, absorbed form; see mla_attention.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/isa_clones.h"
#include "kernels/common/parallel.h"
#include "kernels/common/vec16.h"
#include "kernels/mla_attention/mla_attention.h"

namespace sluice::kernels {
namespace {

using simd::kLanes;
using simd::Load;
using simd::Reduce;
using simd::Reduce4;
using simd::Store;
using simd::V16;

// DotN computes N dot products a · b[i] (each of length n) with N independent accumulators.
// The arithmetic of each result is that of DotN<1>: lane l sums the products of indices
// ≡ l (mod 16) in increasing order, then Reduce, then the n % 16 tail in increasing order.
template <int N>
inline void DotN(const float* a, const float* const* b, int64_t n, float* out) {
  V16 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = V16{};
  const int64_t main = n - n % kLanes;
  for (int64_t k = 0; k < main; k += kLanes) {
    const V16 av = Load(a + k);
    for (int i = 0; i < N; ++i) acc[i] += av * Load(b[i] + k);
  }
  float sums[N];
  if constexpr (N == 4) {
    Reduce4(acc[0], acc[1], acc[2], acc[3], sums);
  } else {
    for (int i = 0; i < N; ++i) sums[i] = Reduce(acc[i]);
  }
  for (int i = 0; i < N; ++i) {
    float s = sums[i];
    for (int64_t k = main; k < n; ++k) s += a[k] * b[i][k];
    out[i] = s;
  }
}

inline float Dot(const float* a, const float* b, int64_t n) {
  float out;
  DotN<1>(a, &b, n, &out);
  return out;
}

// WeightedRowSum: y[0..n) = Σ_j coef[j] · rows[j][0..n), j in increasing order, accumulated in
// registers over column chunks of 64 floats (the per-element order does not depend on chunking).
inline void WeightedRowSum(const float* coef, const float* const* rows, int64_t num_rows,
                           int64_t n, float* y) {
  constexpr int kChunk = 4;  // vectors per chunk
  int64_t c = 0;
  for (; c + kChunk * kLanes <= n; c += kChunk * kLanes) {
    V16 acc[kChunk];
    for (int i = 0; i < kChunk; ++i) acc[i] = V16{};
    for (int64_t j = 0; j < num_rows; ++j) {
      const float w = coef[j];
      for (int i = 0; i < kChunk; ++i) acc[i] += w * Load(rows[j] + c + i * kLanes);
    }
    for (int i = 0; i < kChunk; ++i) Store(y + c + i * kLanes, acc[i]);
  }
  for (; c < n; ++c) {
    float acc = 0.0f;
    for (int64_t j = 0; j < num_rows; ++j) acc += coef[j] * rows[j][c];
    y[c] = acc;
  }
}

// The arguments of MlaAttentionCpu that AttendItems reads; token_seq maps a query token to its
// sequence (-1: none).
struct MlaItems {
  const float* q;
  int64_t q_token_stride;
  const float* w_kv_b;
  absl::Span<const MlaSequence> sequences;
  const MlaDims& dims;
  const MlaPagedCache& cache;
  const int32_t* token_seq;
  float* out;
};

// AttendItems computes the work items (token, head) in [begin, end): absorbed scores over the
// latent cache, softmax, then W_UV. scratch holds 2 · rank + (keys) floats, row_ptrs
// max(keys, qk_nope_head_dim) pointers.
SLUICE_AVX512_CLONES void AttendItems(const MlaItems& a, int64_t begin, int64_t end,
                                      float* scratch, const float** row_ptrs) {
  const MlaDims& dims = a.dims;
  const int64_t heads = dims.num_heads;
  const int64_t rank = dims.kv_lora_rank;
  const int64_t dn = dims.qk_nope_head_dim;
  const int64_t dr = dims.qk_rope_head_dim;
  const int64_t dv = dims.v_head_dim;
  const int64_t width = dims.LatentWidth();
  const int64_t bs = a.cache.block_size;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / heads;
    const int64_t h = item % heads;
    if (a.token_seq[t] < 0) continue;  // token not in any sequence: left untouched
    const MlaSequence& s = a.sequences[a.token_seq[t]];
    const int64_t num_keys = int64_t{s.num_context_tokens} + (t - s.query_start) + 1;
    float* q_lat = scratch;
    float* out_lat = q_lat + rank;
    float* scores = out_lat + rank;

    const float* q_nope = a.q + t * a.q_token_stride + h * (dn + dr);
    const float* q_pe = q_nope + dn;
    const float* w_uk = a.w_kv_b + h * (dn + dv) * rank;  // [dn, R]
    const float* w_uv = w_uk + dn * rank;               // [dv, R]
    const float** rows = row_ptrs;
    // q_lat = W_UKᵀ · q_nope: a weighted sum of the dn rows of W_UK.
    for (int64_t d = 0; d < dn; ++d) rows[d] = w_uk + d * rank;
    WeightedRowSum(q_nope, rows, dn, rank, q_lat);

    for (int64_t j = 0; j < num_keys; ++j) {
      rows[j] = a.cache.data + (int64_t{s.block_table[j / bs]} * bs + j % bs) * width;
    }
    float max_score = -INFINITY;
    int64_t j = 0;
    for (; j + 4 <= num_keys; j += 4) {
      float lat[4], pe[4];
      const float* pe_rows[4] = {rows[j] + rank, rows[j + 1] + rank, rows[j + 2] + rank,
                                 rows[j + 3] + rank};
      DotN<4>(q_lat, rows + j, rank, lat);
      DotN<4>(q_pe, pe_rows, dr, pe);
      for (int i = 0; i < 4; ++i) {
        scores[j + i] = (lat[i] + pe[i]) * dims.softmax_scale;
        max_score = std::max(max_score, scores[j + i]);
      }
    }
    for (; j < num_keys; ++j) {
      scores[j] = (Dot(q_lat, rows[j], rank) + Dot(q_pe, rows[j] + rank, dr)) *
                  dims.softmax_scale;
      max_score = std::max(max_score, scores[j]);
    }
    float sum = 0.0f;
    for (j = 0; j < num_keys; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      sum += scores[j];
    }
    const float inv_sum = 1.0f / sum;
    for (j = 0; j < num_keys; ++j) scores[j] *= inv_sum;
    WeightedRowSum(scores, rows, num_keys, rank, out_lat);

    // out_h = W_UV · out_lat.
    float* o = a.out + t * heads * dv + h * dv;
    int64_t v = 0;
    for (; v + 4 <= dv; v += 4) {
      const float* uv_rows[4] = {w_uv + v * rank, w_uv + (v + 1) * rank, w_uv + (v + 2) * rank,
                                 w_uv + (v + 3) * rank};
      DotN<4>(out_lat, uv_rows, rank, o + v);
    }
    for (; v < dv; ++v) o[v] = Dot(w_uv + v * rank, out_lat, rank);
  }
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

  // Chunks of at least ~256K multiply-adds: a ParallelFor dispatch costs more than a short
  // decode attention (the pool wakes its workers through a condition variable).
  int64_t max_keys = 1;
  for (const MlaSequence& s : sequences) {
    max_keys = std::max<int64_t>(max_keys, int64_t{s.num_context_tokens} + s.num_query_tokens);
  }
  const int64_t item_work = (dn + dv) * rank + max_keys * (2 * rank + dr);
  const int64_t min_chunk = std::max<int64_t>(1, (int64_t{1} << 18) / item_work);
  const MlaItems items{q, q_token_stride, w_kv_b, sequences, dims, cache, token_seq, out};
  const int64_t scratch_floats = 2 * rank + max_keys;
  const int64_t scratch_rows = std::max(max_keys, dn);
  ParallelFor(num_tokens * heads, min_chunk, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    thread_local std::vector<const float*> row_ptrs;
    if (static_cast<int64_t>(scratch.size()) < scratch_floats) scratch.resize(scratch_floats);
    if (static_cast<int64_t>(row_ptrs.size()) < scratch_rows) row_ptrs.resize(scratch_rows);
    AttendItems(items, begin, end, scratch.data(), row_ptrs.data());
  });
  return absl::OkStatus();
}

}  // namespace sluice::kernels
