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

// DotTile computes the G × N dot products a[g] · b[i] (each of length n) with G · N independent
// accumulators, each b[i] vector loaded once for all G queries. The arithmetic of each result
// is that of a single dot product: lane l sums the products of indices ≡ l (mod 16) in
// increasing order, then Reduce (Reduce4 gives the same bits), then the n % 16 tail in
// increasing order — so a result does not depend on G, N or its place in the tile.
template <int G, int N>
inline void DotTile(const float* const* a, const float* const* b, int64_t n, float (*out)[N]) {
  V16 acc[G][N];
  for (int g = 0; g < G; ++g) {
    for (int i = 0; i < N; ++i) acc[g][i] = V16{};
  }
  const int64_t main = n - n % kLanes;
  for (int64_t k = 0; k < main; k += kLanes) {
    V16 bv[N];
    for (int i = 0; i < N; ++i) bv[i] = Load(b[i] + k);
    for (int g = 0; g < G; ++g) {
      const V16 av = Load(a[g] + k);
      for (int i = 0; i < N; ++i) acc[g][i] += av * bv[i];
    }
  }
  for (int g = 0; g < G; ++g) {
    float sums[N];
    if constexpr (N == 4) {
      Reduce4(acc[g][0], acc[g][1], acc[g][2], acc[g][3], sums);
    } else {
      for (int i = 0; i < N; ++i) sums[i] = Reduce(acc[g][i]);
    }
    for (int i = 0; i < N; ++i) {
      float s = sums[i];
      for (int64_t k = main; k < n; ++k) s += a[g][k] * b[i][k];
      out[g][i] = s;
    }
  }
}

template <int N>
inline void DotN(const float* a, const float* const* b, int64_t n, float* out) {
  float tile[1][N];
  DotTile<1, N>(&a, b, n, tile);
  for (int i = 0; i < N; ++i) out[i] = tile[0][i];
}

inline float Dot(const float* a, const float* b, int64_t n) {
  float out;
  DotN<1>(a, &b, n, &out);
  return out;
}

// WeightedRowSums: for each g < G, y[g][0..n) = Σ_{j < num_rows[g]} coef[g][j] · rows[j][0..n),
// j in increasing order, accumulated in registers over column chunks of 64 floats; the rows
// every g sums (j < min num_rows) are loaded once for all G. The per-element order depends on
// neither the chunking nor G.
template <int G>
inline void WeightedRowSums(const float* const* coef, const float* const* rows,
                            const int64_t* num_rows, int64_t n, float* const* y) {
  constexpr int kChunk = 4;  // vectors per chunk
  int64_t shared = num_rows[0];
  for (int g = 1; g < G; ++g) shared = std::min(shared, num_rows[g]);
  int64_t c = 0;
  for (; c + kChunk * kLanes <= n; c += kChunk * kLanes) {
    V16 acc[G][kChunk];
    for (int g = 0; g < G; ++g) {
      for (int i = 0; i < kChunk; ++i) acc[g][i] = V16{};
    }
    for (int64_t j = 0; j < shared; ++j) {
      V16 row[kChunk];
      for (int i = 0; i < kChunk; ++i) row[i] = Load(rows[j] + c + i * kLanes);
      for (int g = 0; g < G; ++g) {
        const float w = coef[g][j];
        for (int i = 0; i < kChunk; ++i) acc[g][i] += w * row[i];
      }
    }
    for (int g = 0; g < G; ++g) {
      for (int64_t j = shared; j < num_rows[g]; ++j) {
        const float w = coef[g][j];
        for (int i = 0; i < kChunk; ++i) acc[g][i] += w * Load(rows[j] + c + i * kLanes);
      }
      for (int i = 0; i < kChunk; ++i) Store(y[g] + c + i * kLanes, acc[g][i]);
    }
  }
  for (; c < n; ++c) {
    for (int g = 0; g < G; ++g) {
      float acc = 0.0f;
      for (int64_t j = 0; j < num_rows[g]; ++j) acc += coef[g][j] * rows[j][c];
      y[g][c] = acc;
    }
  }
}

inline void WeightedRowSum(const float* coef, const float* const* rows, int64_t num_rows,
                           int64_t n, float* y) {
  WeightedRowSums<1>(&coef, rows, &num_rows, n, &y);
}

// ExpShifted: v[j] = e^(v[j] - shift) for j < n, 16 at a time (simd::Exp); the last partial
// vector goes through a padded copy so every element gets the same arithmetic.
inline void ExpShifted(float* v, int64_t n, float shift) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) Store(v + j, simd::Exp(Load(v + j) - shift));
  if (j < n) {
    float tail[kLanes] = {};
    std::memcpy(tail, v + j, (n - j) * sizeof(float));
    Store(tail, simd::Exp(Load(tail) - shift));
    std::memcpy(v + j, tail, (n - j) * sizeof(float));
  }
}

// Query tokens of one sequence that one work item attends together (a speculative verify step
// of k = 5 drafts is one group per head): each cached latent row is loaded once for all of them.
constexpr int kMaxGroup = 6;

// MlaGroup: query tokens [first_token, first_token + count) of sequence `seq`, consecutive
// positions.
struct MlaGroup {
  int32_t seq;
  int32_t first_token;
  int32_t count;
};

// The arguments of MlaAttentionCpu that AttendItems reads.
struct MlaItems {
  const float* q;
  int64_t q_token_stride;
  const float* w_kv_b;
  absl::Span<const MlaSequence> sequences;
  const MlaDims& dims;
  const MlaPagedCache& cache;
  absl::Span<const MlaGroup> groups;
  int64_t scores_stride;  // floats per query's score row (the step's longest key count)
  float* out;
};

// AttendGroup computes head h of the G query tokens of `group`: absorbed scores over the latent
// cache, softmax, then W_UV. scratch holds G · (2 · rank + scores_stride) floats, row_ptrs
// max(keys, qk_nope_head_dim) pointers.
template <int G>
inline void AttendGroup(const MlaItems& a, const MlaGroup& group, int64_t h, float* scratch,
                        const float** row_ptrs) {
  const MlaDims& dims = a.dims;
  const int64_t heads = dims.num_heads;
  const int64_t rank = dims.kv_lora_rank;
  const int64_t dn = dims.qk_nope_head_dim;
  const int64_t dr = dims.qk_rope_head_dim;
  const int64_t dv = dims.v_head_dim;
  const int64_t width = dims.LatentWidth();
  const int64_t bs = a.cache.block_size;
  const MlaSequence& s = a.sequences[group.seq];
  // Query g attends the keys [0, num_keys[g]): its context, the earlier new tokens and itself.
  int64_t num_keys[G];
  for (int g = 0; g < G; ++g) {
    num_keys[g] = int64_t{s.num_context_tokens} + (group.first_token - s.query_start) + g + 1;
  }
  const int64_t max_keys = num_keys[G - 1];
  float* q_lat[G];
  float* out_lat[G];
  float* scores[G];
  const float* q_nope[G];
  const float* q_pe[G];
  for (int g = 0; g < G; ++g) {
    q_lat[g] = scratch + g * rank;
    out_lat[g] = scratch + (G + g) * rank;
    scores[g] = scratch + 2 * G * rank + g * a.scores_stride;
    q_nope[g] = a.q + (group.first_token + g) * a.q_token_stride + h * (dn + dr);
    q_pe[g] = q_nope[g] + dn;
  }
  const float* w_uk = a.w_kv_b + h * (dn + dv) * rank;  // [dn, R]
  const float* w_uv = w_uk + dn * rank;               // [dv, R]
  const float** rows = row_ptrs;
  // q_lat = W_UKᵀ · q_nope: a weighted sum of the dn rows of W_UK.
  for (int64_t d = 0; d < dn; ++d) rows[d] = w_uk + d * rank;
  for (int g = 0; g < G; ++g) WeightedRowSum(q_nope[g], rows, dn, rank, q_lat[g]);

  for (int64_t j = 0; j < max_keys; ++j) {
    rows[j] = a.cache.data + (int64_t{s.block_table[j / bs]} * bs + j % bs) * width;
  }
  float max_score[G];
  for (int g = 0; g < G; ++g) max_score[g] = -INFINITY;
  const float* const* q_lat_c = q_lat;
  int64_t j = 0;
  for (; j + 4 <= max_keys; j += 4) {
    float lat[G][4], pe[G][4];
    const float* pe_rows[4] = {rows[j] + rank, rows[j + 1] + rank, rows[j + 2] + rank,
                               rows[j + 3] + rank};
    DotTile<G, 4>(q_lat_c, rows + j, rank, lat);
    DotTile<G, 4>(q_pe, pe_rows, dr, pe);
    for (int g = 0; g < G; ++g) {
      for (int i = 0; i < 4 && j + i < num_keys[g]; ++i) {
        scores[g][j + i] = (lat[g][i] + pe[g][i]) * dims.softmax_scale;
        max_score[g] = std::max(max_score[g], scores[g][j + i]);
      }
    }
  }
  for (; j < max_keys; ++j) {
    for (int g = 0; g < G; ++g) {
      if (j >= num_keys[g]) continue;
      scores[g][j] = (Dot(q_lat[g], rows[j], rank) + Dot(q_pe[g], rows[j] + rank, dr)) *
                     dims.softmax_scale;
      max_score[g] = std::max(max_score[g], scores[g][j]);
    }
  }
  for (int g = 0; g < G; ++g) {
    ExpShifted(scores[g], num_keys[g], max_score[g]);
    float sum = 0.0f;
    for (j = 0; j < num_keys[g]; ++j) sum += scores[g][j];
    const float inv_sum = 1.0f / sum;
    for (j = 0; j < num_keys[g]; ++j) scores[g][j] *= inv_sum;
  }
  const float* const* scores_c = scores;
  WeightedRowSums<G>(scores_c, rows, num_keys, rank, out_lat);

  // out_h = W_UV · out_lat.
  for (int g = 0; g < G; ++g) {
    float* o = a.out + (group.first_token + g) * heads * dv + h * dv;
    int64_t v = 0;
    for (; v + 4 <= dv; v += 4) {
      const float* uv_rows[4] = {w_uv + v * rank, w_uv + (v + 1) * rank, w_uv + (v + 2) * rank,
                                 w_uv + (v + 3) * rank};
      DotN<4>(out_lat[g], uv_rows, rank, o + v);
    }
    for (; v < dv; ++v) o[v] = Dot(w_uv + v * rank, out_lat[g], rank);
  }
}

// AttendItems computes the work items (group, head) in [begin, end).
SLUICE_AVX512_CLONES void AttendItems(const MlaItems& a, int64_t begin, int64_t end,
                                      float* scratch, const float** row_ptrs) {
  const int64_t heads = a.dims.num_heads;
  for (int64_t item = begin; item < end; ++item) {
    const MlaGroup& group = a.groups[item / heads];
    const int64_t h = item % heads;
    switch (group.count) {
      case 1: AttendGroup<1>(a, group, h, scratch, row_ptrs); break;
      case 2: AttendGroup<2>(a, group, h, scratch, row_ptrs); break;
      case 3: AttendGroup<3>(a, group, h, scratch, row_ptrs); break;
      case 4: AttendGroup<4>(a, group, h, scratch, row_ptrs); break;
      case 5: AttendGroup<5>(a, group, h, scratch, row_ptrs); break;
      default: AttendGroup<kMaxGroup>(a, group, h, scratch, row_ptrs); break;
    }
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

  // Validate the plan.
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
  }
  // Work items: each sequence's query tokens in groups of at most kMaxGroup (balanced sizes),
  // times the heads. The calling thread's buffer; workers read it through the span below (a
  // thread_local named inside the lambda would be each worker's own instance).
  thread_local std::vector<MlaGroup> group_buffer;
  group_buffer.clear();
  int64_t max_keys = 1;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const MlaSequence& s = sequences[i];
    max_keys = std::max<int64_t>(max_keys, int64_t{s.num_context_tokens} + s.num_query_tokens);
    const int32_t num_groups = (s.num_query_tokens + kMaxGroup - 1) / kMaxGroup;
    int32_t first = s.query_start;
    for (int32_t g = 0; g < num_groups; ++g) {
      // Sizes differ by at most one: a 7-token chunk is 4 + 3, not 6 + 1.
      const int32_t count = (s.num_query_tokens * (g + 1)) / num_groups -
                            (s.num_query_tokens * g) / num_groups;
      group_buffer.push_back({static_cast<int32_t>(i), first, count});
      first += count;
    }
  }
  const int64_t num_items = static_cast<int64_t>(group_buffer.size()) * heads;

  // Chunks of at least ~256K multiply-adds: a ParallelFor dispatch costs more than a short
  // decode attention (the pool wakes its workers through a condition variable).
  const int64_t item_work = (dn + dv) * rank + max_keys * (2 * rank + dr);
  const int64_t min_chunk = std::max<int64_t>(1, (int64_t{1} << 18) / item_work);
  const MlaItems items{q,     q_token_stride, w_kv_b, sequences, dims,
                       cache, group_buffer,   max_keys, out};
  const int64_t scratch_floats = kMaxGroup * (2 * rank + max_keys);
  const int64_t scratch_rows = std::max(max_keys, dn);
  ParallelFor(num_items, min_chunk, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    thread_local std::vector<const float*> row_ptrs;
    if (static_cast<int64_t>(scratch.size()) < scratch_floats) scratch.resize(scratch_floats);
    if (static_cast<int64_t>(row_ptrs.size()) < scratch_rows) row_ptrs.resize(scratch_rows);
    AttendItems(items, begin, end, scratch.data(), row_ptrs.data());
  });
  return absl::OkStatus();
}

}  // namespace sluice::kernels
