// CUDA routed experts; see moe_cuda.h for the API and moe_experts.h for the CPU reference.
//
// Four launches, all sized from host-known bounds so nothing is read back:
//   1. MoeSortKernel (one block): histogram of the (token, k) rows by expert, exclusive scans
//      into row offsets, tile offsets (grouped path) and the list of touched experts (GEMV
//      path), then the permutation sorted_rows / row_to_sorted. Positions within
//      an expert come from shared-memory atomics, so their order may vary between runs; every
//      row is computed independently of its neighbours, so the results do not.
//   2. gate/up + SiLU·mul → act [rows, I] bf16 (sorted order), x rows gathered on load.
//   3. down → expert_out [rows, H] bf16 (sorted order).
//   4. MoeCombineKernel: out[t] = Σ_k w[t, k] · expert_out[row_to_sorted[t, k]] in k order.
// Steps 2 and 3 are the GEMV kernels (a warp per output column streams that column's weight
// row of each touched expert once per 8 rows) or the grouped WMMA
// GEMM (64×64 tiles fed by a 3-deep cp.async ring; the grid covers the largest possible tile
// count and CTAs past the device-side count exit).
#include <mma.h>

#include <algorithm>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_cuda_detail.cuh"
#include "kernels/moe/moe_experts_device.cuh"
#include "kernels/moe/moe_prefill_gemm_cuda.h"

namespace sluice::kernels {
namespace {

using namespace moe_detail;  // NOLINT(build/namespaces): the shared workspace and sort
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
constexpr int kCombineThreads = 128;
// Grouped GEMM tile: kBm sorted rows × kBn output columns (per weight matrix), kBk deep;
// four warps, each a 32×32 quadrant of 2×2 WMMA 16×16×16 fragments per matrix.
constexpr int kBn = 64;
constexpr int kBk = 32;
constexpr int kLds = kBk + 8;  // bf16 row pitch of the A/B tiles: 80 bytes (WMMA needs 16 B
                               // multiples; the offset spreads rows over banks)
constexpr int kLdc = kBn + 4;  // fp32 row pitch of the epilogue tile (16-byte multiple)
constexpr int kGemmThreads = 128;
constexpr int kGemmStages = 3;  // cp.async ring depth of the grouped GEMM
// One block of kSortThreads; dynamic shared memory: counts [E] and cursors [E] (int32).
__global__ void __launch_bounds__(kSortThreads)
    MoeSortKernel(const int32_t* __restrict__ topk_ids, int rows, int num_experts, SortOut o) {
  extern __shared__ int32_t sort_smem[];
  SortRows(topk_ids, rows, num_experts, o, sort_smem, sort_smem + num_experts);
}

// GEMV path, one warp per output column, blockIdx.y = slot in the touched-expert list. An
// expert's rows are taken kRows at a time (kRows >= the expert's row count in the usual case:
// a token picks an expert at most once, so counts <= num_tokens; the host picks kRows from it).
// kGateUp: weight rows col (gate) and n + col (up) of w [E, 2n, k]; else row col of w [E, n, k].
// GemvColumn: output column col of one expert (weights we) for sorted rows [begin, end)
// (WarpDotRows; the fused decode path's pipelined warps give the same sums bit for bit).
template <bool kGateUp, int kRows>
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
    WarpDotRows<kMats, kRows>(wr, a, rows, k, acc);
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
  GemvColumn<kGateUp, kRows>(a_rows, w + static_cast<int64_t>(e) * kMats * n * a_rows.k, n,
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
    if (num_tokens <= kMoeGemvMaxTokens) {
      path = MoeExpertsPath::kGemv;
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

}  // namespace sluice::kernels
