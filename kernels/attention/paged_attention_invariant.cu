#include "kernels/attention/paged_attention_invariant.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace sluice::kernels::attention_detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kGroupKeys = 4;             // keys a warp scores before one softmax update
// Channels per lane: the kernel is built for 1, 2, 4, 8, 16 and 32 (head dims up to 1024, MLA
// latent rows included) and a launch takes the smallest that covers max(head_dim, v_head_dim),
// a function of the model's dims only.
constexpr int kLargePerLane = 1024 / 32;
constexpr int kSplitKeys = static_cast<int>(kBatchInvariantSplitKeys);
static_assert(kSplitKeys % (kGroupKeys * kWarps) == 0);
// Workspace bound of one pass; longer launches run several passes of fewer tokens (at most
// kMaxPassTokens, the grid's y limit).
constexpr size_t kPassWorkspaceBytes = size_t{256} << 20;
constexpr int64_t kMaxPassTokens = 65535;
// Split CTAs per (head tile, token): each loops over every kSplitCtas-th split of the token.
constexpr int64_t kSplitCtas = 16;

struct InvArgs {
  const bf16* q;
  int64_t q_token_stride, q_head_stride;
  const bf16* k_cache;
  const bf16* v_cache;
  int64_t k_token_stride, v_token_stride;  // elements between consecutive cache slots
  const int32_t* query_start_loc;
  const int32_t* context_lens;
  const int32_t* block_tables;
  int64_t max_blocks_per_seq;
  int num_sequences, num_heads, num_kv_heads, group, head_dim, v_head_dim, block_size;
  int sliding_window;
  float scale;
  int token_begin;  // first token of this pass
  int num_splits;   // split slots per (token, head) in the workspace
  float* partial_ml;   // [pass tokens, heads, splits, 2]
  float* partial_acc;  // [pass tokens, heads, splits, v_head_dim]
  bf16* out;
};

// The sequence owning token t (the last s with query_start_loc[s] <= t; empty sequences share
// their start with the next one).
__device__ int SeqOf(const int32_t* qsl, int num_sequences, int t) {
  int lo = 0, hi = num_sequences - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (qsl[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

struct RowRange {
  int seq, lo, hi;  // visible keys [lo, hi]; seq < 0: padding row
};

__device__ RowRange RangeOf(const InvArgs& a, int t) {
  RowRange r{-1, 0, -1};
  if (t >= a.query_start_loc[a.num_sequences]) return r;
  r.seq = SeqOf(a.query_start_loc, a.num_sequences, t);
  const int pos = a.context_lens[r.seq] + (t - a.query_start_loc[r.seq]);
  r.hi = pos;
  r.lo = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  return r;
}

__device__ __forceinline__ float WarpSum(float v) {
  // Butterfly: lanes i and i ^ o add the same two values, so every lane ends with equal bits.
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A CTA reduces splits for a head tile (query heads [kG·x, kG·x + kG) of one KV head) of one
// token (InvariantSplitKernel below). Each warp reads a key's K and V row once for the
// kG heads; per head the arithmetic is that of kG = 1 (the same operations in the same order),
// so the tile only saves loads. Head tiles vary fastest, so a GQA group's tiles also share its
// rows through L2.
// ReduceSplit: split sp of token t (pass row `row`) for query heads [h0, h0 + kG); writes its
// partial (max, sum, V accumulator) per head. Called by the whole CTA (sp is CTA-uniform).
template <int kP, int kG>
__device__ __forceinline__ void ReduceSplit(const InvArgs& a, int t, int row, const RowRange& r,
                                            int h0, int sp) {
  const int kb = sp * kSplitKeys;
  const int ke = min(kb + kSplitKeys - 1, r.hi);
  if (ke < r.lo || kb > r.hi) return;  // the merge reads only splits in range
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = h0 / a.group;
  const int d = a.head_dim, dv = a.v_head_dim;

  float qv[kG][kP];
#pragma unroll
  for (int u = 0; u < kG; ++u) {
    const bf16* qrow =
        a.q + int64_t{t} * a.q_token_stride + int64_t{h0 + u} * a.q_head_stride;
#pragma unroll
    for (int i = 0; i < kP; ++i) {
      const int c = lane + 32 * i;
      qv[u][i] = c < d ? __bfloat162float(qrow[c]) : 0.0f;
    }
  }
  float m[kG], l[kG], acc[kG][kP];
#pragma unroll
  for (int u = 0; u < kG; ++u) {
    m[u] = -INFINITY;
    l[u] = 0.0f;
#pragma unroll
    for (int i = 0; i < kP; ++i) acc[u][i] = 0.0f;
  }
  const int32_t* table = a.block_tables + int64_t{r.seq} * a.max_blocks_per_seq;
  const int64_t k_row = a.k_token_stride, v_row = a.v_token_stride;

  for (int g = warp; g < kSplitKeys / kGroupKeys; g += kWarps) {
    const int p0 = kb + g * kGroupKeys;
    if (p0 > ke) break;
    if (p0 + kGroupKeys - 1 < r.lo) continue;
    float s[kGroupKeys][kG];
    int64_t slot[kGroupKeys];
#pragma unroll
    for (int j = 0; j < kGroupKeys; ++j) {
      const int p = p0 + j;
      const bool valid = p >= r.lo && p <= ke;  // warp-uniform
      slot[j] = -1;
      float kv[kP];
#pragma unroll
      for (int i = 0; i < kP; ++i) kv[i] = 0.0f;
      if (valid) {
        slot[j] = int64_t{table[p / a.block_size]} * a.block_size + p % a.block_size;
        const bf16* krow = a.k_cache + slot[j] * k_row + int64_t{kvh} * d;
#pragma unroll
        for (int i = 0; i < kP; ++i) {
          const int c = lane + 32 * i;
          if (c < d) kv[i] = __bfloat162float(krow[c]);
        }
      }
#pragma unroll
      for (int u = 0; u < kG; ++u) {
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < kP; ++i) {
          if (lane + 32 * i < d) part = fmaf(qv[u][i], kv[i], part);
        }
        const float dot = WarpSum(part);  // every lane takes part
        s[j][u] = valid ? dot * a.scale : -INFINITY;
      }
    }
    float pj[kGroupKeys][kG];
#pragma unroll
    for (int u = 0; u < kG; ++u) {
      float mx = m[u];
#pragma unroll
      for (int j = 0; j < kGroupKeys; ++j) mx = fmaxf(mx, s[j][u]);
      const float corr = expf(m[u] - mx);  // m = -inf first: 0 (acc and l are still 0)
#pragma unroll
      for (int j = 0; j < kGroupKeys; ++j) pj[j][u] = slot[j] >= 0 ? expf(s[j][u] - mx) : 0.0f;
      l[u] = l[u] * corr;
#pragma unroll
      for (int j = 0; j < kGroupKeys; ++j) l[u] += pj[j][u];
#pragma unroll
      for (int i = 0; i < kP; ++i) acc[u][i] *= corr;
      m[u] = mx;
    }
#pragma unroll
    for (int j = 0; j < kGroupKeys; ++j) {
      if (slot[j] < 0) continue;  // never read V of a key outside the range
      const bf16* vrow = a.v_cache + slot[j] * v_row + int64_t{kvh} * dv;
#pragma unroll
      for (int i = 0; i < kP; ++i) {
        const int c = lane + 32 * i;
        if (c >= dv) continue;
        const float v = __bfloat162float(vrow[c]);
#pragma unroll
        for (int u = 0; u < kG; ++u) acc[u][i] = fmaf(pj[j][u], v, acc[u][i]);
      }
    }
  }

  // Merge the warps in warp order (warps without keys hold m = -inf, l = 0, acc = 0).
  __shared__ float s_m[kWarps][kG], s_l[kWarps][kG];
  __shared__ float s_acc[kWarps][kG][kP * 32];  // 16 KiB at the largest (kP · kG <= 32)
#pragma unroll
  for (int u = 0; u < kG; ++u) {
    if (lane == 0) {
      s_m[warp][u] = m[u];
      s_l[warp][u] = l[u];
    }
#pragma unroll
    for (int i = 0; i < kP; ++i) s_acc[warp][u][lane + 32 * i] = acc[u][i];
  }
  __syncthreads();
  for (int u = 0; u < kG; ++u) {
    float mt = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mt = fmaxf(mt, s_m[w][u]);
    const int64_t slot_index = (int64_t{row} * a.num_heads + h0 + u) * a.num_splits + sp;
    if (threadIdx.x == 0) {
      float lt = 0.0f;
      for (int w = 0; w < kWarps; ++w) lt += s_l[w][u] * expf(s_m[w][u] - mt);
      a.partial_ml[slot_index * 2] = mt;
      a.partial_ml[slot_index * 2 + 1] = lt;
    }
    for (int c = threadIdx.x; c < dv; c += kThreads) {
      float v = 0.0f;
      for (int w = 0; w < kWarps; ++w) v += s_acc[w][u][c] * expf(s_m[w][u] - mt);
      a.partial_acc[slot_index * dv + c] = v;
    }
  }
  __syncthreads();  // the shared arrays are reused by the CTA's next split
}

// One CTA: (head tile blockIdx.x, token blockIdx.y of the pass) and splits first + blockIdx.z,
// + gridDim.z, ... of the token's range (gridDim.z: at most kSplitCtas, a constant, so a long
// max_seq_len does not launch CTAs that find nothing to do; which CTA reduces a split does not
// change what it computes).
template <int kP, int kG>
__global__ void __launch_bounds__(kThreads) InvariantSplitKernel(InvArgs a) {
  const int row = static_cast<int>(blockIdx.y);
  const int t = a.token_begin + row;
  const RowRange r = RangeOf(a, t);
  if (r.seq < 0) return;
  const int first = r.lo / kSplitKeys, last = r.hi / kSplitKeys;
  for (int sp = first + static_cast<int>(blockIdx.z); sp <= last;
       sp += static_cast<int>(gridDim.z)) {
    ReduceSplit<kP, kG>(a, t, row, r, static_cast<int>(blockIdx.x) * kG, sp);
  }
}

// Heads per CTA: the largest of 8, 4, 2, 1 that divides the GQA group, while kP · kG <= 32
// keeps the registers and shared memory in bounds (MLA's wide latent rows take 1). A function
// of the model's dims only.
int HeadTile(int64_t group, int per_lane) {
  for (int g : {8, 4, 2}) {
    if (group % g == 0 && per_lane * g <= 32) return g;
  }
  return 1;
}

template <int kP>
void LaunchSplit(const InvArgs& a, dim3 grid, int head_tile, cudaStream_t stream) {
  grid.x /= static_cast<unsigned>(head_tile);
  if constexpr (kP * 8 <= 32) {
    if (head_tile == 8) return InvariantSplitKernel<kP, 8><<<grid, kThreads, 0, stream>>>(a);
  }
  if constexpr (kP * 4 <= 32) {
    if (head_tile == 4) return InvariantSplitKernel<kP, 4><<<grid, kThreads, 0, stream>>>(a);
  }
  if constexpr (kP * 2 <= 32) {
    if (head_tile == 2) return InvariantSplitKernel<kP, 2><<<grid, kThreads, 0, stream>>>(a);
  }
  grid.x *= static_cast<unsigned>(head_tile);  // HeadTile never asks for more: one head a CTA
  InvariantSplitKernel<kP, 1><<<grid, kThreads, 0, stream>>>(a);
}

// One CTA per (token of the pass, head): merges the row's splits in split order.
__global__ void __launch_bounds__(kThreads) InvariantMergeKernel(InvArgs a) {
  const int t = a.token_begin + static_cast<int>(blockIdx.x);
  const int h = blockIdx.y;
  const int dv = a.v_head_dim;
  bf16* orow = a.out + (int64_t{t} * a.num_heads + h) * dv;
  const RowRange r = RangeOf(a, t);
  if (r.seq < 0) {
    for (int c = threadIdx.x; c < dv; c += kThreads) orow[c] = __float2bfloat16_rn(0.0f);
    return;
  }
  const int first = r.lo / kSplitKeys, last = r.hi / kSplitKeys;
  const int64_t base = (int64_t{static_cast<int>(blockIdx.x)} * a.num_heads + h) * a.num_splits;
  float mt = -INFINITY;
  for (int sp = first; sp <= last; ++sp) mt = fmaxf(mt, a.partial_ml[(base + sp) * 2]);
  float lt = 0.0f;
  for (int sp = first; sp <= last; ++sp) {
    lt += a.partial_ml[(base + sp) * 2 + 1] * expf(a.partial_ml[(base + sp) * 2] - mt);
  }
  for (int c = threadIdx.x; c < dv; c += kThreads) {
    float v = 0.0f;
    for (int sp = first; sp <= last; ++sp) {
      v += a.partial_acc[(base + sp) * dv + c] * expf(a.partial_ml[(base + sp) * 2] - mt);
    }
    orow[c] = __float2bfloat16_rn(v / lt);
  }
}

size_t BytesPerToken(int64_t num_heads, int64_t v_head_dim, int64_t splits) {
  return static_cast<size_t>(num_heads * splits * (2 + v_head_dim)) * sizeof(float);
}

int64_t TokensPerPass(const PagedAttentionCudaBatch& batch, int64_t num_heads,
                      int64_t v_head_dim) {
  const size_t per_token = BytesPerToken(num_heads, v_head_dim, BatchInvariantSplits(batch));
  const int64_t fit = static_cast<int64_t>(kPassWorkspaceBytes / std::max<size_t>(per_token, 1));
  return std::clamp<int64_t>(fit, 1, std::min(batch.num_tokens, kMaxPassTokens));
}

}  // namespace

int64_t BatchInvariantSplits(const PagedAttentionCudaBatch& batch) {
  return (batch.max_seq_len + kBatchInvariantSplitKeys - 1) / kBatchInvariantSplitKeys;
}

size_t BatchInvariantWorkspaceBytes(const PagedAttentionCudaBatch& batch, int64_t num_heads,
                                    int64_t v_head_dim) {
  return static_cast<size_t>(TokensPerPass(batch, num_heads, v_head_dim)) *
         BytesPerToken(num_heads, v_head_dim, BatchInvariantSplits(batch));
}

size_t BatchInvariantWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                    const PagedAttentionParams& params) {
  return BatchInvariantWorkspaceBytes(batch, params.num_heads, params.v_head_dim);
}

absl::Status LaunchBatchInvariantAttention(const bf16* q, int64_t q_token_stride,
                                           const bf16* k_cache, const bf16* v_cache,
                                           const PagedAttentionCudaBatch& batch,
                                           const PagedAttentionParams& params, void* workspace,
                                           bf16* out, cudaStream_t stream) {
  BatchInvariantLayout l;
  l.num_heads = params.num_heads;
  l.num_kv_heads = params.num_kv_heads;
  l.head_dim = params.head_dim;
  l.v_head_dim = params.v_head_dim;
  l.block_size = params.block_size;
  l.sliding_window = params.sliding_window;
  l.scale = params.scale;
  l.q_token_stride = q_token_stride;
  l.q_head_stride = params.head_dim;
  l.k_token_stride = params.num_kv_heads * params.head_dim;
  l.v_token_stride = params.num_kv_heads * params.v_head_dim;
  return LaunchBatchInvariantAttention(q, k_cache, v_cache, batch, l, workspace, out, stream);
}

absl::Status LaunchBatchInvariantAttention(const bf16* q, const bf16* k_cache,
                                           const bf16* v_cache,
                                           const PagedAttentionCudaBatch& batch,
                                           const BatchInvariantLayout& params, void* workspace,
                                           bf16* out, cudaStream_t stream) {
  if (std::max(params.head_dim, params.v_head_dim) > kLargePerLane * 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch-invariant attention: head dims ", params.head_dim, "/", params.v_head_dim,
        " above ", kLargePerLane * 32));
  }
  const int64_t splits = BatchInvariantSplits(batch);
  if (splits > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionCuda (batch invariant): max_seq_len ", batch.max_seq_len, " needs ",
        splits, " splits, more than a grid dimension holds (65535)"));
  }
  if (workspace == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionCuda (batch invariant): needs a workspace of ",
        BatchInvariantWorkspaceBytes(batch, params.num_heads, params.v_head_dim),
        " bytes (PagedAttentionCudaWorkspaceBytes)"));
  }
  const int64_t pass = TokensPerPass(batch, params.num_heads, params.v_head_dim);
  InvArgs a;
  a.q = q;
  a.q_token_stride = params.q_token_stride;
  a.q_head_stride = params.q_head_stride;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.k_token_stride = params.k_token_stride;
  a.v_token_stride = params.v_token_stride;
  a.query_start_loc = batch.query_start_loc;
  a.context_lens = batch.context_lens;
  a.block_tables = batch.block_tables;
  a.max_blocks_per_seq = batch.max_blocks_per_seq;
  a.num_sequences = static_cast<int>(batch.num_sequences);
  a.num_heads = static_cast<int>(params.num_heads);
  a.num_kv_heads = static_cast<int>(params.num_kv_heads);
  a.group = static_cast<int>(params.num_heads / params.num_kv_heads);
  a.head_dim = static_cast<int>(params.head_dim);
  a.v_head_dim = static_cast<int>(params.v_head_dim);
  a.block_size = static_cast<int>(params.block_size);
  a.sliding_window = static_cast<int>(params.sliding_window);
  a.scale = params.scale;
  a.num_splits = static_cast<int>(splits);
  a.partial_ml = static_cast<float*>(workspace);
  a.partial_acc = a.partial_ml + pass * params.num_heads * splits * 2;
  a.out = out;
  for (int64_t t0 = 0; t0 < batch.num_tokens; t0 += pass) {
    const int64_t n = std::min(pass, batch.num_tokens - t0);
    a.token_begin = static_cast<int>(t0);
    const dim3 grid(static_cast<unsigned>(params.num_heads), static_cast<unsigned>(n),
                    static_cast<unsigned>(std::min(splits, kSplitCtas)));
    const int64_t dims = std::max(params.head_dim, params.v_head_dim);
    const int per_lane = dims <= 32 ? 1 : dims <= 64 ? 2 : dims <= 128 ? 4 : dims <= 256 ? 8
                       : dims <= 512 ? 16 : kLargePerLane;
    const int tile = HeadTile(params.num_heads / params.num_kv_heads, per_lane);
    switch (per_lane) {
      case 1: LaunchSplit<1>(a, grid, tile, stream); break;
      case 2: LaunchSplit<2>(a, grid, tile, stream); break;
      case 4: LaunchSplit<4>(a, grid, tile, stream); break;
      case 8: LaunchSplit<8>(a, grid, tile, stream); break;
      case 16: LaunchSplit<16>(a, grid, tile, stream); break;
      default: LaunchSplit<kLargePerLane>(a, grid, tile, stream); break;
    }
    InvariantMergeKernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(params.num_heads)),
                           kThreads, 0, stream>>>(a);
  }
  return CudaLaunchStatus("PagedAttentionCuda (batch invariant)");
}

}  // namespace sluice::kernels::attention_detail
