// CUDA routed experts; see moe_cuda.h for the API and moe_experts.h for the CPU reference.
//
// Four launches, all sized from host-known bounds so nothing is read back:
//   1. MoeSortKernel (one block): histogram of the (token, k) rows by expert, exclusive scans
//      into row offsets, tile offsets (grouped path) and the list of touched experts (GEMV
//      and streaming paths), then the permutation sorted_rows / row_to_sorted. Positions within
//      an expert come from shared-memory atomics, so their order may vary between runs; every
//      row is computed independently of its neighbours, so the results do not.
//   2. gate/up + SiLU·mul → act [rows, I] bf16 (sorted order), x rows gathered on load.
//   3. down → expert_out [rows, H] bf16 (sorted order).
//   4. MoeCombineKernel: out[t] = Σ_k w[t, k] · expert_out[row_to_sorted[t, k]] in k order.
// Steps 2 and 3 are the GEMV kernels (a warp per output column streams that column's weight
// row of each touched expert once per 8 rows), the streaming kernels (the same, once per 64
// rows, with the rows looped over inside each register-held weight chunk) or the grouped WMMA
// GEMM (64×64 tiles fed by a 3-deep cp.async ring; the grid covers the largest possible tile
// count and CTAs past the device-side count exit).
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/linear/linear_cuda.h"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_cuda_detail.cuh"
#include "kernels/moe/moe_prefill_gemm_cuda.h"

namespace sluice::kernels {
namespace {

using attention_detail::CpAsync16;
using attention_detail::CpAsyncCommit;
using attention_detail::CpAsyncWait;
using cuda_detail::Aligned16;
using cuda_detail::LoadBf16x8;
using cuda_detail::StoreBf16x8;
using moe_detail::kWarpDotRows;
using moe_detail::RouteArgs;
using moe_detail::WarpDotChunked;
using moe_detail::WarpDotRows;

constexpr int kSortThreads = 1024;
constexpr int kGemvWarps = 8;
constexpr int kCombineThreads = 128;
// Streaming path: warps per block, 16-byte weight vectors per lane per chunk (chunk = 1024
// elements), rows per pass over the weights (fp32 sums in shared memory: 8·64·2·4 = 4 KiB),
// rows register-blocked per weight chunk.
constexpr int kStreamWarps = 8;
constexpr int kStreamVecs = 4;
constexpr int kStreamChunk = 32 * kStreamVecs * 8;
constexpr int kStreamRows = 64;
constexpr int kStreamGroup = 8;

// Grouped GEMM tile: kBm sorted rows × kBn output columns (per weight matrix), kBk deep;
// four warps, each a 32×32 quadrant of 2×2 WMMA 16×16×16 fragments per matrix.
constexpr int kBm = 64;
constexpr int kBn = 64;
constexpr int kBk = 32;
constexpr int kLds = kBk + 8;  // bf16 row pitch of the A/B tiles: 80 bytes (WMMA needs 16 B
                               // multiples; the offset spreads rows over banks)
constexpr int kLdc = kBn + 4;  // fp32 row pitch of the epilogue tile (16-byte multiple)
constexpr int kGemmThreads = 128;
constexpr int kGemmStages = 3;  // cp.async ring depth of the grouped GEMM
// Largest hidden / intermediate: keeps the column grids within 65535 blocks.
constexpr int64_t kMaxDim = int64_t{1} << 22;

// Workspace segments (see MoeCudaWorkspaceBytes), each 256-byte aligned.
struct Layout {
  size_t offsets, tile_offsets, active, num_active, sorted_rows, row_to_sorted, route_logits,
      route_counter, act, expert_out;
  size_t total;
};

size_t Align256(size_t v) { return (v + 255) / 256 * 256; }

Layout MakeLayout(int64_t rows, int64_t num_experts, int64_t hidden, int64_t intermediate) {
  Layout l;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t begin = at;
    at = Align256(at + bytes);
    return begin;
  };
  const size_t e = static_cast<size_t>(num_experts);
  const size_t r = static_cast<size_t>(rows);
  l.offsets = take((e + 1) * sizeof(int32_t));
  l.tile_offsets = take((e + 1) * sizeof(int32_t));
  l.active = take(e * sizeof(int32_t));
  l.num_active = take(sizeof(int32_t));
  l.sorted_rows = take(r * sizeof(int32_t));
  l.row_to_sorted = take(r * sizeof(int32_t));
  // The multi-block fused routing's logits [T, E] fp32 (T <= kMoeFusedMaxTokens and T <= rows)
  // and its fallback arrival counter.
  l.route_logits = take(std::min<size_t>(r, kMoeFusedMaxTokens) * e * sizeof(float));
  l.route_counter = take(2 * sizeof(uint32_t));  // + MoeBlockDecodeCuda's second
  l.act = take(r * static_cast<size_t>(intermediate) * sizeof(bf16));
  l.expert_out = take(r * static_cast<size_t>(hidden) * sizeof(bf16));
  l.total = at;
  return l;
}

struct SortOut {
  int32_t* offsets;        // [E + 1] first sorted row of each expert; [E] = valid rows
  int32_t* tile_offsets;   // [E + 1] first kBm-row tile of each expert; [E] = tiles
  int32_t* active;         // [E] experts with rows, ascending; first *num_active valid
  int32_t* num_active;     // [1]
  int32_t* sorted_rows;    // [rows] sorted position -> row t·top_k + k
  int32_t* row_to_sorted;  // [rows] row -> sorted position, -1 for an id outside [0, E)
};

// Sort segments of the workspace (the part MoeFusedRouteCuda writes).
SortOut SortPointers(void* workspace, const Layout& l) {
  unsigned char* ws = static_cast<unsigned char*>(workspace);
  SortOut so;
  so.offsets = reinterpret_cast<int32_t*>(ws + l.offsets);
  so.tile_offsets = reinterpret_cast<int32_t*>(ws + l.tile_offsets);
  so.active = reinterpret_cast<int32_t*>(ws + l.active);
  so.num_active = reinterpret_cast<int32_t*>(ws + l.num_active);
  so.sorted_rows = reinterpret_cast<int32_t*>(ws + l.sorted_rows);
  so.row_to_sorted = reinterpret_cast<int32_t*>(ws + l.row_to_sorted);
  return so;
}

// Inclusive warp scan (Hillis-Steele over shuffles).
__device__ __forceinline__ int WarpInclusiveScan(int v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += n;
  }
  return v;
}

// SortRows: the counting sort of MoeSortKernel by the whole calling block (every thread calls
// it; blockDim.x a multiple of 32, >= 32). `counts` and `cursor`: num_experts int32 each of
// shared memory. topk_ids written earlier by this block are visible after a __syncthreads.
__device__ __forceinline__ void SortRows(const int32_t* topk_ids, int rows, int num_experts,
                                         const SortOut& o, int32_t* counts, int32_t* cursor) {
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int e = topk_ids[r];
    if (e >= 0 && e < num_experts) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // warp 0 scans 32 experts at a time
    const int lane = threadIdx.x;
    int run_rows = 0, run_tiles = 0, run_active = 0;
    for (int base = 0; base < num_experts; base += 32) {
      const int e = base + lane;
      const int c = e < num_experts ? counts[e] : 0;
      const int tiles = (c + kBm - 1) / kBm;
      const int is_active = c > 0 ? 1 : 0;
      const int inc_rows = WarpInclusiveScan(c);
      const int inc_tiles = WarpInclusiveScan(tiles);
      const int inc_active = WarpInclusiveScan(is_active);
      if (e < num_experts) {
        const int first = run_rows + inc_rows - c;
        o.offsets[e] = first;
        cursor[e] = first;
        o.tile_offsets[e] = run_tiles + inc_tiles - tiles;
        if (is_active) o.active[run_active + inc_active - 1] = e;
      }
      run_rows += __shfl_sync(0xffffffffu, inc_rows, 31);
      run_tiles += __shfl_sync(0xffffffffu, inc_tiles, 31);
      run_active += __shfl_sync(0xffffffffu, inc_active, 31);
    }
    if (lane == 0) {
      o.offsets[num_experts] = run_rows;
      o.tile_offsets[num_experts] = run_tiles;
      *o.num_active = run_active;
    }
  }
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int e = topk_ids[r];
    int pos = -1;
    if (e >= 0 && e < num_experts) {
      pos = atomicAdd(&cursor[e], 1);
      o.sorted_rows[pos] = r;
    }
    o.row_to_sorted[r] = pos;
  }
}

// One block of kSortThreads; dynamic shared memory: counts [E] and cursors [E] (int32).
__global__ void __launch_bounds__(kSortThreads)
    MoeSortKernel(const int32_t* __restrict__ topk_ids, int rows, int num_experts, SortOut o) {
  extern __shared__ int32_t sort_smem[];
  SortRows(topk_ids, rows, num_experts, o, sort_smem, sort_smem + num_experts);
}

// The A operand of both expert GEMMs, row by sorted position p: for gate/up the token's x row
// (x[sorted_rows[p] / top_k]), for down the activation row act[p].
struct ARows {
  const bf16* base;
  const int32_t* sorted_rows;  // null: row p is base[p]
  int top_k;
  int k;  // row length (elements)
  __device__ __forceinline__ const bf16* Row(int p) const {
    const int src = sorted_rows != nullptr ? sorted_rows[p] / top_k : p;
    return base + static_cast<int64_t>(src) * k;
  }
};

// Output columns [col] of one expert: gate/up writes silu(gate)·up into act[p, col] (n = I),
// down writes expert_out[p, col] (n = H); both rounded to bf16 once.
__device__ __forceinline__ float SiluMul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// GEMV path, one warp per output column, blockIdx.y = slot in the touched-expert list. An
// expert's rows are taken kRows at a time (kRows >= the expert's row count in the usual case:
// a token picks an expert at most once, so counts <= num_tokens; the host picks kRows from it).
// kGateUp: weight rows col (gate) and n + col (up) of w [E, 2n, k]; else row col of w [E, n, k].
// GemvColumn: output column col of one expert (weights we) for sorted rows [begin, end);
// kVecs > 0 (the fused decode path): WarpDotChunked with kVecs weight vectors per lane in
// flight per row (same sums, bit for bit); 0: WarpDotRows.
template <bool kGateUp, int kRows, int kVecs>
__device__ __forceinline__ void GemvColumn(const ARows& a_rows, const bf16* we, int n, int col,
                                           int begin, int end, bf16* c) {
  const int lane = threadIdx.x & 31;
  const int k = a_rows.k;
  constexpr int kMats = kGateUp ? 2 : 1;
  const bf16* wr[kMats];
#pragma unroll
  for (int m = 0; m < kMats; ++m) wr[m] = we + (static_cast<int64_t>(m) * n + col) * k;
  for (int p0 = begin; p0 < end; p0 += kRows) {
    const int rows = min(kRows, end - p0);
    const bf16* a[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) a[j] = a_rows.Row(p0 + (j < rows ? j : 0));
    float acc[kMats][kRows];
    if constexpr (kVecs > 0) {
      WarpDotChunked<kMats, kRows, kVecs>(wr, a, rows, k, acc);
    } else {
      WarpDotRows<kMats, kRows>(wr, a, rows, k, acc);
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < rows && lane == j) {
        const float v = kGateUp ? SiluMul(acc[0][j], acc[kMats - 1][j]) : acc[0][j];
        c[static_cast<int64_t>(p0 + j) * n + col] = __float2bfloat16_rn(v);
      }
    }
  }
}

template <bool kGateUp, int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32)
    MoeGemvKernel(ARows a_rows, const bf16* __restrict__ w, const int32_t* __restrict__ offsets,
                  const int32_t* __restrict__ active, const int32_t* __restrict__ num_active, int n,
                  bf16* __restrict__ c) {
  const int slot = blockIdx.y;
  if (slot >= *num_active) return;
  const int col = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (col >= n) return;
  const int e = active[slot];
  constexpr int kMats = kGateUp ? 2 : 1;
  GemvColumn<kGateUp, kRows, 0>(a_rows, w + static_cast<int64_t>(e) * kMats * n * a_rows.k, n,
                                col, offsets[e], offsets[e + 1], c);
}

// Launches both GEMV steps with kRows rows per pass.
template <int kRows>
void LaunchGemv(const ARows& x_rows, const ARows& act_rows, const bf16* w_gate_up,
                const bf16* w_down, const SortOut& so, unsigned max_active, int h, int i, bf16* act,
                bf16* expert_out, cudaStream_t stream) {
  auto columns = [](int n) { return static_cast<unsigned>((n + kGemvWarps - 1) / kGemvWarps); };
  MoeGemvKernel<true, kRows><<<dim3(columns(i), max_active), kGemvWarps * 32, 0, stream>>>(
      x_rows, w_gate_up, so.offsets, so.active, so.num_active, i, act);
  MoeGemvKernel<false, kRows><<<dim3(columns(h), max_active), kGemvWarps * 32, 0, stream>>>(
      act_rows, w_down, so.offsets, so.active, so.num_active, h, expert_out);
}

// ---- Pipelined warp dot products (decode variant 5). The GEMV kernels above give each warp
// one output column and one round trip to memory (issue every weight load, wait, reduce,
// exit), so all warps of a wave wait at once and the memory pipe drains between waves. Here a
// warp walks a list of tasks (kMats weight rows times a few activation rows each) in chunks of
// kVecs lane-strided 16-byte vectors per row, with the loads of the next chunk (of the same or
// the next task) issued before the current chunk is used: a warp always has a chunk in flight,
// and persistent warps stream from launch to exit.

// PipeTask: weight rows w0 + m·w_stride (m < kMats) of length a.k, applied to activation rows
// [begin, end) of `a` (sorted positions or tokens).
struct PipeTask {
  const bf16* w0;
  int64_t w_stride;
  ARows a;
  int begin, end;
};

// Where a warp is: task q (q >= count: done), row pass p0, first vector v0 of the chunk.
struct PipeStep {
  int q, p0, v0;
};

// PipelinedWarpDots: for q = first, first + stride, ... < count, for which task_at(q, &task)
// returns true (false: nothing to do), and each pass of up to kRows activation rows p0, p0 + 1,
// ... of [begin, end): sink(q, p0, rows, acc) with acc[m][j] = Σ_i w_m[i] · a[p0 + j][i] on
// every lane. Each lane adds its products in the order of WarpDotChunked / WarpDotRows (vectors
// lane, lane + 32, ... ascending; FmaVec's q order) from 0, then the same butterfly: sums bit
// for bit equal to GemvColumn's / DownPair's. Warp-uniform arguments; every lane calls it.
// a.k % 8 == 0, rows 16-byte aligned.
template <int kMats, int kRows, int kVecs, typename TaskAt, typename Sink>
__device__ __forceinline__ void PipelinedWarpDots(int first, int stride, int count,
                                                  TaskAt task_at, Sink sink) {
  static_assert(kRows >= 1 && kRows <= kWarpDotRows && kMats >= 1);
  const int lane = threadIdx.x & 31;
  constexpr int kChunk = 32 * kVecs;  // vectors per row per chunk
  // The step after s (task t is s's; both updated): next chunk, next pass, or next task.
  auto advance = [&](PipeStep& s, PipeTask& t) {
    if (s.q < count) {
      s.v0 += kChunk;
      if (s.v0 < t.a.k / 8) return;
      s.v0 = 0;
      s.p0 += kRows;
      if (s.p0 < t.end) return;
      s.q += stride;
    }
    for (; s.q < count; s.q += stride) {
      if (task_at(s.q, &t) && t.begin < t.end) {
        s.p0 = t.begin;
        return;
      }
    }
  };
  auto issue = [&](const PipeStep& s, const PipeTask& t, cuda_detail::Bf16x8(&buf)[kMats][kVecs]) {
    if (s.q >= count) return;
    const int vecs = t.a.k / 8;
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int i = s.v0 + u * 32 + lane;
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        if (i < vecs) buf[m][u] = moe_detail::LoadWeightVec(t.w0 + m * t.w_stride + i * 8);
      }
    }
  };
  float acc[kMats][kRows];
  moe_detail::ZeroAcc(acc);
  auto consume = [&](const PipeStep& s, const PipeTask& t,
                     const cuda_detail::Bf16x8(&buf)[kMats][kVecs]) {
    const int vecs = t.a.k / 8;
    const int rows = min(kRows, t.end - s.p0);
    const bf16* a[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) a[j] = t.a.Row(s.p0 + (j < rows ? j : 0));
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int i = s.v0 + u * 32 + lane;
      if (i >= vecs) break;  // lane-local: no warp-wide operation before the sums
      float wf[kMats][8];
#pragma unroll
      for (int m = 0; m < kMats; ++m) cuda_detail::ToFloat8(buf[m][u], wf[m]);
      moe_detail::FmaVec(wf, a, i, rows, acc);
    }
    if (s.v0 + kChunk >= vecs) {  // the pass's last chunk (warp-uniform)
      moe_detail::WarpSumAcc(acc);
      sink(s.q, s.p0, rows, acc);
      moe_detail::ZeroAcc(acc);
    }
  };
  PipeStep s0{first, 0, 0};
  PipeTask t0{};
  for (; s0.q < count; s0.q += stride) {
    if (task_at(s0.q, &t0) && t0.begin < t0.end) break;
  }
  s0.p0 = t0.begin;
  if (s0.q >= count) return;
  // Two register buffers, named (not indexed) so that they stay in registers.
  cuda_detail::Bf16x8 b0[kMats][kVecs], b1[kMats][kVecs];
  issue(s0, t0, b0);
  while (true) {
    PipeStep s1 = s0;
    PipeTask t1 = t0;
    advance(s1, t1);
    issue(s1, t1, b1);
    consume(s0, t0, b0);
    if (s1.q >= count) break;
    s0 = s1;
    t0 = t1;
    advance(s0, t0);
    issue(s0, t0, b0);
    consume(s1, t1, b1);
    if (s0.q >= count) break;
  }
}

// Vectors per lane per weight row and chunk of the pipelined kernels: two chunks in flight per
// warp within the 128 registers of two 256-thread blocks per SM.
template <int kRows>
inline constexpr int kPipeVecs = kRows <= 2 ? 4 : 2;

// Streaming path (medium batches: a few rows per expert). A warp owns one output column (two
// for down) of one touched expert and streams its two weight rows once in chunks of kStreamChunk
// elements held in registers; for each chunk it applies them to all of the expert's rows,
// kStreamGroup rows at a time (register-blocked), and adds each row's warp-reduced chunk sum
// to a per-warp fp32 slot in shared memory. So the weights are read once per kStreamRows rows
// of an expert (once in practice: the host picks this path when experts get a few rows), and a
// row's sum is Σ over chunks (in order) of a fixed butterfly reduction: independent of how
// many rows the expert has, hence deterministic and batch invariant.
// A warp streams two weight rows, so that each activation load feeds two dot products:
// kGateUp: rows col (gate) and n + col (up) of w [E, 2n, k], one output column col; else rows
// col and col + 1 of w [E, n, k] (col even; n % 8 == 0), output columns col and col + 1.
// Two blocks per SM (at most 128 registers): 16 warps × 32 lanes × 8 16-byte weight loads =
// 64 KiB in flight per SM, enough to cover HBM latency.
template <bool kGateUp>
__global__ void __launch_bounds__(kStreamWarps * 32, 2)
    MoeStreamKernel(ARows a_rows, const bf16* __restrict__ w, const int32_t* __restrict__ offsets,
                    const int32_t* __restrict__ active, const int32_t* __restrict__ num_active,
                    int n, bf16* __restrict__ c) {
  constexpr int kMats = 2;  // weight rows per warp
  __shared__ float sums[kStreamWarps][kStreamRows][kMats];
  const int slot = blockIdx.y;
  if (slot >= *num_active) return;
  const int warp = threadIdx.x >> 5;
  const int col = (blockIdx.x * kStreamWarps + warp) * (kGateUp ? 1 : 2);
  if (col >= n) return;  // warp-uniform; only __syncwarp below, no block barrier
  const int lane = threadIdx.x & 31;
  const int e = active[slot];
  const int k = a_rows.k;
  const bf16* we = w + static_cast<int64_t>(e) * (kGateUp ? 2 : 1) * n * k;
  const bf16* wr[kMats];
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
    wr[m] = we + (kGateUp ? static_cast<int64_t>(m) * n + col : static_cast<int64_t>(col + m)) * k;
  }
  float(*s)[kMats] = sums[warp];
  const int end = offsets[e + 1];
  for (int p0 = offsets[e]; p0 < end; p0 += kStreamRows) {
    const int rows = min(kStreamRows, end - p0);
    for (int j = lane; j < rows; j += 32) {
#pragma unroll
      for (int m = 0; m < kMats; ++m) s[j][m] = 0.0f;
    }
    __syncwarp();
    for (int k0 = 0; k0 < k; k0 += kStreamChunk) {
      // All of the chunk's weight loads are issued before any use (bandwidth-bound).
      uint4 wv[kMats][kStreamVecs];
#pragma unroll
      for (int u = 0; u < kStreamVecs; ++u) {
        const int idx = k0 + (u * 32 + lane) * 8;
#pragma unroll
        for (int m = 0; m < kMats; ++m) {
          wv[m][u] = idx < k ? __ldcs(reinterpret_cast<const uint4*>(wr[m] + idx))
                             : make_uint4(0, 0, 0, 0);
        }
      }
      for (int j0 = 0; j0 < rows; j0 += kStreamGroup) {
        const int g = min(kStreamGroup, rows - j0);  // warp-uniform
        const bf16* a[kStreamGroup];
#pragma unroll
        for (int jj = 0; jj < kStreamGroup; ++jj) a[jj] = a_rows.Row(p0 + j0 + (jj < g ? jj : 0));
        float part[kMats][kStreamGroup];
#pragma unroll
        for (int m = 0; m < kMats; ++m) {
#pragma unroll
          for (int jj = 0; jj < kStreamGroup; ++jj) part[m][jj] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kStreamVecs; ++u) {
          const int idx = k0 + (u * 32 + lane) * 8;
          if (idx >= k) continue;
          float wf[kMats][8];
#pragma unroll
          for (int m = 0; m < kMats; ++m) {
            cuda_detail::Bf16x8 b;
            static_assert(sizeof(b) == sizeof(wv[m][u]));
            memcpy(&b, &wv[m][u], sizeof(b));
            cuda_detail::ToFloat8(b, wf[m]);
          }
#pragma unroll
          for (int jj = 0; jj < kStreamGroup; ++jj) {
            if (jj < g) {
              float af[8];
              LoadBf16x8(a[jj] + idx, af);
#pragma unroll
              for (int m = 0; m < kMats; ++m) {
#pragma unroll
                for (int q = 0; q < 8; ++q) part[m][jj] = fmaf(wf[m][q], af[q], part[m][jj]);
              }
            }
          }
        }
#pragma unroll
        for (int jj = 0; jj < kStreamGroup; ++jj) {
          if (jj < g) {
#pragma unroll
            for (int m = 0; m < kMats; ++m) {
              const float total = cuda_detail::WarpSum(part[m][jj]);
              // Row j0 + jj always belongs to lane jj: the same lane adds every chunk's sum.
              if (lane == jj) s[j0 + jj][m] += total;
            }
          }
        }
      }
    }
    __syncwarp();  // lane j % 32 reads the sums lane j % kStreamGroup wrote
    for (int j = lane; j < rows; j += 32) {
      bf16* cr = c + static_cast<int64_t>(p0 + j) * n + col;
      if (kGateUp) {
        cr[0] = __float2bfloat16_rn(SiluMul(s[j][0], s[j][1]));
      } else {
        cr[0] = __float2bfloat16_rn(s[j][0]);
        cr[1] = __float2bfloat16_rn(s[j][1]);
      }
    }
    __syncwarp();  // the next pass zeroes the sums
  }
}

// Grouped GEMM over the sorted rows: blockIdx.x = global tile index (expert found by binary
// search in tile_offsets), blockIdx.y = kBn-column block. C[p, col] = Σ_i A[p, i] · W_e[col, i]
// (gate/up: two matrices, fused SiLU·mul epilogue). fp32 accumulation in WMMA fragments.
template <bool kGateUp>
__global__ void __launch_bounds__(kGemmThreads)
    MoeGroupedGemmKernel(ARows a_rows, const bf16* __restrict__ w,
                         const int32_t* __restrict__ offsets,
                         const int32_t* __restrict__ tile_offsets, int num_experts, int n,
                         bf16* __restrict__ c) {
  namespace wmma = nvcuda::wmma;
  constexpr int kMats = kGateUp ? 2 : 1;
  // kGemmStages ring slots, each kStageRows rows of kLds: A rows [0, kBm), then the kMats
  // weight tiles of kBn rows. Gate/up: 3 · 192 · 80 B = 45 KiB; the fp32 epilogue tile
  // (34 KiB) reuses the ring once the main loop is done.
  constexpr int kStageRows = kBm + kMats * kBn;
  constexpr int kTileBytes = kGemmStages * kStageRows * kLds * static_cast<int>(sizeof(bf16));
  constexpr int kEpiBytes = kMats * kBm * kLdc * static_cast<int>(sizeof(float));
  constexpr int kSmemBytes = kTileBytes > kEpiBytes ? kTileBytes : kEpiBytes;
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory limit");
  __shared__ __align__(128) unsigned char smem[kSmemBytes];
  bf16(*ring)[kLds] = reinterpret_cast<bf16(*)[kLds]>(smem);
  float(*c_tile)[kLdc] = reinterpret_cast<float(*)[kLdc]>(smem);  // after the main loop

  const int tile = blockIdx.x;
  if (tile >= tile_offsets[num_experts]) return;  // uniform per block, before any barrier
  int lo = 0, hi = num_experts - 1;               // largest e with tile_offsets[e] <= tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_offsets[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int e = lo;
  const int row_begin = offsets[e] + (tile - tile_offsets[e]) * kBm;
  const int rows = min(kBm, offsets[e + 1] - row_begin);
  const int n0 = blockIdx.y * kBn;
  const int k = a_rows.k;
  const bf16* we = w + static_cast<int64_t>(e) * kMats * n * k;

  // Each thread moves 2 of the tile's 256 16-byte chunks per matrix: chunk q = tid + 128·i
  // is row q / 4, columns (q % 4)·8 .. +8.
  const int tid = threadIdx.x;
  const bf16* a_src[2];
  const bf16* b_src[kMats][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = (tid + kGemmThreads * i) >> 2;
    a_src[i] = r < rows ? a_rows.Row(row_begin + r) : nullptr;
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
      b_src[m][i] = n0 + r < n ? we + (static_cast<int64_t>(m) * n + n0 + r) * k : nullptr;
    }
  }
  const int chunk_col = (tid & 3) * 8;
  // Copies the kBk-deep slice at k0 into ring slot `stage` with cp.async; rows past the
  // expert's (or columns past n) and k past the end are zero-filled (src-size 0; the source
  // address is then a valid dummy that is not read).
  auto issue = [&](int stage, int k0) {
    const int kc = k0 + chunk_col;
    bf16(*st)[kLds] = ring + stage * kStageRows;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = (tid + kGemmThreads * i) >> 2;
      const bool a_ok = a_src[i] != nullptr && kc < k;
      CpAsync16(&st[r][chunk_col], a_ok ? a_src[i] + kc : a_rows.base, a_ok ? 16 : 0);
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        const bool b_ok = b_src[m][i] != nullptr && kc < k;
        CpAsync16(&st[kBm + m * kBn + r][chunk_col], b_ok ? b_src[m][i] + kc : w, b_ok ? 16 : 0);
      }
    }
  };

  const int warp = tid >> 5;
  const int wm = (warp >> 1) * 32;  // warp's quadrant
  const int wn = (warp & 1) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kMats][2][2];
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[m][i][j], 0.0f);
    }
  }

  // cp.async ring: kGemmStages - 1 slices in flight while one is multiplied. One commit
  // group per slice (empty past the end) keeps the wait count uniform: before step s,
  // kGemmStages - 1 + s groups are committed, and waiting for all but kGemmStages - 2 means
  // slice s has landed (for this thread; the barrier then makes it all threads').
  const int steps = (k + kBk - 1) / kBk;
#pragma unroll
  for (int pre = 0; pre < kGemmStages - 1; ++pre) {
    if (pre < steps) issue(pre, pre * kBk);
    CpAsyncCommit();
  }
  for (int step = 0; step < steps; ++step) {
    CpAsyncWait<kGemmStages - 2>();
    // Slice `step` is visible to all, and every warp is done with slot (step - 1) % stages,
    // which the next issue overwrites.
    __syncthreads();
    const int next = step + kGemmStages - 1;
    if (next < steps) issue(next % kGemmStages, next * kBk);
    CpAsyncCommit();
    bf16(*a_tile)[kLds] = ring + (step % kGemmStages) * kStageRows;
    bf16(*b_tile)[kLds] = a_tile + kBm;
#pragma unroll
    for (int kk = 0; kk < kBk; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &a_tile[wm + 16 * i][kk], kLds);
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          // W rows are B's columns: B (k × n) is W's tile read column-major.
          wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
          wmma::load_matrix_sync(fb, &b_tile[m * kBn + wn + 16 * j][kk], kLds);
#pragma unroll
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[m][i][j], fa[i], fb, acc[m][i][j]);
        }
      }
    }
  }
  CpAsyncWait<0>();  // only empty groups remain; the epilogue tile reuses the ring
  __syncthreads();

#pragma unroll
  for (int m = 0; m < kMats; ++m) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::store_matrix_sync(&c_tile[m * kBm + wm + 16 * i][wn + 16 * j], acc[m][i][j], kLdc,
                                wmma::mem_row_major);
      }
    }
  }
  __syncthreads();
  for (int q = tid; q < kBm * (kBn / 8); q += kGemmThreads) {
    const int r = q / (kBn / 8);
    const int cc = (q % (kBn / 8)) * 8;
    if (r >= rows || n0 + cc >= n) continue;  // n % 8 == 0: a chunk is all in or all out
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      v[u] = kGateUp ? SiluMul(c_tile[r][cc + u], c_tile[(kMats - 1) * kBm + r][cc + u])
                     : c_tile[r][cc + u];
    }
    StoreBf16x8(c + static_cast<int64_t>(row_begin + r) * n + n0 + cc, v);
  }
}

// One block per token: out[t, :] = bf16(Σ_k w[t, k] · expert_out[row_to_sorted[t·top_k + k]]),
// fp32 sums in k order; rows with an invalid expert (-1) are skipped.
__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineKernel(const bf16* __restrict__ expert_out, const int32_t* __restrict__ row_to_sorted,
                     const float* __restrict__ topk_weights, int top_k, int hidden, bf16* out) {
  const int64_t t = blockIdx.x;
  for (int col = threadIdx.x * 8; col < hidden; col += kCombineThreads * 8) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int kk = 0; kk < top_k; ++kk) {
      const int pos = row_to_sorted[t * top_k + kk];
      if (pos < 0) continue;
      const float w = topk_weights[t * top_k + kk];
      float y[8];
      LoadBf16x8(expert_out + static_cast<int64_t>(pos) * hidden + col, y);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc[u] = fmaf(w, y[u], acc[u]);
    }
    StoreBf16x8(out + t * hidden + col, acc);
  }
}


// ---- Fused decode path (SetMoeDecodeVariant(1)): three launches instead of six.

constexpr int kFusedRouteThreads = 512;
constexpr int kFusedVecs = 8;   // weight vectors per lane in flight per weight row
constexpr int kDownCols = 8;    // output columns per block of the down + combine kernel
constexpr int kDownWarps = 8;

// Dynamic shared floats of MoeFusedRouteKernel: logits [T, E], then the routing scratch of T
// warps, which the sort's counters [2E] (int32) reuse afterwards.
size_t FusedRouteSmemFloats(int64_t num_tokens, const MoeRoutingParams& p) {
  const int64_t route = num_tokens * (2 * p.num_experts + p.n_group);
  return static_cast<size_t>(num_tokens * p.num_experts + std::max(route, 2 * p.num_experts));
}

// RouteAndSort: the tail of both fused routing kernels, by the whole block (at least
// num_tokens warps; every thread calls it after a barrier that made the logits visible):
// warp t routes token t from smem[t·E ...] (RouteToken, scratch after the T·E logits), then
// the counting sort of the ids (SortRows, its counters reusing the scratch).
__device__ __forceinline__ void RouteAndSort(float* smem, const RouteArgs& args,
                                             const SortOut& so) {
  const int warp = threadIdx.x >> 5;
  const int e_count = args.num_experts;
  float* scratch = smem + args.num_tokens * e_count;
  if (warp < args.num_tokens) {
    moe_detail::RouteToken(smem + warp * e_count,
                           scratch + warp * moe_detail::RouteScratchFloats(args), args, warp);
  }
  __syncthreads();  // ids in global memory, visible to the block; the scratch is free
  int32_t* counters = reinterpret_cast<int32_t*>(scratch);
  SortRows(args.topk_ids, args.num_tokens * args.top_k, e_count, so, counters,
           counters + e_count);
}

// One block: router logits (MoeRouterLogitsCuda's sums bit for bit: each warp takes two
// experts at a time, WarpDotChunked), routing (warp t routes token t, RouteToken), then the
// counting sort of the ids (SortRows) into the workspace, all without leaving the SM. At
// decode sizes the router matrix (E · hidden bf16, 256 KiB for V2-Lite) is read by one SM
// with 16 × 2 × 8 16-byte loads per lane in flight; three small launches cost more.
// pdl (kernels::DecodePdlMoe()): a programmatic dependent launch; before GridDependencyWait the
// warps only ask L2 for their router rows (no kernel of the step writes them).
template <int kRows>
__global__ void __launch_bounds__(kFusedRouteThreads)
    MoeFusedRouteKernel(const bf16* __restrict__ x, const bf16* __restrict__ w_gate, int hidden,
                        RouteArgs args, SortOut so, bool pdl) {
  extern __shared__ float fused_smem[];
  const int num_tokens = args.num_tokens;
  const int e_count = args.num_experts;
  float* logits = fused_smem;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  constexpr int kWarps = kFusedRouteThreads / 32;
  if (pdl) {
    // Lane l of warp w: row 2w + 2·kWarps·(l / 2) + l % 2, the warp's rows in the loop below.
    const int e = 2 * warp + 2 * kWarps * (lane / 2) + lane % 2;
    if (e < e_count) {
      cuda_detail::PrefetchL2(w_gate + static_cast<int64_t>(e) * hidden,
                              static_cast<uint32_t>(hidden) * sizeof(bf16));
    }
    attention_detail::GridDependencyWait();
    attention_detail::LaunchDependents();
  }
  const bf16* a[kRows];
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    a[j] = x + static_cast<int64_t>(j < num_tokens ? j : 0) * hidden;
  }
  for (int e = 2 * warp; e < e_count; e += 2 * kWarps) {
    const bool pair = e + 1 < e_count;  // warp-uniform
    const bf16* w[2] = {w_gate + static_cast<int64_t>(e) * hidden,
                        w_gate + static_cast<int64_t>(pair ? e + 1 : e) * hidden};
    float acc[2][kRows];
    WarpDotChunked<2, kRows, kFusedVecs>(w, a, num_tokens, hidden, acc);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < num_tokens && lane == j) {
        logits[j * e_count + e] = acc[0][j];
        if (pair) logits[j * e_count + e + 1] = acc[1][j];
      }
    }
  }
  __syncthreads();
  RouteAndSort(fused_smem, args, so);
}

// Shared experts folded into the fused launches (MoeSharedExpert on the device side): gate/up
// [2n, k], down [k_out = hidden, n], activations act [num_tokens, n] (scratch).
struct SharedArgs {
  const bf16* w_gate_up;  // null: no shared expert
  const bf16* w_down;
  bf16* act;
  int n;
};

// Gate/up + SiLU·mul of the touched experts (blockIdx.y < max_active: slot, as MoeGemvKernel
// with WarpDotChunked) and, in the grid rows from max_active on when `sh` has one, of the
// shared expert for tokens 0..num_tokens-1 (x rows in token order; its columns continue row
// after row, gridDim.x · kGemvWarps per row).
// pdl (kernels::DecodePdlMoe()): itself a programmatic dependent of the routing launch, so it
// waits for the sort before anything, and only then lets the down kernel (which reads the sort
// before its own wait) launch.
template <int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32)
    MoeFusedGateUpKernel(ARows x_rows, const bf16* __restrict__ w,
                         const int32_t* __restrict__ offsets, const int32_t* __restrict__ active,
                         const int32_t* __restrict__ num_active, int n, bf16* __restrict__ c,
                         SharedArgs sh, int num_tokens, int max_active, bool pdl) {
  if (pdl) attention_detail::GridDependencyWait();
  // The down kernel, when launched as a programmatic dependent (decode variant 4), may get
  // resident from now on (it waits for this grid before reading act); a no-op otherwise.
  attention_detail::LaunchDependents();
  const int slot = blockIdx.y;
  int col = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (slot >= max_active) {  // only launched with a shared expert
    col += (slot - max_active) * static_cast<int>(gridDim.x) * kGemvWarps;
    if (col >= sh.n) return;
    const ARows tokens{x_rows.base, nullptr, 1, x_rows.k};
    GemvColumn<true, kRows, kFusedVecs>(tokens, sh.w_gate_up, sh.n, col, 0, num_tokens, sh.act);
    return;
  }
  if (slot >= *num_active || col >= n) return;
  const int e = active[slot];
  GemvColumn<true, kRows, kFusedVecs>(x_rows, w + static_cast<int64_t>(e) * 2 * n * x_rows.k, n,
                                      col, offsets[e], offsets[e + 1], c);
}

// Gate/up + SiLU·mul of the touched experts and (shared_cols > 0) of the shared expert's
// columns, decode variant 5: a persistent grid (about two blocks per SM) of warps walking the
// tasks with PipelinedWarpDots. With `slots` touched experts (*num_active), task q < slots·n is
// column q / slots of the expert in slot q % slots (consecutive warps take different experts,
// so every SM streams all of them at once, and no warp idles on an empty slot); task
// slots·n + c is the shared expert's column c (c < shared_cols) for tokens 0..num_tokens-1.
// Outputs equal MoeFusedGateUpKernel's bit for bit. PipedGateUp: the warp's part, tasks first,
// first + stride, ...; slots == 0: shared columns only (the multi-block routing kernel).
template <int kRows>
__device__ __forceinline__ void PipedGateUp(const ARows& x_rows, const bf16* w,
                                            const int32_t* offsets, const int32_t* active,
                                            int slots, int n, bf16* c, const SharedArgs& sh,
                                            int num_tokens, int shared_cols, int first,
                                            int stride, bool shared_first = false) {
  const int lane = threadIdx.x & 31;
  const int routed = slots * n;
  const int k = x_rows.k;
  // The task list: routed tasks [0, routed), then the shared columns; shared_first (decode
  // variant 8's kMoeBlockTuneRouteFirst): the shared columns [0, shared_cols), then routed.
  const int shared_begin = shared_first ? 0 : routed;
  const int routed_begin = shared_first ? shared_cols : 0;
  auto is_shared = [&](int q) { return q >= shared_begin && q < shared_begin + shared_cols; };
  auto task_at = [&](int q, PipeTask* t) {
    if (is_shared(q)) {
      const int col = q - shared_begin;
      t->w0 = sh.w_gate_up + static_cast<int64_t>(col) * k;
      t->w_stride = static_cast<int64_t>(sh.n) * k;
      t->a = ARows{x_rows.base, nullptr, 1, k};
      t->begin = 0;
      t->end = num_tokens;
      return true;
    }
    q -= routed_begin;
    const int e = active[q % slots];
    t->w0 = w + (static_cast<int64_t>(e) * 2 * n + q / slots) * k;
    t->w_stride = static_cast<int64_t>(n) * k;
    t->a = x_rows;
    t->begin = offsets[e];
    t->end = offsets[e + 1];
    return true;
  };
  auto sink = [&](int q, int p0, int rows, const float(&acc)[2][kRows]) {
    const bool shared = is_shared(q);
    bf16* out = shared ? sh.act : c;
    const int width = shared ? sh.n : n;
    const int col = shared ? q - shared_begin : (q - routed_begin) / slots;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < rows && lane == j) {
        out[static_cast<int64_t>(p0 + j) * width + col] =
            __float2bfloat16_rn(SiluMul(acc[0][j], acc[1][j]));
      }
    }
  };
  PipelinedWarpDots<2, kRows, kPipeVecs<kRows>>(first, stride, routed + shared_cols, task_at,
                                                  sink);
}

// shared_first (decode variant 7): the shared expert's columns (shared_cols of them) come first,
// before GridDependencyWait: they read only x and the shared weights and write sh.act, and the
// routing launch before this one is either a normal launch (then x's writer completed before
// it started) or a programmatic one that lets this kernel launch only once past its own wait
// (MoeFusedRouteMultiKernel with pdl): either way every kernel before the routing is complete,
// x is final and no earlier kernel still reads sh.act. So the shared gate/up streams while the
// routing finishes, and each warp goes on to its routed columns with no launch in between. The
// same columns by the same code: the same bits as one PipedGateUp over both.
template <int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32, 2)
    MoePipedGateUpKernel(ARows x_rows, const bf16* __restrict__ w,
                         const int32_t* __restrict__ offsets, const int32_t* __restrict__ active,
                         const int32_t* __restrict__ num_active, int n, bf16* __restrict__ c,
                         SharedArgs sh, int num_tokens, int shared_cols, bool shared_first) {
  const int first = static_cast<int>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  const int stride = static_cast<int>(gridDim.x) * kGemvWarps;
  if (shared_first) {
    PipedGateUp<kRows>(x_rows, nullptr, nullptr, nullptr, /*slots=*/0, n, c, sh, num_tokens,
                       shared_cols, first, stride);
    attention_detail::GridDependencyWait();
    attention_detail::LaunchDependents();
    PipedGateUp<kRows>(x_rows, w, offsets, active, *num_active, n, c, sh, num_tokens,
                       /*shared_cols=*/0, first, stride);
    return;
  }
  // Decode variant 6 launches this kernel as a programmatic dependent of the routing kernel:
  // wait for its sort (and shared activations) first (a no-op for a normal launch). Only then
  // may the down launch (a programmatic dependent of this one) get resident, as for
  // MoeFusedGateUpKernel: it reads the sort before its own wait, so the routing kernel must be
  // complete by then.
  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();
  PipedGateUp<kRows>(x_rows, w, offsets, active, *num_active, n, c, sh, num_tokens, shared_cols,
                     first, stride);
}

// ---- Multi-block fused routing (MoeFusedRouteMode::kMultiBlock, decode variant 4).
// The single-block kernel above streams the whole router matrix through one SM (~15 us for
// V2-Lite's 256 KiB on an H200); here a warp per router row spreads it over ceil(E / 8)
// blocks, each warp one round trip of 8 16-byte loads per lane for hidden <= 2048.

constexpr int kRouteMultiWarps = 8;  // router rows per block; warps route tokens 0..7
static_assert(kRouteMultiWarps >= kMoeFusedMaxTokens, "a warp per token in the last block");
constexpr int kRouteCounterSlots = 1024;

// Arrival counters of the multi-block routing, one per workspace address (RouteCounterSlot).
// Zero at module load; the last block of each launch puts its counter back to 0, so every
// launch (CUDA-graph replays included) starts from 0.
__device__ unsigned int g_route_arrivals[kRouteCounterSlots];

// RouteCounterSlot: this workspace's slot in g_route_arrivals (fixed for the process), or -1
// when all slots are taken (the caller then zeroes a counter in the workspace). One slot per
// address: launches on one workspace are stream-ordered (its sort data already requires it),
// so no two launches share a counter at the same time; slot indices are the same on every
// device, each device has its own counters.
int RouteCounterSlot(const void* workspace) {
  static std::mutex* const mu = new std::mutex;
  static auto* const slots = new std::unordered_map<const void*, int>;
  std::lock_guard<std::mutex> lock(*mu);
  const auto it = slots->find(workspace);
  if (it != slots->end()) return it->second;
  if (slots->size() >= static_cast<size_t>(kRouteCounterSlots)) return -1;
  const int slot = static_cast<int>(slots->size());
  slots->emplace(workspace, slot);
  return slot;
}

// Blocks [0, RouteMultiBlocks) compute the router logits: warp w of block b takes expert
// 8·b + w (MoeRouterLogitsCuda's sums bit for bit: WarpDotChunked's per-column sums do not
// depend on how many columns a warp takes) and writes its T logits to `logits_g` [T, E] in
// global memory. Each block then counts itself in at the device-scope counter; the last one
// to arrive (all logits written and fenced before every arrival) copies the logits into shared
// memory, resets the counter and runs the single-block kernel's routing (RouteToken, warp t for
// token t) and sort (SortRows), so ids, weights and the sort equal MoeFusedRouteKernel's.
// Blocks from RouteMultiBlocks on (only with a shared expert) compute the shared expert's
// gate/up + SiLU·mul exactly as MoeFusedGateUpKernel's shared rows do, a column per warp;
// they overlap the routing's latency. Dynamic shared memory: FusedRouteSmemFloats floats.
__host__ __device__ __forceinline__ int RouteMultiBlocks(int num_experts) {
  return (num_experts + kRouteMultiWarps - 1) / kRouteMultiWarps;
}

// kPiped (decode variant 5): the shared-expert blocks are persistent (the host sizes them to
// the SMs left over) and walk the shared columns with PipedGateUp (same values bit for bit).
// pdl (kernels::DecodePdlMoe()): the launch is itself a programmatic dependent of the kernel
// before it (the post-attention norm that writes x): before GridDependencyWait each block only
// asks L2 (cp.async.bulk.prefetch) for the weight rows it will stream — a routing warp its
// router row, a shared-expert warp the gate and up rows of each of its columns — so they come
// in while that kernel still runs; every read of x and every write comes after the wait.
template <int kRows, bool kPiped>
__global__ void __launch_bounds__(kRouteMultiWarps * 32, kPiped ? 2 : 1)
    MoeFusedRouteMultiKernel(const bf16* __restrict__ x, const bf16* __restrict__ w_gate,
                             int hidden, RouteArgs args, SortOut so, float* logits_g,
                             unsigned int* ws_counter, int slot, SharedArgs sh, int pdl) {
  extern __shared__ float fused_smem[];
  // Decode variant 6: MoePipedGateUpKernel, a programmatic dependent, may launch now; it waits
  // for this grid's completion before it reads anything (a no-op otherwise). Its blocks only
  // take SM slots that this grid's blocks leave (they are all resident by the time every block
  // has passed here).
  // (Under pdl only once past GridDependencyWait below: a dependent launched then may read x,
  // which the kernel before this one wrote, before its own wait — decode variant 7.)
  if constexpr (kPiped) {
    if (!pdl) attention_detail::LaunchDependents();
  }
  const int num_tokens = args.num_tokens;
  const int e_count = args.num_experts;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int route_blocks = RouteMultiBlocks(e_count);
  if (pdl != 0) {
    // pdl 2 (GemvPdlPrefetch() == kGemvPdlPrefetchSlice, as for the GEMVs): before the wait,
    // the router rows and the shared experts' gate/up rows are asked into L2; pdl 1 only waits.
    const uint32_t row_bytes = static_cast<uint32_t>(hidden) * sizeof(bf16);
    if (pdl == 2) {
      if (static_cast<int>(blockIdx.x) < route_blocks) {
        const int e = static_cast<int>(blockIdx.x) * kRouteMultiWarps + warp;
        if (e < e_count && lane == 0) {
          cuda_detail::PrefetchL2(w_gate + static_cast<int64_t>(e) * hidden, row_bytes);
        }
        // A shared expert but no shared blocks (decode variant 7: the experts' gate/up launch
        // computes it): the routing lanes ask L2 for its 2·n gate/up rows, a row per lane in turn.
        if (sh.w_gate_up != nullptr && static_cast<int>(gridDim.x) == route_blocks) {
          const int lanes = route_blocks * kRouteMultiWarps * 32;
          for (int r = static_cast<int>(blockIdx.x) * kRouteMultiWarps * 32 +
                       static_cast<int>(threadIdx.x);
               r < 2 * sh.n; r += lanes) {
            cuda_detail::PrefetchL2(sh.w_gate_up + static_cast<int64_t>(r) * hidden, row_bytes);
          }
        }
      } else {
        // The warp's shared columns (below: first, first + stride, ... for kPiped, else one);
        // lane l takes column number l / 2 of them, gate row (l even) or up row (l odd).
        const int b = static_cast<int>(blockIdx.x) - route_blocks;
        const int first = b * kRouteMultiWarps + warp;
        const int stride =
            kPiped ? (static_cast<int>(gridDim.x) - route_blocks) * kRouteMultiWarps : sh.n;
        const int col = first + (lane / 2) * stride;
        if (col < sh.n) {
          cuda_detail::PrefetchL2(
              sh.w_gate_up + (static_cast<int64_t>(lane % 2) * sh.n + col) * hidden, row_bytes);
        }
      }
    }
    attention_detail::GridDependencyWait();
    attention_detail::LaunchDependents();
  }
  if (static_cast<int>(blockIdx.x) >= route_blocks) {  // block-uniform: no barrier below
    if constexpr (kPiped) {
      const int first = (static_cast<int>(blockIdx.x) - route_blocks) * kRouteMultiWarps + warp;
      const int stride = (static_cast<int>(gridDim.x) - route_blocks) * kRouteMultiWarps;
      PipedGateUp<kRows>(ARows{x, nullptr, 1, hidden}, nullptr, nullptr, nullptr, /*slots=*/0, 0,
                         nullptr, sh, num_tokens, sh.n, first, stride);
      return;
    }
    const int col = (static_cast<int>(blockIdx.x) - route_blocks) * kRouteMultiWarps + warp;
    if (col >= sh.n) return;
    const ARows tokens{x, nullptr, 1, hidden};
    GemvColumn<true, kRows, kFusedVecs>(tokens, sh.w_gate_up, sh.n, col, 0, num_tokens, sh.act);
    return;
  }
  const int e = static_cast<int>(blockIdx.x) * kRouteMultiWarps + warp;
  if (e < e_count) {  // warp-uniform
    const bf16* a[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      a[j] = x + static_cast<int64_t>(j < num_tokens ? j : 0) * hidden;
    }
    const bf16* w[1] = {w_gate + static_cast<int64_t>(e) * hidden};
    float acc[1][kRows];
    WarpDotChunked<1, kRows, kFusedVecs>(w, a, num_tokens, hidden, acc);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < num_tokens && lane == j) logits_g[j * e_count + e] = acc[0][j];
    }
  }
  // Release: each writer fences its logits before the block's arrival is counted.
  __threadfence();
  __syncthreads();
  bool last = false;
  if (threadIdx.x == 0) {
    unsigned int* counter = slot >= 0 ? &g_route_arrivals[slot] : ws_counter;
    const unsigned int arrived = atomicAdd(counter, 1u) + 1u;
    last = arrived == static_cast<unsigned int>(route_blocks);
    // Every block of this launch has counted itself in: back to 0 for the next launch.
    if (last) atomicExch(counter, 0u);
  }
  // Barrier and broadcast in one (no static shared memory next to the dynamic 48 KiB).
  if (!__syncthreads_or(last)) return;  // block-uniform
  __threadfence();  // acquire side of the pattern, before reading other blocks' logits
  // L2 loads (ld.global.cg): this SM's L1 may hold stale lines of logits_g from an earlier call.
  for (int q = threadIdx.x; q < num_tokens * e_count; q += blockDim.x) {
    fused_smem[q] = __ldcg(logits_g + q);
  }
  __syncthreads();
  RouteAndSort(fused_smem, args, so);
}

// DownPair: output columns col, col + 1 (weight rows we, we + k) for activation rows
// [begin, end) of `act` (row stride k), each rounded to bf16 into val0[p], val1[p].
template <int kRows>
__device__ __forceinline__ void DownPair(const bf16* we, const bf16* act, int k, int begin,
                                         int end, float* val0, float* val1) {
  const int lane = threadIdx.x & 31;
  const bf16* wr[2] = {we, we + k};
  for (int p0 = begin; p0 < end; p0 += kRows) {
    const int rows = min(kRows, end - p0);
    const bf16* a[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) a[j] = act + static_cast<int64_t>(p0 + (j < rows ? j : 0)) * k;
    float acc[2][kRows];
    WarpDotChunked<2, kRows, kFusedVecs>(wr, a, rows, k, acc);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < rows && lane == j) {
        val0[p0 + j] = __bfloat162float(__float2bfloat16_rn(acc[0][j]));
        val1[p0 + j] = __bfloat162float(__float2bfloat16_rn(acc[1][j]));
      }
    }
  }
}

// Down projection and combine in one launch: a block owns kDownCols output columns of every
// token. Its warps take (touched expert, column pair) tasks: the two adjacent weight rows of
// that expert are streamed once (WarpDotChunked, kFusedVecs vectors per row per lane in flight)
// for the expert's activation rows, and each result is rounded to bf16 into shared memory by
// sorted row. Then thread (t, c) sums token t's top_k rows in k order exactly as
// MoeCombineKernel does (fp32 fmaf from 0, one bf16 rounding), then adds the shared expert's
// bf16 output when `sh` has one (one more task per column pair, over its token rows), and
// `add` [T, n] when given, each as bf16(a + routed) (AddInPlaceCuda's rounding). So without a
// shared expert the output equals the GEMV path's MoeCombineKernel (+ AddInPlaceCuda) bit for
// bit. Rows total <= kMoeFusedMaxRows.
// pdl (decode variant 4): launched as a programmatic dependent of MoeFusedGateUpKernel, so the
// grid may start while that kernel still runs: before GridDependencyWait it reads only the
// route kernel's sort (complete before the gate/up kernel started) and asks L2 for the weight
// rows of each warp's first task; act and everything it writes come after the wait.
// kPiped (decode variant 5): the warps walk their tasks with PipelinedWarpDots (the next
// task's weights in flight while the current one is reduced; same sums bit for bit).
template <int kRows, bool kPiped>
__global__ void __launch_bounds__(kDownWarps * 32, kPiped ? 2 : 1)
    MoeDownCombineKernel(const bf16* __restrict__ act, const bf16* __restrict__ w,
                         const int32_t* __restrict__ offsets, const int32_t* __restrict__ active,
                         const int32_t* __restrict__ num_active,
                         const int32_t* __restrict__ row_to_sorted,
                         const float* __restrict__ topk_weights, int num_tokens, int top_k, int n,
                         int k, SharedArgs sh, const bf16* add, bf16* out, bool pdl,
                         bool trigger) {
  __shared__ float val[kDownCols][kMoeFusedMaxRows];
  __shared__ float shared_val[kDownCols][kMoeFusedMaxTokens];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int c0 = blockIdx.x * kDownCols;  // n % 8 == 0: every column of the block exists
  constexpr int kPairs = kDownCols / 2;
  const int routed_slots = *num_active;
  const int tasks = (routed_slots + (sh.w_gate_up != nullptr ? 1 : 0)) * kPairs;
  // Task → its two adjacent weight rows (first row) and their length; slot routed_slots is the
  // shared expert.
  auto task_rows = [&](int task, int* len) {
    const int slot = task / kPairs;
    const int c = (task % kPairs) * 2;
    if (slot == routed_slots) {
      *len = sh.n;
      return sh.w_down + static_cast<int64_t>(c0 + c) * sh.n;
    }
    *len = k;
    return w + (static_cast<int64_t>(active[slot]) * n + c0 + c) * k;
  };
  if (pdl) {
    if (warp < tasks) {
      int len = 0;
      const char* rows = reinterpret_cast<const char*>(task_rows(warp, &len));
      const int bytes = 2 * len * static_cast<int>(sizeof(bf16));
      for (int off = lane * 128; off < bytes; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(rows + off));
      }
    }
    attention_detail::GridDependencyWait();
    // trigger (kernels::DecodePdlMoe()): the next layer's first kernel may launch now; it waits
    // for this grid before it reads `out`.
    if (trigger) attention_detail::LaunchDependents();
  }
  if constexpr (kPiped) {
    // Task → the column pair's two weight rows over the expert's sorted rows of act, or over
    // the token rows of sh.act for the shared expert.
    auto task_at = [&](int task, PipeTask* t) {
      int len = 0;
      t->w0 = task_rows(task, &len);
      t->w_stride = len;
      if (task / kPairs == routed_slots) {
        t->a = ARows{sh.act, nullptr, 1, len};
        t->begin = 0;
        t->end = num_tokens;
      } else {
        const int e = active[task / kPairs];
        t->a = ARows{act, nullptr, 1, len};
        t->begin = offsets[e];
        t->end = offsets[e + 1];
      }
      return true;
    };
    // DownPair's rounding and placement.
    auto sink = [&](int task, int p0, int rows, const float(&acc)[2][kRows]) {
      const int c = (task % kPairs) * 2;
      float* v0 = task / kPairs == routed_slots ? shared_val[c] : val[c];
      float* v1 = task / kPairs == routed_slots ? shared_val[c + 1] : val[c + 1];
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        if (j < rows && lane == j) {
          v0[p0 + j] = __bfloat162float(__float2bfloat16_rn(acc[0][j]));
          v1[p0 + j] = __bfloat162float(__float2bfloat16_rn(acc[1][j]));
        }
      }
    };
    PipelinedWarpDots<2, kRows, kPipeVecs<kRows>>(warp, kDownWarps, tasks, task_at, sink);
  } else {
    for (int task = warp; task < tasks; task += kDownWarps) {
      const int slot = task / kPairs;
      const int c = (task % kPairs) * 2;
      int len = 0;
      const bf16* rows = task_rows(task, &len);
      if (slot == routed_slots) {  // the shared expert: token rows of sh.act
        DownPair<kRows>(rows, sh.act, len, 0, num_tokens, shared_val[c], shared_val[c + 1]);
      } else {
        const int e = active[slot];
        DownPair<kRows>(rows, act, len, offsets[e], offsets[e + 1], val[c], val[c + 1]);
      }
    }
  }
  __syncthreads();
  for (int q = threadIdx.x; q < num_tokens * kDownCols; q += blockDim.x) {
    const int t = q / kDownCols;
    const int c = q % kDownCols;
    float acc = 0.0f;
    for (int kk = 0; kk < top_k; ++kk) {
      const int pos = row_to_sorted[t * top_k + kk];
      if (pos < 0) continue;
      acc = fmaf(topk_weights[t * top_k + kk], val[c][pos], acc);
    }
    const int64_t o = static_cast<int64_t>(t) * n + c0 + c;
    bf16 r = __float2bfloat16_rn(acc);
    if (sh.w_gate_up != nullptr) r = __float2bfloat16_rn(shared_val[c][t] + __bfloat162float(r));
    if (add != nullptr) r = __float2bfloat16_rn(__bfloat162float(add[o]) + __bfloat162float(r));
    out[o] = r;
  }
}

// The device-side view of an optional shared expert; InvalidArgument (naming `who`) for bad
// sizes or pointers.
absl::Status ToSharedArgs(const MoeSharedExpert* shared, const char* who, SharedArgs* sh) {
  *sh = SharedArgs{nullptr, nullptr, nullptr, 0};
  if (shared == nullptr) return absl::OkStatus();
  if (shared->intermediate < 8 || shared->intermediate % 8 != 0 ||
      shared->intermediate > kMaxDim || shared->w_gate_up == nullptr ||
      shared->w_down == nullptr || shared->act == nullptr || !Aligned16(shared->w_gate_up) ||
      !Aligned16(shared->w_down) || !Aligned16(shared->act)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": shared expert needs intermediate a multiple of 8 in [8, 2^22] (got ",
        shared->intermediate, ") and non-null 16-byte aligned weights and act"));
  }
  *sh = SharedArgs{shared->w_gate_up, shared->w_down, shared->act,
                   static_cast<int>(shared->intermediate)};
  return absl::OkStatus();
}


// Blocks of a persistent decode-variant-5 launch: two 256-thread blocks per SM (the kernels'
// launch bounds allow two), the SM count cached per device. No synchronizing call (fine during
// graph capture).
int PipedBlocks() {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cached[kCachedDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 2;
  if (device >= 0 && device < kCachedDevices) {
    if (const int blocks = cached[device].load(std::memory_order_relaxed); blocks > 0) {
      return blocks;
    }
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms < 1) {
    return 2;
  }
  if (device >= 0 && device < kCachedDevices) {
    cached[device].store(2 * sms, std::memory_order_relaxed);
  }
  return 2 * sms;
}

// The multi-block routing kernel for kRows rows per pass; piped: decode variant 5's.
using RouteMultiFn = void (*)(const bf16*, const bf16*, int, RouteArgs, SortOut, float*,
                              unsigned int*, int, SharedArgs, int);
template <int kRows>
RouteMultiFn PickRouteMulti(bool piped) {
  return piped ? MoeFusedRouteMultiKernel<kRows, true> : MoeFusedRouteMultiKernel<kRows, false>;
}

// ---- Decode variant 8 (MoeBlockDecodeCuda): the MoE block in one persistent launch.

constexpr int kBlockWarps = 8;  // warps per block; warps 0..T-1 route token T (T <= 8)
static_assert(kBlockWarps >= kMoeFusedMaxTokens, "a warp per token routes");

// Grid barrier counters of MoeBlockDecodeKernel, [slot][barrier], slot = RouteCounterSlot of
// the workspace (the same per-address slots as g_route_arrivals, another table). Zero at
// module load; each barrier of a launch flips its counter's top bit and leaves the low bits at
// 0 (GridArrive), so every launch finds the state the previous one left.
__device__ unsigned int g_block_barriers[kRouteCounterSlots][2];

// GridArrive: the calling block (thread 0 only, after a __syncthreads that ends the block's
// writes before the barrier) counts itself in at `bar`; returns the counter before the add,
// for GridWait. Block 0 adds 2^31 - (blocks - 1) and the others 1, so the counter's top bit
// flips exactly when the last of the `blocks` blocks arrives, and the low 31 bits come back to
// what they were (0): the cooperative-groups grid barrier's scheme, self-resetting.
__device__ __forceinline__ unsigned int GridArrive(unsigned int* bar, unsigned int blocks) {
  __threadfence();  // release: the block's writes (ordered before by the __syncthreads)
  const unsigned int inc = blockIdx.x == 0 ? 0x80000000u - (blocks - 1u) : 1u;
  return atomicAdd(bar, inc);
}

// GridWait: thread 0 spins until the barrier that returned `old` from GridArrive has
// completed (top bit differs from old's); the caller's __syncthreads after it then orders the
// block's later reads after every block's writes before the barrier. A barrier that never
// completes (not every block resident: cannot happen under a cooperative launch) traps after
// about 2^24 polls (seconds) instead of hanging the device: a launch error, not a deadlock.
// backoff (kMoeBlockTuneSpinBackoff): a short __nanosleep between polls, fewer loads on the
// counter's L2 line while the other blocks' atomics arrive.
__device__ __forceinline__ void GridWait(const unsigned int* bar, unsigned int old, bool backoff) {
  unsigned int v;
  for (unsigned int polls = 0;; ++polls) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(bar) : "memory");
    if (((v ^ old) & 0x80000000u) != 0u) break;
    if (polls >= (1u << 24)) __trap();
    if (backoff) __nanosleep(64);
  }
  __threadfence();
}

// Phase timestamps of the last MoeBlockDecodeKernel launch under kMoeBlockTuneTrace (%globaltimer,
// ns), [block][kBlockTracePoints] for the first kBlockTraceBlocks blocks (thread 0 of each).
constexpr int kBlockTraceBlocks = 1024;
constexpr int kBlockTracePoints = 8;
__device__ unsigned long long g_block_trace[kBlockTraceBlocks][kBlockTracePoints];

__device__ __forceinline__ void TraceStamp(bool trace, int point) {
  if (!trace || threadIdx.x != 0 || blockIdx.x >= kBlockTraceBlocks) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  g_block_trace[blockIdx.x][point] = t;
}

// Phase-3 weight ring of MoeBlockDecodeKernel under kMoeBlockTuneRingDown: per warp
// kRingStages chunks of kRingVecs 16-byte vectors per lane, each lane's own vectors (cp.async
// into shared memory: loads in flight without holding registers). kRingVecs = 6: one chunk
// covers a 1408-element (176-vector) routed down row of DeepSeek-V2-Lite, two its 2816-element
// shared row. 8 warps · 4 · 6 · 512 B = 96 KiB per block (two blocks per SM fit 228 KiB).
constexpr int kRingStages = 4;
constexpr int kRingVecs = 6;
constexpr int kRingWordsPerWarp = kRingStages * kRingVecs * 32 * 4;

// Shared-memory layout of MoeBlockDecodeKernel in 4-byte words: the ring (ring == true only;
// first, so 16-byte aligned), the T·E logits, the routing scratch of T warps
// (RouteScratchFloats each), ids and weights [T·K], the sort (offsets [E + 1], active experts,
// sorted_rows, row_to_sorted, first-of-expert flags [T·K] each, num_active), then
// kMoeFusedMaxRows down values per warp.
struct BlockSmem {
  int ring, logits, scratch, ids, weights, offsets, active, sorted_rows, row_to_sorted, first,
      num_active, val, words;
};

__host__ __device__ __forceinline__ BlockSmem MakeBlockSmem(int t, int e, int n_group, int top_k,
                                                            bool ring) {
  BlockSmem l;
  const int rows = t * top_k;
  int at = 0;
  l.ring = at;
  at += ring ? kBlockWarps * kRingWordsPerWarp : 0;
  l.logits = at;
  at += t * e;
  l.scratch = at;
  at += t * (2 * e + n_group);
  l.ids = at;
  at += rows;
  l.weights = at;
  at += rows;
  l.offsets = at;
  at += e + 1;
  l.active = at;
  at += rows;
  l.sorted_rows = at;
  at += rows;
  l.row_to_sorted = at;
  at += rows;
  l.first = at;
  at += rows;
  l.num_active = at;
  at += 1;
  l.val = at;
  at += kBlockWarps * static_cast<int>(kMoeFusedMaxRows);
  l.words = at;
  return l;
}

struct BlockArgs {
  const bf16* x;
  const bf16* w_router;
  const bf16* w_gate_up;  // routed experts [E, 2I, H]
  const bf16* w_down;     // routed experts [E, H, I]
  int hidden, inter;
  RouteArgs route;       // topk_ids / topk_weights: the global outputs (block 0 writes them)
  SharedArgs sh;         // w_gate_up null: no shared expert
  float* logits_g;       // [T, E] workspace
  bf16* act;             // [T·K, I] workspace, by sorted position
  unsigned int* ws_bar;  // [2] fallback counters (slot < 0)
  int slot;
  int tuning;  // SetMoeBlockDecodeTuning's flags
  bf16* out;
};

// SortRowsFixed: SortRows's offsets, active list (ascending experts) and permutation by the
// whole block, without atomics: a row's position within its expert is its rank among that
// expert's rows in row order, so every block computes the same sort. O(rows) per entry
// (rows <= kMoeFusedMaxRows). Ids must be in [0, E). Ends with __syncthreads.
__device__ __forceinline__ void SortRowsFixed(const int32_t* ids, int rows, int e_count,
                                              int32_t* offsets, int32_t* active,
                                              int32_t* sorted_rows, int32_t* row_to_sorted,
                                              int32_t* first, int32_t* num_active) {
  for (int e = threadIdx.x; e <= e_count; e += blockDim.x) {
    int below = 0;
    for (int r = 0; r < rows; ++r) below += ids[r] < e ? 1 : 0;
    offsets[e] = below;
  }
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int e = ids[r];
    int below = 0, rank = 0;
    for (int q = 0; q < rows; ++q) {
      below += ids[q] < e ? 1 : 0;
      rank += (q < r && ids[q] == e) ? 1 : 0;
    }
    sorted_rows[below + rank] = r;
    row_to_sorted[r] = below + rank;
    first[r] = rank == 0 ? 1 : 0;
  }
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    if (first[r] == 0) continue;
    const int e = ids[r];
    int slot = 0;
    for (int q = 0; q < rows; ++q) slot += (first[q] != 0 && ids[q] < e) ? 1 : 0;
    active[slot] = e;
  }
  if (threadIdx.x == 0) {
    int n = 0;
    for (int q = 0; q < rows; ++q) n += first[q];
    *num_active = n;
  }
  __syncthreads();
}

// Vectors per lane per chunk of MoeBlockDecodeKernel's down phase (one weight row per task):
// the gate/up chunk's kPipeVecs (8 at one token spilled 120 bytes of registers).
template <int kRows>
inline constexpr int kBlockDownVecs = kPipeVecs<kRows>;

// The phase-3 ring's copies (kMoeBlockTuneRingDown): one 16-byte cp.async per vector with an
// L2 evict-first hint (the weights are read once, like LoadWeightVec's ld.global.cs), a
// commit per chunk, and the wait for all but the newest N chunks. "memory" clobbers: the
// compiler must not move the ring's shared-memory reads across them (a slot is read, then
// refilled by the same lane; cp.async.wait_group makes a lane's own copies visible to it, so
// no other barrier is needed: every lane reads only the vectors it copied).
__device__ __forceinline__ uint64_t RingPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void RingCopy16(void* smem, const void* gmem, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void RingCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void RingWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Where a warp is in its phase-3 step list (kMoeBlockTuneRingDown): column ci of its own
// (gw + ci · warps), task j of the column (0: the shared expert's row when there is one, then
// the touched experts in slot order), first vector v0 of the chunk. j may run one past the
// column's last task until normalized (the task count is known only after the routing).
struct RingCursor {
  int ci, j, v0;
};

// One phase-3 task: weight row w of `vecs` 16-byte vectors, applied to activation rows
// [begin, end) of act (row length act_k elements, end - begin <= T <= kRows: a token picks an
// expert at most once, so one pass); shared: the shared expert's row.
struct RingTask {
  const bf16* w;
  const bf16* act;
  int act_k, vecs, begin, end;
  bool shared;
};

// The variant-8 kernel (see moe_cuda.h): kRows >= T rows per pass over a weight row. Every
// block of the grid must be resident at once (cooperative launch). Dynamic shared memory:
// MakeBlockSmem(..., kRing).words words. kRing: kMoeBlockTuneRingDown (a template parameter,
// so the kernels without the ring are compiled exactly as before it: its code is not there
// to take registers from phase 2).
template <int kRows, bool kRing>
__global__ void __launch_bounds__(kBlockWarps * 32, 2) MoeBlockDecodeKernel(BlockArgs a) {
  extern __shared__ __align__(16) float block_smem[];  // 16 B: the ring's cp.async slots
  const RouteArgs& ra = a.route;
  const int num_tokens = ra.num_tokens, e_count = ra.num_experts, top_k = ra.top_k;
  const int rows = num_tokens * top_k;
  constexpr bool ring = kRing;
  const BlockSmem l = MakeBlockSmem(num_tokens, e_count, ra.n_group, top_k, ring);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const unsigned int blocks = gridDim.x;
  const int gw = static_cast<int>(blockIdx.x) * kBlockWarps + warp;  // global warp
  const int warps = static_cast<int>(blocks) * kBlockWarps;
  unsigned int* bar = a.slot >= 0 ? g_block_barriers[a.slot] : a.ws_bar;
  const int h = a.hidden, n = a.inter;
  const bool trace = (a.tuning & kMoeBlockTuneTrace) != 0;
  const bool backoff = (a.tuning & kMoeBlockTuneSpinBackoff) != 0;
  TraceStamp(trace, 0);
  int32_t* offsets = reinterpret_cast<int32_t*>(block_smem + l.offsets);
  int32_t* active = reinterpret_cast<int32_t*>(block_smem + l.active);

  // kMoeBlockTuneRingDown: phase 3's weight chunks go through this warp's ring of kRingStages
  // slots; the first kRingStages chunks are issued before barrier B (the shared expert's rows
  // before the routing, as they do not depend on it), the rest one per consumed chunk.
  const int shared_tasks = a.sh.w_gate_up != nullptr ? 1 : 0;
  // Output columns of this warp in phase 3 (a function: recomputed rather than held in a
  // register through phase 2).
  auto my_cols = [&] { return gw < h ? (h - gw + warps - 1) / warps : 0; };
  constexpr int kRingChunk = 32 * kRingVecs;  // vectors per row per chunk
  // The ring state is dead across phase 2 (re-derived after it: no registers held there);
  // the slot address and the cache policy are recomputed per chunk for the same reason.
  auto ring_slot = [&](int chunk) {
    return reinterpret_cast<uint4*>(block_smem + l.ring) +
           (warp * kRingStages + chunk % kRingStages) * kRingChunk;
  };
  auto ring_chunks_shared = [&] {
    return shared_tasks > 0 ? (a.sh.n / 8 + kRingChunk - 1) / kRingChunk : 0;
  };
  // Chunks issued before the routing: column 0's shared row, at most the ring.
  auto ring_pre = [&] {
    return ring && my_cols() > 0 ? min(kRingStages, ring_chunks_shared()) : 0;
  };
  int ring_issued = 0;  // chunks issued = cp.async groups committed by this lane
  RingCursor ic{0, 0, 0};
  auto ring_task = [&](int ci, int j) {
    const int col = gw + ci * warps;
    RingTask t;
    t.shared = j < shared_tasks;
    if (t.shared) {
      t.w = a.sh.w_down + static_cast<int64_t>(col) * a.sh.n;
      t.act = a.sh.act;
      t.act_k = a.sh.n;
      t.begin = 0;
      t.end = num_tokens;
    } else {
      const int e = active[j - shared_tasks];
      t.w = a.w_down + (static_cast<int64_t>(e) * h + col) * n;
      t.act = a.act;
      t.act_k = n;
      t.begin = offsets[e];
      t.end = offsets[e + 1];
    }
    t.vecs = t.act_k / 8;
    return t;
  };
  // Issues the chunk at ic (if any is left) into slot ring_issued mod kRingStages and commits
  // (an empty group past the end, so that group n is always chunk n); per_col: tasks per
  // column (any value >= 1 while ic is in a column's shared task).
  auto ring_issue = [&](int per_col) {
    if (ic.j >= per_col) {
      ic.j = 0;
      ++ic.ci;
    }
    if (ic.ci < my_cols()) {
      const RingTask t = ring_task(ic.ci, ic.j);
      uint4* dst = ring_slot(ring_issued);
      const uint64_t policy = RingPolicy();
#pragma unroll
      for (int u = 0; u < kRingVecs; ++u) {
        const int i = ic.v0 + u * 32 + lane;
        if (i < t.vecs) RingCopy16(dst + u * 32 + lane, t.w + static_cast<int64_t>(i) * 8, policy);
      }
      ic.v0 += kRingChunk;
      if (ic.v0 >= t.vecs) {
        ic.v0 = 0;
        ++ic.j;
      }
    }
    RingCommit();
    ++ring_issued;
  };

  // Phase 1: router logits, a warp per router row (the first E warps of the grid), bit for
  // bit MoeFusedRouteMultiKernel's.
  for (int e = gw; e < e_count; e += warps) {  // warp-uniform
    const bf16* xr[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      xr[j] = a.x + static_cast<int64_t>(j < num_tokens ? j : 0) * h;
    }
    const bf16* w[1] = {a.w_router + static_cast<int64_t>(e) * h};
    float acc[1][kRows];
    WarpDotChunked<1, kRows, kFusedVecs>(w, xr, num_tokens, h, acc);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < num_tokens && lane == j) a.logits_g[j * e_count + e] = acc[0][j];
    }
  }
  __syncthreads();
  unsigned int old_a = 0, old_b = 0;
  if (threadIdx.x == 0) old_a = GridArrive(&bar[0], blocks);
  TraceStamp(trace, 1);

  // The shared experts' gate/up columns: task c of the list [shared columns, routed tasks]
  // goes to warp c mod warps (the routed part below continues the same striding, so the
  // warps' total work stays even).
  const int shared_cols = a.sh.w_gate_up != nullptr ? a.sh.n : 0;
  const ARows x_tokens{a.x, nullptr, 1, h};
  const bool route_first = (a.tuning & kMoeBlockTuneRouteFirst) != 0;
  if (route_first && shared_cols > 0) {
    // kMoeBlockTuneRouteFirst: route before any gate/up, and stream the shared and routed
    // columns as one pipelined list after it (no drain or block barrier between them); while
    // the block waits for the router rows and routes, L2 fetches its shared gate/up rows.
    for (int col = gw; col < shared_cols; col += warps) {
      if (lane < 2) {
        cuda_detail::PrefetchL2(a.sh.w_gate_up + (static_cast<int64_t>(lane) * a.sh.n + col) * h,
                                static_cast<uint32_t>(h) * sizeof(bf16));
      }
    }
  } else if (shared_cols > 0) {
    PipedGateUp<kRows>(x_tokens, nullptr, nullptr, nullptr, /*slots=*/0, 0, nullptr, a.sh,
                       num_tokens, shared_cols, gw, warps);
    // The shared down row of this warp's first output column (phase 3) does not depend on
    // any barrier: ask L2 for it now, while the block waits and routes.
    if (gw < h && lane == 0 && !ring && (a.tuning & kMoeBlockTuneNoSharedDownPrefetch) == 0) {
      cuda_detail::PrefetchL2(a.sh.w_down + static_cast<int64_t>(gw) * a.sh.n,
                              static_cast<uint32_t>(a.sh.n) * sizeof(bf16));
    }
  }

  // The ring's first chunks while in this column's shared row: they need no routing, so they
  // stream while the block waits at barrier A and routes.
  for (int c = ring_pre(); c > 0; --c) ring_issue(/*per_col=*/1);

  // Barrier A: every router row written. Then this block routes every token (warp t: token t)
  // from the logits and sorts the rows, into shared memory.
  __syncthreads();
  TraceStamp(trace, 2);
  if (threadIdx.x == 0) GridWait(&bar[0], old_a, backoff);
  __syncthreads();
  TraceStamp(trace, 3);
  float* logits = block_smem + l.logits;
  for (int q = threadIdx.x; q < num_tokens * e_count; q += blockDim.x) {
    logits[q] = __ldcg(a.logits_g + q);  // L2: written by other SMs during this launch
  }
  __syncthreads();
  int32_t* s_ids = reinterpret_cast<int32_t*>(block_smem + l.ids);
  float* s_w = block_smem + l.weights;
  if (warp < num_tokens) {
    RouteArgs local = ra;
    local.topk_ids = s_ids;
    local.topk_weights = s_w;
    moe_detail::RouteToken(logits + warp * e_count,
                           block_smem + l.scratch + warp * moe_detail::RouteScratchFloats(ra),
                           local, warp);
  }
  __syncthreads();
  int32_t* sorted_rows = reinterpret_cast<int32_t*>(block_smem + l.sorted_rows);
  int32_t* row_to_sorted = reinterpret_cast<int32_t*>(block_smem + l.row_to_sorted);
  int32_t* num_active_s = reinterpret_cast<int32_t*>(block_smem + l.num_active);
  SortRowsFixed(s_ids, rows, e_count, offsets, active, sorted_rows, row_to_sorted,
                reinterpret_cast<int32_t*>(block_smem + l.first), num_active_s);
  if (blockIdx.x == 0) {
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      ra.topk_ids[r] = s_ids[r];
      ra.topk_weights[r] = s_w[r];
    }
  }
  const int slots = *num_active_s;
  TraceStamp(trace, 4);

  // Phase 2: the routed experts' gate/up + SiLU·mul (MoePipedGateUpKernel's tasks and sums),
  // task q of the routed list at index shared_cols + q of the combined list.
  if (route_first) {
    PipedGateUp<kRows>(ARows{a.x, sorted_rows, top_k, h}, a.w_gate_up, offsets, active, slots, n,
                       a.act, a.sh, num_tokens, shared_cols, gw, warps, /*shared_first=*/true);
    if (shared_cols > 0 && gw < h && lane == 0 && !ring &&
        (a.tuning & kMoeBlockTuneNoSharedDownPrefetch) == 0) {
      cuda_detail::PrefetchL2(a.sh.w_down + static_cast<int64_t>(gw) * a.sh.n,
                              static_cast<uint32_t>(a.sh.n) * sizeof(bf16));
    }
  } else {
    const int first = ((gw - shared_cols) % warps + warps) % warps;
    PipedGateUp<kRows>(ARows{a.x, sorted_rows, top_k, h}, a.w_gate_up, offsets, active, slots, n,
                       a.act, a.sh, num_tokens, /*shared_cols=*/0, first, warps);
  }
  __syncthreads();
  TraceStamp(trace, 5);
  if (threadIdx.x == 0) old_b = GridArrive(&bar[1], blocks);
  // This warp's routed down rows of its first output column, into L2 while the grid drains.
  if (gw < h && lane < slots && !ring && (a.tuning & kMoeBlockTuneNoRoutedDownPrefetch) == 0) {
    cuda_detail::PrefetchL2(a.w_down + (static_cast<int64_t>(active[lane]) * h + gw) * n,
                            static_cast<uint32_t>(n) * sizeof(bf16));
  }
  // The ring's remaining first chunks (routed rows now that the sort is known), in flight
  // while the grid drains into barrier B.
  const int per_col = slots + shared_tasks;
  if (ring) {
    // Where the pre-routing chunks left the cursor (ring_pre chunks of column 0's shared row).
    const int pre = ring_pre();
    const int v = pre * kRingChunk;
    ring_issued = pre;
    ic = pre > 0 && v >= a.sh.n / 8 ? RingCursor{0, 1, 0} : RingCursor{0, 0, v};
    while (ring_issued < kRingStages) ring_issue(per_col);
  }
  // Barrier B: every activation (routed and shared) written.
  if (threadIdx.x == 0) GridWait(&bar[1], old_b, backoff);
  __syncthreads();
  TraceStamp(trace, 6);
  // Every block is resident and past its last read of x: a programmatic dependent (the next
  // layer's norm) may launch; it waits for this grid's completion before reading out.
  attention_detail::LaunchDependents();

  // Phase 3: down + combine, a warp per output column c (gw, gw + warps, ...). Per column the
  // tasks are the touched experts in slot order, then the shared expert; each routed row
  // result goes to the warp's val[sorted position] rounded to bf16 (DownPair's rounding), and
  // the column's last task combines (MoeDownCombineKernel's order and roundings).
  float* val = block_smem + l.val + warp * static_cast<int>(kMoeFusedMaxRows);
  // The column's outputs from the routed rows' values in val and the shared row's sum on lane
  // t (t < T): MoeDownCombineKernel's order and roundings.
  auto combine = [&](int col, float shared_v) {
    __syncwarp();
    if (lane < num_tokens) {
      const int t = lane;
      float sum = 0.0f;
      for (int kk = 0; kk < top_k; ++kk) {
        sum = fmaf(s_w[t * top_k + kk], val[row_to_sorted[t * top_k + kk]], sum);
      }
      bf16 r = __float2bfloat16_rn(sum);
      if (shared_cols > 0) {
        r = __float2bfloat16_rn(__bfloat162float(__float2bfloat16_rn(shared_v)) +
                                __bfloat162float(r));
      }
      a.out[static_cast<int64_t>(t) * h + col] = r;
    }
    __syncwarp();
  };
  if (ring) {
    // kMoeBlockTuneRingDown: chunk `step` waits for its cp.async group (all but the newest
    // kRingStages - 1), is summed from the lane's own ring vectors (each lane adds its vectors
    // lane, lane + 32, ... of the row in ascending order from 0, FmaVec's order, then the
    // butterfly: WarpDotChunked's sums bit for bit), and its slot is refilled with chunk
    // step + kRingStages. The shared row comes first in a column (its value waits on lane t
    // in shared_v), the routed rows after it; the column's last row combines.
    const int chunks_routed = (n / 8 + kRingChunk - 1) / kRingChunk;
    const int total = my_cols() * (ring_chunks_shared() + slots * chunks_routed);
    RingCursor cc{0, 0, 0};
    float acc[1][kRows];
    moe_detail::ZeroAcc(acc);
    float shared_v = 0.0f;
    for (int step = 0; step < total; ++step) {  // warp-uniform
      RingWait<kRingStages - 1>();
      if (cc.j >= per_col) {
        cc.j = 0;
        ++cc.ci;
      }
      const RingTask t = ring_task(cc.ci, cc.j);
      const int rows_t = t.end - t.begin;
      const bf16* ar[kRows];
#pragma unroll
      for (int jj = 0; jj < kRows; ++jj) {
        ar[jj] = t.act + static_cast<int64_t>(t.begin + (jj < rows_t ? jj : 0)) * t.act_k;
      }
      const uint4* src = ring_slot(step);
#pragma unroll
      for (int u = 0; u < kRingVecs; ++u) {
        const int i = cc.v0 + u * 32 + lane;
        if (i >= t.vecs) break;  // lane-local (a vector this lane did not copy is not used)
        const uint4 raw = src[u * 32 + lane];
        cuda_detail::Bf16x8 v;
        static_assert(sizeof(v) == sizeof(raw));
        memcpy(&v, &raw, sizeof(v));
        float wf[1][8];
        cuda_detail::ToFloat8(v, wf[0]);
        moe_detail::FmaVec(wf, ar, i, rows_t, acc);
      }
      cc.v0 += kRingChunk;
      if (cc.v0 >= t.vecs) {  // the task's last chunk (warp-uniform)
        moe_detail::WarpSumAcc(acc);
        if (t.shared) {
#pragma unroll
          for (int jj = 0; jj < kRows; ++jj) {
            if (lane == jj) shared_v = acc[0][jj];
          }
        } else {
#pragma unroll
          for (int jj = 0; jj < kRows; ++jj) {
            if (jj < rows_t && lane == jj) {
              val[t.begin + jj] = __bfloat162float(__float2bfloat16_rn(acc[0][jj]));
            }
          }
        }
        if (cc.j == per_col - 1) combine(gw + cc.ci * warps, shared_v);
        moe_detail::ZeroAcc(acc);
        cc.v0 = 0;
        ++cc.j;
      }
      ring_issue(per_col);  // chunk step + kRingStages into the slot just read
    }
    if (trace) {
      __syncthreads();
      TraceStamp(trace, 7);
    }
    return;
  }
  auto task_at = [&](int q, PipeTask* t) {
    const int col = gw + (q / per_col) * warps;
    const int j = q % per_col;
    t->w_stride = 0;
    if (j < slots) {
      const int e = active[j];
      t->w0 = a.w_down + (static_cast<int64_t>(e) * h + col) * n;
      t->a = ARows{a.act, nullptr, 1, n};
      t->begin = offsets[e];
      t->end = offsets[e + 1];
    } else {
      t->w0 = a.sh.w_down + static_cast<int64_t>(col) * a.sh.n;
      t->a = ARows{a.sh.act, nullptr, 1, a.sh.n};
      t->begin = 0;
      t->end = num_tokens;
    }
    return true;
  };
  auto sink = [&](int q, int p0, int rows_in_pass, const float(&acc)[1][kRows]) {
    const int col = gw + (q / per_col) * warps;
    const int j = q % per_col;
    if (j < slots) {
#pragma unroll
      for (int jj = 0; jj < kRows; ++jj) {
        if (jj < rows_in_pass && lane == jj) {
          val[p0 + jj] = __bfloat162float(__float2bfloat16_rn(acc[0][jj]));
        }
      }
    }
    // The column's last task and (shared rows: the only pass, T <= kRows) its last pass.
    if (j != per_col - 1 || p0 + rows_in_pass < (j < slots ? offsets[active[j] + 1] : num_tokens)) {
      return;
    }
    float shared_v = 0.0f;
#pragma unroll
    for (int jj = 0; jj < kRows; ++jj) {
      if (lane == jj) shared_v = acc[0][jj];
    }
    combine(col, shared_v);
  };
  // One weight row per task (kBlockDownVecs vectors per lane per chunk).
  PipelinedWarpDots<1, kRows, kBlockDownVecs<kRows>>(0, 1, my_cols() * per_col, task_at, sink);
  if (trace) {
    __syncthreads();
    TraceStamp(trace, 7);
  }
}

// Blocks of a MoeBlockDecodeKernel launch: as many as fit at once (occupancy API for this
// kernel and shared memory), at most per_sm_max per SM; 0 when none fits or on a CUDA error.
// Cached per (device, kernel, shared bytes): no synchronizing call after the first. Past
// 48 KiB (kMoeBlockTuneRingDown's ring) the kernel's dynamic shared-memory limit is first
// raised to the device's per-block opt-in maximum (a function attribute, so every later
// launch of the kernel on this device may use up to that; the bytes a launch asks for, not
// the limit, set its occupancy); 0 when smem exceeds that maximum.
int BlockDecodeGrid(const void* kernel, size_t smem, int per_sm_max = 2) {
  static std::mutex* const mu = new std::mutex;
  static auto* const cache = new std::map<std::tuple<int, const void*, size_t>, int>;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const auto key = std::make_tuple(device * 4 + per_sm_max, kernel, smem);
  {
    std::lock_guard<std::mutex> lock(*mu);
    if (const auto it = cache->find(key); it != cache->end()) return it->second;
  }
  if (smem > 48 * 1024) {
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess ||
        smem > static_cast<size_t>(optin) ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) !=
            cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
  }
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlockWarps * 32, smem) !=
          cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const int blocks = std::max(0, std::min(per_sm, per_sm_max)) * std::max(sms, 0);
  std::lock_guard<std::mutex> lock(*mu);
  cache->emplace(key, blocks);
  return blocks;
}

using BlockDecodeFn = void (*)(BlockArgs);
template <bool kRing>
BlockDecodeFn PickBlockDecodeRing(int64_t num_tokens) {
  return num_tokens == 1   ? MoeBlockDecodeKernel<1, kRing>
         : num_tokens == 2 ? MoeBlockDecodeKernel<2, kRing>
         : num_tokens <= 4 ? MoeBlockDecodeKernel<4, kRing>
                           : MoeBlockDecodeKernel<kWarpDotRows, kRing>;
}
// The kernel for a step of num_tokens tokens under these SetMoeBlockDecodeTuning flags.
BlockDecodeFn PickBlockDecode(int64_t num_tokens, int tuning) {
  return (tuning & kMoeBlockTuneRingDown) != 0 ? PickBlockDecodeRing<true>(num_tokens)
                                               : PickBlockDecodeRing<false>(num_tokens);
}

// Dynamic shared memory of a MoeBlockDecodeKernel launch; ring: kMoeBlockTuneRingDown.
size_t BlockDecodeSmemBytes(int64_t num_tokens, const MoeRoutingParams& p, bool ring) {
  return static_cast<size_t>(MakeBlockSmem(static_cast<int>(num_tokens),
                                           static_cast<int>(p.num_experts),
                                           static_cast<int>(p.n_group), static_cast<int>(p.top_k),
                                           ring)
                                 .words) *
         sizeof(float);
}

// SetMoeDecodeVariant's setting.
std::atomic<int> g_moe_decode_variant{6};
// SetMoeGemvMaxTokens's setting.
std::atomic<int64_t> g_moe_gemv_max_tokens{kMoeGemvMaxTokens};

// SetMoeBlockDecodeTuning's flags.
std::atomic<int> g_moe_block_tuning{kMoeBlockTuneDefault};

// The variant the three-launch fused path follows: the setting, except 6 under variant 8 (its
// fallback for steps MoeBlockDecodeCuda does not take).
int FusedPathVariant() {
  const int v = g_moe_decode_variant.load(std::memory_order_relaxed);
  return v == 8 ? 6 : v;
}

}  // namespace

size_t MoeCudaWorkspaceBytes(int64_t max_tokens, int64_t top_k, int64_t num_experts, int64_t hidden,
                             int64_t intermediate) {
  if (max_tokens <= 0 || top_k <= 0 || num_experts <= 0 || hidden <= 0 || intermediate <= 0) {
    return 0;
  }
  return MakeLayout(max_tokens * top_k, num_experts, hidden, intermediate).total;
}

absl::Status MoeExpertsCuda(const bf16* x, const int32_t* topk_ids, const float* topk_weights,
                            int64_t num_tokens, int64_t hidden, int64_t intermediate, int64_t top_k,
                            int64_t num_experts, const bf16* w_gate_up, const bf16* w_down,
                            bf16* out, MoeCudaWorkspace workspace, cudaStream_t stream,
                            MoeExpertsPath path) {
  if (num_tokens < 0 || num_experts < 1 || num_experts > kMoeCudaMaxExperts || top_k < 1 ||
      top_k > num_experts || hidden < 8 || hidden % 8 != 0 || intermediate < 8 ||
      intermediate % 8 != 0 || hidden > kMaxDim || intermediate > kMaxDim ||
      num_tokens * top_k > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeExpertsCuda: bad shape num_tokens=", num_tokens, " hidden=", hidden,
        " intermediate=", intermediate, " top_k=", top_k, " num_experts=", num_experts,
        " (hidden and intermediate: multiples of 8 in [8, 2^22]; 1 <= top_k <= num_experts <= ",
        kMoeCudaMaxExperts, ")"));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (topk_ids == nullptr || topk_weights == nullptr) {
    return absl::InvalidArgumentError("MoeExpertsCuda: null topk_ids or topk_weights");
  }
  // Rows move as 16-byte vectors; ids and weights are read one element at a time.
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(w_gate_up),
                        static_cast<const void*>(w_down), static_cast<const void*>(out),
                        static_cast<const void*>(workspace.data)}) {
    if (p == nullptr || !Aligned16(p)) {
      return absl::InvalidArgumentError(
          "MoeExpertsCuda: x, w_gate_up, w_down, out and workspace must be non-null and 16-byte "
          "aligned");
    }
  }
  const int64_t rows = num_tokens * top_k;
  const Layout l = MakeLayout(rows, num_experts, hidden, intermediate);
  if (workspace.bytes < l.total) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeExpertsCuda: workspace of ", workspace.bytes, " bytes, need ", l.total));
  }
  unsigned char* ws = static_cast<unsigned char*>(workspace.data);
  const SortOut so = SortPointers(ws, l);
  bf16* act = reinterpret_cast<bf16*>(ws + l.act);
  bf16* expert_out = reinterpret_cast<bf16*>(ws + l.expert_out);

  const int r = static_cast<int>(rows);
  const int e = static_cast<int>(num_experts);
  const int h = static_cast<int>(hidden);
  const int i = static_cast<int>(intermediate);
  const int k = static_cast<int>(top_k);
  MoeSortKernel<<<1, kSortThreads, 2 * num_experts * sizeof(int32_t), stream>>>(topk_ids, r, e, so);
  const ARows x_rows{x, so.sorted_rows, k, h};
  const ARows act_rows{act, nullptr, 1, i};
  if (path == MoeExpertsPath::kAuto) {
    if (num_tokens <= g_moe_gemv_max_tokens.load(std::memory_order_relaxed)) {
      path = MoeExpertsPath::kGemv;
    } else if (rows <= kMoeStreamMaxRowsPerExpert * num_experts) {
      path = MoeExpertsPath::kStream;
    } else {
      path = MoeExpertsPath::kGrouped;
    }
  }
  // Touched experts <= min(E, rows): one grid slot (GEMV) or one partial tile (GEMM) each.
  const unsigned max_active = static_cast<unsigned>(std::min(num_experts, rows));
  if (path == MoeExpertsPath::kGemv) {
    // An expert's row count is usually <= num_tokens: fewer rows per pass use fewer registers.
    if (num_tokens == 1) {
      LaunchGemv<1>(x_rows, act_rows, w_gate_up, w_down, so, max_active, h, i, act, expert_out,
                    stream);
    } else if (num_tokens == 2) {
      LaunchGemv<2>(x_rows, act_rows, w_gate_up, w_down, so, max_active, h, i, act, expert_out,
                    stream);
    } else if (num_tokens <= 4) {
      LaunchGemv<4>(x_rows, act_rows, w_gate_up, w_down, so, max_active, h, i, act, expert_out,
                    stream);
    } else {
      LaunchGemv<kWarpDotRows>(x_rows, act_rows, w_gate_up, w_down, so, max_active, h, i, act,
                               expert_out, stream);
    }
  } else if (path == MoeExpertsPath::kStream) {
    // Output columns per block: one per warp (gate/up), two per warp (down).
    auto blocks = [](int n, int per_block) {
      return static_cast<unsigned>((n + per_block - 1) / per_block);
    };
    MoeStreamKernel<true>
        <<<dim3(blocks(i, kStreamWarps), max_active), kStreamWarps * 32, 0, stream>>>(
            x_rows, w_gate_up, so.offsets, so.active, so.num_active, i, act);
    MoeStreamKernel<false>
        <<<dim3(blocks(h, 2 * kStreamWarps), max_active), kStreamWarps * 32, 0, stream>>>(
            act_rows, w_down, so.offsets, so.active, so.num_active, h, expert_out);
  } else if (workspace.prefill_gemm != nullptr &&
             workspace.prefill_gemm->Takes(num_tokens, top_k, num_experts, hidden, intermediate,
                                           stream)) {
    // Large prefill steps: per-expert cuBLASLt GEMMs (moe_prefill_gemm_cuda.h).
    if (absl::Status s = workspace.prefill_gemm->Run(x, so.offsets, so.sorted_rows, num_tokens,
                                                     w_gate_up, w_down, act, expert_out, stream);
        !s.ok()) {
      return s;
    }
  } else {
    const unsigned max_tiles = static_cast<unsigned>((rows + kBm - 1) / kBm) + max_active;
    auto columns = [](int n) { return static_cast<unsigned>((n + kBn - 1) / kBn); };
    MoeGroupedGemmKernel<true><<<dim3(max_tiles, columns(i)), kGemmThreads, 0, stream>>>(
        x_rows, w_gate_up, so.offsets, so.tile_offsets, e, i, act);
    MoeGroupedGemmKernel<false><<<dim3(max_tiles, columns(h)), kGemmThreads, 0, stream>>>(
        act_rows, w_down, so.offsets, so.tile_offsets, e, h, expert_out);
  }
  MoeCombineKernel<<<static_cast<unsigned>(num_tokens), kCombineThreads, 0, stream>>>(
      expert_out, so.row_to_sorted, topk_weights, k, h, out);
  return CudaLaunchStatus("MoeExpertsCuda launch");
}

absl::Status SetMoeGemvMaxTokens(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("SetMoeGemvMaxTokens: ", n, " < 0"));
  g_moe_gemv_max_tokens.store(n, std::memory_order_relaxed);
  return absl::OkStatus();
}

int64_t MoeGemvMaxTokens() { return g_moe_gemv_max_tokens.load(std::memory_order_relaxed); }

absl::Status SetMoeDecodeVariant(int variant) {
  if (variant < 0 || variant > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetMoeDecodeVariant: variant ", variant, " is not in 0..8"));
  }
  g_moe_decode_variant.store(variant, std::memory_order_relaxed);
  return absl::OkStatus();
}

int MoeDecodeVariant() { return g_moe_decode_variant.load(std::memory_order_relaxed); }

bool MoeFusedDecodeSupported(int64_t num_tokens, const MoeRoutingParams& params) {
  return num_tokens >= 1 && num_tokens <= kMoeFusedMaxTokens && params.top_k >= 1 &&
         num_tokens * params.top_k <= kMoeFusedMaxRows && params.num_experts >= 1 &&
         params.num_experts <= kMoeCudaMaxExperts && params.n_group >= 1 &&
         FusedRouteSmemFloats(num_tokens, params) * sizeof(float) <= 48 * 1024;
}

absl::Status MoeFusedRouteCuda(const bf16* x, const bf16* w_gate, const float* correction_bias,
                               int64_t num_tokens, int64_t hidden, const MoeRoutingParams& params,
                               int32_t* topk_ids, float* topk_weights, MoeCudaWorkspace workspace,
                               cudaStream_t stream, MoeFusedRouteMode mode,
                               const MoeSharedExpert* shared) {
  if (absl::Status s = ValidateMoeRoutingParams(params); !s.ok()) return s;
  if (!MoeFusedDecodeSupported(num_tokens, params) || hidden < 8 || hidden % 8 != 0 ||
      hidden > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeFusedRouteCuda: num_tokens=", num_tokens, " top_k=", params.top_k,
        " num_experts=", params.num_experts, " hidden=", hidden,
        " outside the fused decode path (MoeFusedDecodeSupported; hidden a multiple of 8)"));
  }
  if (x == nullptr || w_gate == nullptr || !Aligned16(x) || !Aligned16(w_gate) ||
      topk_ids == nullptr || topk_weights == nullptr || workspace.data == nullptr ||
      !Aligned16(workspace.data)) {
    return absl::InvalidArgumentError(
        "MoeFusedRouteCuda: x, w_gate and workspace must be non-null and 16-byte aligned, "
        "topk_ids and topk_weights non-null");
  }
  // Only the sort segments are written; they come first and depend on rows and E alone.
  const Layout l = MakeLayout(num_tokens * params.top_k, params.num_experts, 8, 8);
  if (workspace.bytes < l.act) {
    return absl::InvalidArgumentError(absl::StrCat("MoeFusedRouteCuda: workspace of ",
                                                   workspace.bytes, " bytes, need ", l.act));
  }
  SharedArgs sh;
  if (absl::Status s = ToSharedArgs(shared, "MoeFusedRouteCuda", &sh); !s.ok()) return s;
  const RouteArgs args =
      moe_detail::MakeRouteArgs(params, correction_bias, num_tokens, topk_ids, topk_weights);
  const SortOut so = SortPointers(workspace.data, l);
  const size_t smem = FusedRouteSmemFloats(num_tokens, params) * sizeof(float);
  const int h = static_cast<int>(hidden);
  if (mode == MoeFusedRouteMode::kMultiBlock) {
    unsigned char* ws = static_cast<unsigned char*>(workspace.data);
    float* logits = reinterpret_cast<float*>(ws + l.route_logits);
    unsigned int* ws_counter = reinterpret_cast<unsigned int*>(ws + l.route_counter);
    const int slot = RouteCounterSlot(workspace.data);
    if (slot < 0) {
      if (const cudaError_t err = cudaMemsetAsync(ws_counter, 0, sizeof(unsigned int), stream);
          err != cudaSuccess) {
        return absl::InternalError(
            absl::StrCat("MoeFusedRouteCuda counter memset: ", cudaGetErrorString(err)));
      }
    }
    // Decode variant 5: persistent shared-expert blocks on the SMs the routing blocks leave.
    const bool piped = FusedPathVariant() >= 5;
    const int route_blocks = RouteMultiBlocks(static_cast<int>(params.num_experts));
    int shared_blocks = (sh.n + kRouteMultiWarps - 1) / kRouteMultiWarps;
    // Decode variant 7: no shared blocks (MoeFusedExpertsCuda computes the shared gate/up); the
    // routing blocks only prefetch its weights (under DecodePdl).
    if (FusedPathVariant() >= 7) shared_blocks = 0;
    if (piped && shared_blocks > 0) {
      shared_blocks = std::max(1, std::min(shared_blocks, PipedBlocks() - route_blocks));
    }
    const dim3 grid(static_cast<unsigned>(route_blocks + shared_blocks));
    constexpr int kThreads = kRouteMultiWarps * 32;
    const RouteMultiFn kernel = num_tokens == 1   ? PickRouteMulti<1>(piped)
                                : num_tokens == 2 ? PickRouteMulti<2>(piped)
                                : num_tokens <= 4 ? PickRouteMulti<4>(piped)
                                                  : PickRouteMulti<kWarpDotRows>(piped);
    // A memset node before the launch (no counter slot left) breaks the programmatic chain.
    const bool pdl = DecodePdlMoe() && slot >= 0;
    const int pdl_mode = !pdl ? 0 : GemvPdlPrefetch() == kGemvPdlPrefetchSlice ? 2 : 1;
    (void)attention_detail::LaunchKernelMaybePdl(kernel, grid, dim3(kThreads), smem, stream, pdl,
                                                 x, w_gate, h, args, so, logits, ws_counter,
                                                 slot, sh, pdl_mode);
    return CudaLaunchStatus("MoeFusedRouteCuda launch");
  }
  if (shared != nullptr) {
    return absl::InvalidArgumentError(
        "MoeFusedRouteCuda: a shared expert needs MoeFusedRouteMode::kMultiBlock");
  }
  const bool pdl = DecodePdlMoe();
  auto* const kernel = num_tokens == 1   ? &MoeFusedRouteKernel<1>
                       : num_tokens == 2 ? &MoeFusedRouteKernel<2>
                       : num_tokens <= 4 ? &MoeFusedRouteKernel<4>
                                         : &MoeFusedRouteKernel<kWarpDotRows>;
  (void)attention_detail::LaunchKernelMaybePdl(kernel, dim3(1), dim3(kFusedRouteThreads), smem,
                                               stream, pdl, x, w_gate, h, args, so, pdl);
  return CudaLaunchStatus("MoeFusedRouteCuda launch");
}

namespace {

// Both launches of MoeFusedExpertsCuda with kRows rows per pass over an expert's weights;
// piped: decode variant 5's kernels (MoePipedGateUpKernel, MoeDownCombineKernel<kRows, true>).
template <int kRows>
void LaunchFusedExperts(const ARows& x_rows, const bf16* w_gate_up, const bf16* w_down,
                        const SortOut& so, const float* topk_weights, unsigned max_active,
                        int num_tokens, int top_k, int h, int i, bf16* act, const SharedArgs& sh,
                        bool shared_gate_up, const bf16* add, bf16* out, bool pdl, bool piped,
                        cudaStream_t stream) {
  if (piped) {
    // One persistent wave: at most PipedBlocks() blocks, fewer when there are fewer tasks.
    const int shared_cols = shared_gate_up ? sh.n : 0;
    const int64_t tasks = static_cast<int64_t>(max_active) * i + shared_cols;
    const unsigned blocks = static_cast<unsigned>(
        std::min<int64_t>((tasks + kGemvWarps - 1) / kGemvWarps, PipedBlocks()));
    // Decode variant 6 (or kernels::DecodePdlMoe()): a programmatic dependent of the routing
    // launch before it.
    // Decode variant 7: the shared columns before the wait (MoePipedGateUpKernel).
    const bool shared_first = shared_cols > 0 && FusedPathVariant() >= 7;
    (void)attention_detail::LaunchKernelMaybePdl(
        MoePipedGateUpKernel<kRows>, dim3(blocks), dim3(kGemvWarps * 32), 0, stream,
        pdl && (FusedPathVariant() >= 6 || DecodePdlMoe()), x_rows, w_gate_up, so.offsets,
        so.active, so.num_active, i, act, sh, num_tokens, shared_cols, shared_first);
  } else {
    // Grid rows: one per possible touched expert, then enough for the shared expert's columns
    // (none when MoeFusedRouteCuda computed its activations).
    const unsigned columns = static_cast<unsigned>((i + kGemvWarps - 1) / kGemvWarps);
    const unsigned row_width = columns * kGemvWarps;
    const unsigned shared_rows =
        shared_gate_up ? (static_cast<unsigned>(sh.n) + row_width - 1) / row_width : 0u;
    const bool gate_up_pdl = DecodePdlMoe();
    (void)attention_detail::LaunchKernelMaybePdl(
        MoeFusedGateUpKernel<kRows>, dim3(columns, max_active + shared_rows),
        dim3(kGemvWarps * 32), 0, stream, gate_up_pdl, x_rows, w_gate_up, so.offsets, so.active,
        so.num_active, i, act, sh, num_tokens, static_cast<int>(max_active), gate_up_pdl);
  }
  // A launch error is reported by the caller's CudaLaunchStatus.
  (void)attention_detail::LaunchKernelMaybePdl(
      piped ? MoeDownCombineKernel<kRows, true> : MoeDownCombineKernel<kRows, false>, dim3(static_cast<unsigned>(h / kDownCols)),
      dim3(kDownWarps * 32), 0, stream, pdl, act, w_down, so.offsets, so.active, so.num_active,
      so.row_to_sorted, topk_weights, num_tokens, top_k, h, i, sh, add, out, pdl,
      pdl && DecodePdlMoe());
}

}  // namespace

absl::Status MoeFusedExpertsCuda(const bf16* x, const float* topk_weights, int64_t num_tokens,
                                 int64_t hidden, int64_t intermediate, int64_t top_k,
                                 int64_t num_experts, const bf16* w_gate_up, const bf16* w_down,
                                 const bf16* add, bf16* out, MoeCudaWorkspace workspace,
                                 cudaStream_t stream, const MoeSharedExpert* shared) {
  if (num_tokens < 1 || num_tokens > kMoeFusedMaxTokens || top_k < 1 || top_k > num_experts ||
      num_tokens * top_k > kMoeFusedMaxRows || num_experts > kMoeCudaMaxExperts || hidden < 8 ||
      hidden % 8 != 0 || intermediate < 8 || intermediate % 8 != 0 || hidden > kMaxDim ||
      intermediate > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeFusedExpertsCuda: bad shape num_tokens=", num_tokens, " hidden=", hidden,
        " intermediate=", intermediate, " top_k=", top_k, " num_experts=", num_experts,
        " (1 <= num_tokens <= ", kMoeFusedMaxTokens, ", num_tokens·top_k <= ", kMoeFusedMaxRows,
        ", hidden and intermediate multiples of 8)"));
  }
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(w_gate_up),
                        static_cast<const void*>(w_down), static_cast<const void*>(out),
                        static_cast<const void*>(workspace.data)}) {
    if (p == nullptr || !Aligned16(p)) {
      return absl::InvalidArgumentError(
          "MoeFusedExpertsCuda: x, w_gate_up, w_down, out and workspace must be non-null and "
          "16-byte aligned");
    }
  }
  if (topk_weights == nullptr) {
    return absl::InvalidArgumentError("MoeFusedExpertsCuda: null topk_weights");
  }
  SharedArgs sh;
  if (absl::Status s = ToSharedArgs(shared, "MoeFusedExpertsCuda", &sh); !s.ok()) return s;
  const bool shared_gate_up = shared != nullptr && !shared->act_ready;
  // Decode variant 4: the down launch overlaps the gate/up kernel's tail (sm_90+: PDL); under
  // kernels::DecodePdlMoe() at every variant (the gate/up kernel then waits before it triggers).
  const bool pdl = (FusedPathVariant() >= 4 && PdlSupported()) || DecodePdlMoe();
  // Decode variant 5: persistent pipelined gate/up and pipelined down warps (same bits).
  const bool piped = FusedPathVariant() >= 5;
  const Layout l = MakeLayout(num_tokens * top_k, num_experts, hidden, intermediate);
  if (workspace.bytes < l.total) {
    return absl::InvalidArgumentError(absl::StrCat("MoeFusedExpertsCuda: workspace of ",
                                                   workspace.bytes, " bytes, need ", l.total));
  }
  const SortOut so = SortPointers(workspace.data, l);
  bf16* act = reinterpret_cast<bf16*>(static_cast<unsigned char*>(workspace.data) + l.act);
  const ARows x_rows{x, so.sorted_rows, static_cast<int>(top_k), static_cast<int>(hidden)};
  const unsigned max_active = static_cast<unsigned>(std::min(num_experts, num_tokens * top_k));
  const int t = static_cast<int>(num_tokens), k = static_cast<int>(top_k);
  const int h = static_cast<int>(hidden), i = static_cast<int>(intermediate);
  if (num_tokens == 1) {
    LaunchFusedExperts<1>(x_rows, w_gate_up, w_down, so, topk_weights, max_active, t, k, h, i,
                          act, sh, shared_gate_up, add, out, pdl, piped, stream);
  } else if (num_tokens == 2) {
    LaunchFusedExperts<2>(x_rows, w_gate_up, w_down, so, topk_weights, max_active, t, k, h, i,
                          act, sh, shared_gate_up, add, out, pdl, piped, stream);
  } else if (num_tokens <= 4) {
    LaunchFusedExperts<4>(x_rows, w_gate_up, w_down, so, topk_weights, max_active, t, k, h, i,
                          act, sh, shared_gate_up, add, out, pdl, piped, stream);
  } else {
    LaunchFusedExperts<kWarpDotRows>(x_rows, w_gate_up, w_down, so, topk_weights, max_active, t,
                                     k, h, i, act, sh, shared_gate_up, add, out, pdl, piped, stream);
  }
  return CudaLaunchStatus("MoeFusedExpertsCuda launch");
}

bool MoeBlockDecodeSupported(int64_t num_tokens, const MoeRoutingParams& params) {
  return MoeBlockDecodeBlocks(num_tokens, params) > 0;
}

absl::Status MoeBlockDecodeCuda(const bf16* x, const bf16* w_gate, const float* correction_bias,
                                int64_t num_tokens, int64_t hidden, int64_t intermediate,
                                const MoeRoutingParams& params, const bf16* w_gate_up,
                                const bf16* w_down, const MoeSharedExpert* shared,
                                int32_t* topk_ids, float* topk_weights, bf16* out,
                                MoeCudaWorkspace workspace, cudaStream_t stream) {
  if (absl::Status s = ValidateMoeRoutingParams(params); !s.ok()) return s;
  if (!MoeFusedDecodeSupported(num_tokens, params) || hidden < 8 || hidden % 8 != 0 ||
      hidden > kMaxDim || intermediate < 8 || intermediate % 8 != 0 || intermediate > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeBlockDecodeCuda: num_tokens=", num_tokens, " top_k=", params.top_k,
        " num_experts=", params.num_experts, " hidden=", hidden, " intermediate=", intermediate,
        " outside the fused decode path (MoeFusedDecodeSupported; hidden and intermediate "
        "multiples of 8 in [8, 2^22])"));
  }
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(w_gate),
                        static_cast<const void*>(w_gate_up), static_cast<const void*>(w_down),
                        static_cast<const void*>(out), static_cast<const void*>(workspace.data)}) {
    if (p == nullptr || !Aligned16(p)) {
      return absl::InvalidArgumentError(
          "MoeBlockDecodeCuda: x, w_gate, w_gate_up, w_down, out and workspace must be "
          "non-null and 16-byte aligned");
    }
  }
  if (topk_ids == nullptr || topk_weights == nullptr) {
    return absl::InvalidArgumentError("MoeBlockDecodeCuda: null topk_ids or topk_weights");
  }
  SharedArgs sh;
  if (absl::Status s = ToSharedArgs(shared, "MoeBlockDecodeCuda", &sh); !s.ok()) return s;
  const int64_t top_k = params.top_k, num_experts = params.num_experts;
  const Layout l = MakeLayout(num_tokens * top_k, num_experts, hidden, intermediate);
  if (workspace.bytes < l.total) {
    return absl::InvalidArgumentError(absl::StrCat("MoeBlockDecodeCuda: workspace of ",
                                                   workspace.bytes, " bytes, need ", l.total));
  }
  const int tuning = g_moe_block_tuning.load(std::memory_order_relaxed);
  const BlockDecodeFn kernel = PickBlockDecode(num_tokens, tuning);
  const size_t smem =
      BlockDecodeSmemBytes(num_tokens, params, (tuning & kMoeBlockTuneRingDown) != 0);
  const int blocks = BlockDecodeGrid(reinterpret_cast<const void*>(kernel), smem,
                                     (tuning & kMoeBlockTuneOneBlockPerSm) ? 1 : 2);
  if (blocks <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("MoeBlockDecodeCuda: no resident grid for num_tokens=", num_tokens, " (", smem,
                     " bytes of shared memory per block)"));
  }
  unsigned char* ws = static_cast<unsigned char*>(workspace.data);
  BlockArgs args;
  args.x = x;
  args.w_router = w_gate;
  args.w_gate_up = w_gate_up;
  args.w_down = w_down;
  args.hidden = static_cast<int>(hidden);
  args.inter = static_cast<int>(intermediate);
  args.route =
      moe_detail::MakeRouteArgs(params, correction_bias, num_tokens, topk_ids, topk_weights);
  args.sh = sh;
  args.logits_g = reinterpret_cast<float*>(ws + l.route_logits);
  args.act = reinterpret_cast<bf16*>(ws + l.act);
  args.ws_bar = reinterpret_cast<unsigned int*>(ws + l.route_counter);
  args.slot = RouteCounterSlot(workspace.data);
  args.tuning = tuning;
  args.out = out;
  if (args.slot < 0) {
    if (const cudaError_t err = cudaMemsetAsync(args.ws_bar, 0, 2 * sizeof(unsigned int), stream);
        err != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("MoeBlockDecodeCuda counter memset: ", cudaGetErrorString(err)));
    }
  }
  // Cooperative: the driver makes every block resident at once (or fails the launch), which
  // the grid barriers need, also next to other streams' kernels.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kBlockWarps * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (tuning & kMoeBlockTuneNoCooperative) ? 0 : 1;
  (void)cudaLaunchKernelEx(&cfg, kernel, args);
  return CudaLaunchStatus("MoeBlockDecodeCuda launch");
}

absl::Status SetMoeBlockDecodeTuning(int flags) {
  if (flags < 0 || flags > kMoeBlockTuneAll) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetMoeBlockDecodeTuning: flags ", flags, " outside 0..", kMoeBlockTuneAll));
  }
  g_moe_block_tuning.store(flags, std::memory_order_relaxed);
  return absl::OkStatus();
}

int MoeBlockDecodeTuning() { return g_moe_block_tuning.load(std::memory_order_relaxed); }

absl::StatusOr<std::vector<uint64_t>> MoeBlockDecodeTrace(int64_t blocks) {
  if (blocks < 1 || blocks > kBlockTraceBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("MoeBlockDecodeTrace: blocks ", blocks));
  }
  std::vector<uint64_t> host(static_cast<size_t>(blocks) * kBlockTracePoints);
  if (const cudaError_t err =
          cudaMemcpyFromSymbol(host.data(), g_block_trace, host.size() * sizeof(uint64_t));
      err != cudaSuccess) {
    return absl::InternalError(absl::StrCat("MoeBlockDecodeTrace: ", cudaGetErrorString(err)));
  }
  return host;
}

int64_t MoeBlockDecodeBlocks(int64_t num_tokens, const MoeRoutingParams& params) {
  if (!MoeFusedDecodeSupported(num_tokens, params)) return 0;
  const int tuning = MoeBlockDecodeTuning();
  const size_t smem =
      BlockDecodeSmemBytes(num_tokens, params, (tuning & kMoeBlockTuneRingDown) != 0);
  return BlockDecodeGrid(reinterpret_cast<const void*>(PickBlockDecode(num_tokens, tuning)), smem,
                         (tuning & kMoeBlockTuneOneBlockPerSm) ? 1 : 2);
}
}  // namespace sluice::kernels
