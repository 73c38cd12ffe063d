// Skinny GEMM: y[m, n] = x[m, k] · w[n, k]ᵀ for decode batches of 1..64 rows on the tensor
// cores, streaming each weight element from HBM once.
//
// At small m a projection is bandwidth-bound (m FLOPs per weight byte against the H200's
// ~230 FLOP/B balance), and the fp32 GEMV runs out of FMA throughput past a few rows (H200,
// Llama-3-8B qkv at m = 8: 49 µs vs 17 for cuBLASLt). Here each warp owns 32 weight rows and a
// range of k and streams them through its own cp.async ring in shared memory (kStages 64-wide
// k-blocks, 4 KiB each, so ~100 KiB of weights are in flight per SM without holding
// registers), while the tensor cores do the arithmetic with the weights as the mma's A operand
// ("swap AB": yᵀ = w · xᵀ, 16 weight rows on the m16 side, 8 tokens on n8); x goes through a
// ring per k-slice shared by the slice's warps. LinearCuda's autotuner times it at
// kSkinnyTuneMinRows..kSkinnyTuneMaxRows rows (linear_cuda.h has the measurements: it is ahead
// of cuBLASLt on some shapes up to m = 16 and behind from m = 32, where mma.sync cannot issue
// the FLOPs the copy bandwidth asks for).
//
// k permutation: a dot product does not care in which order its k terms are paired, so the
// mma's logical k columns are mapped to physical ones that make every fragment a plain 16-byte
// shared-memory load. Within a 64-wide k-block, lane (g = lane/4, t = lane%4) reads elements
// [8t, 8t + 8) and [32 + 8t, 32 + 8t + 8) of rows g and g + 8, and the same elements of x for
// token g of each 8-token group. Of
// each 16-byte unit, words 0-1 feed one k16 mma (A's a0/a2 or a1/a3, B's b0/b1: logical columns
// 2t..2t+1 and 2t+8..2t+9) and words 2-3 the next, so the A and B fragments pair the same
// physical k (PTX ISA, "Matrix Fragments for mma.m16n8k16").
//
// Split-K: kSplit warps of a CTA share a row group, each over a contiguous range of k-blocks;
// slices 1.. leave their fp32 sums in shared memory and slice 0 adds them in slice order, so
// the result is deterministic for a given (split, stages) — which LinearCuda's autotuner fixes
// per shape. Results equal LinearCpu up to fp32 summation order.
#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/linear/linear_cuda.h"
#include "kernels/linear/skinny_gemm.h"

namespace sluice::kernels {
namespace skinny_detail {
namespace {

using cuda_detail::Mma16816;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockK = 64;    // k elements of one pipeline stage
constexpr int kRowsPerWarp = 32;  // two m16 tiles (GLU: 16 gate rows + the matching 16 up rows)

// Shared-memory tiles are 128-byte rows (64 bf16 of k); 16-byte chunk c of row r sits at
// chunk c ^ 4·(r & 1), so the 8 lanes of a quarter warp (rows g, g + 1 at chunks t) read
// distinct banks.
__host__ __device__ constexpr int TileRowBytes() { return kBlockK * 2; }
__device__ __forceinline__ int ChunkOffset(int row, int chunk) {
  return row * TileRowBytes() + ((chunk ^ ((row & 1) << 2)) << 4);
}
// One warp's weight slot ([32 rows][64 k]) and one k-slice's x slot ([8·kMT tokens][64 k]).
__host__ __device__ constexpr int WSlotBytes() { return kRowsPerWarp * TileRowBytes(); }
template <int kMT>
__host__ __device__ constexpr int XSlotBytes() {
  return 8 * kMT * TileRowBytes();
}

// Shared memory of a launch: each warp's ring of kStages weight slots, then each k-slice's
// ring of kStages x slots; reused after the main loop for the split-K partial sums
// ([warp][(i·kMT + j)·4 + c][lane] fp32).
// mt: 8-token groups (kMT).
constexpr size_t SmemBytes(int mt, int split, int stages) {
  const size_t rings = size_t(stages) * (size_t{kWarps} * WSlotBytes() +
                                         size_t(split) * 8 * size_t(mt) * TileRowBytes());
  const size_t partial = split > 1 ? size_t{kWarps} * 2 * size_t(mt) * 4 * 32 * sizeof(float) : 0;
  return rings > partial ? rings : partial;
}
// Opt-in shared memory per block on sm_80 / sm_90 (227 KB on the H200).
constexpr size_t kMaxSmem = 227 * 1024;

// kMT: 8-token groups (m ≤ 8·kMT). n: output columns (kGlu: w has 2n rows, y gets n).
// Warps [s·G, (s + 1)·G) (G = kWarps / kSplit) share k-slice s and its x ring, each with its
// own 32 rows and weight ring; they meet at named barrier 1 + s once per k-block.
template <int kMT, int kSplit, int kStages, bool kGlu>
__global__ void __launch_bounds__(kThreads, 1)
    SkinnyGemmKernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                     const bf16* __restrict__ bias, bf16* __restrict__ y, int m, int n, int k) {
  static_assert(kWarps % kSplit == 0 && kStages >= 2);
  constexpr int kGroup = kWarps / kSplit;  // warps per k-slice (row groups per CTA)
  extern __shared__ __align__(128) unsigned char smem[];
  cuda_detail::LaunchDependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int slice = warp / kGroup;
  const int64_t rg = int64_t{blockIdx.x} * kGroup + warp % kGroup;  // row group
  const int blocks = (k + kBlockK - 1) / kBlockK;
  const int per_slice = (blocks + kSplit - 1) / kSplit;
  const int b_begin = slice * per_slice;
  const int b_end = min(blocks, b_begin + per_slice);
  unsigned char* wring = smem + static_cast<size_t>(warp) * kStages * WSlotBytes();
  unsigned char* xring = smem + static_cast<size_t>(kWarps) * kStages * WSlotBytes() +
                         static_cast<size_t>(slice) * kStages * XSlotBytes<kMT>();

  // Warp row r (0..31) is output column col(r): tile r / 16, row r % 16 of it. Lane copies
  // 16-byte chunk lane % 8 of rows lane / 8 + 4j (j < 8) of every k-block.
  const int my_chunk = lane & 7;
  const bf16* wsrc[8];
  bool wok[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int r = (lane >> 3) + 4 * j;
    const int64_t col = kGlu ? rg * 16 + (r & 15) : rg * kRowsPerWarp + r;
    wok[j] = col < n;
    const int64_t row = kGlu && r >= 16 ? col + n : col;
    wsrc[j] = w + (wok[j] ? row : 0) * int64_t{k} + my_chunk * 8;
  }
  auto copy_w = [&](int slot, int b) {
    unsigned char* dst = wring + slot * WSlotBytes();
    const int e = b * kBlockK + my_chunk * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int r = (lane >> 3) + 4 * j;
      const bool ok = wok[j] && e < k;
      cuda_detail::CpAsync16(dst + ChunkOffset(r, my_chunk), ok ? wsrc[j] + b * kBlockK : w,
                             ok ? 16 : 0);
    }
  };
  // The slice's threads copy block b of x (8·kMT tokens × 64 k, zeros past m and k).
  const int gtid = threadIdx.x - slice * kGroup * 32;
  auto copy_x = [&](int slot, int b) {
    unsigned char* dst = xring + slot * XSlotBytes<kMT>();
    for (int c = gtid; c < 8 * kMT * 8; c += kGroup * 32) {
      const int token = c >> 3, chunk = c & 7;
      const int e = b * kBlockK + chunk * 8;
      const bool ok = token < m && e < k;
      cuda_detail::CpAsync16(dst + ChunkOffset(token, chunk),
                             ok ? x + int64_t{token} * k + e : x, ok ? 16 : 0);
    }
  };
  auto group_barrier = [&] {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + slice), "r"(kGroup * 32) : "memory");
  };

  float acc[2][kMT][4];
  // f(accumulator, its word index (i·kMT + j)·4 + c) for every accumulator of the thread.
  auto for_each_acc = [&](auto&& f) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < kMT; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) f(acc[i][j][c], (i * kMT + j) * 4 + c);
      }
    }
  };
  for_each_acc([](float& a, int) { a = 0.0f; });
  auto compute = [&](int slot) {
    const unsigned char* ws = wring + slot * WSlotBytes();
    const unsigned char* xs = xring + slot * XSlotBytes<kMT>();
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      // Tile i's rows g and g + 8, unit u: words 0-1 feed one k16 mma, words 2-3 the next.
      uint4 wv[2][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wv[i][h] = *reinterpret_cast<const uint4*>(ws + ChunkOffset(16 * i + 8 * h + g, 4 * u + t));
        }
      }
#pragma unroll
      for (int j = 0; j < kMT; ++j) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xs + ChunkOffset(8 * j + g, 4 * u + t));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t a_lo[4] = {wv[i][0].x, wv[i][1].x, wv[i][0].y, wv[i][1].y};
          Mma16816(acc[i][j], a_lo, xv.x, xv.y);
          const uint32_t a_hi[4] = {wv[i][0].z, wv[i][1].z, wv[i][0].w, wv[i][1].w};
          Mma16816(acc[i][j], a_hi, xv.z, xv.w);
        }
      }
    }
  };

  // The weights are never written by a step: their first blocks are copied before the
  // dependency wait, overlapping the previous kernel's tail; x only after it. Every block's
  // copies form one cp.async group (the prologue's weights join the first), committed also
  // when empty so every thread counts the same groups.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (b_begin + s < b_end) copy_w(s, b_begin + s);
  }
  cuda_detail::GridDependencyWait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (b_begin + s < b_end) copy_x(s, b_begin + s);
    cuda_detail::CpAsyncCommit();
  }
  for (int b = b_begin; b < b_end; b += kStages) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      if (b + s < b_end) {
        // Block b + s has landed (this thread's copies; the barrier makes the slice's
        // visible) and every warp of the slice is done with block b + s - 1, whose slots
        // the next copies reuse.
        cuda_detail::CpAsyncWait<kStages - 2>();
        group_barrier();
        const int next = b + s + kStages - 1;
        if (next < b_end) {
          copy_w((s + kStages - 1) % kStages, next);
          copy_x((s + kStages - 1) % kStages, next);
        }
        cuda_detail::CpAsyncCommit();
        compute(s);
      }
    }
  }

  if constexpr (kSplit > 1) {
    float* partial = reinterpret_cast<float*>(smem);
    constexpr int kWords = 2 * kMT * 4;
    cuda_detail::CpAsyncWait<0>();
    __syncthreads();  // every warp is done with its rings
    if (slice != 0) {
      for_each_acc([&](float& a, int word) { partial[(warp * kWords + word) * 32 + lane] = a; });
    }
    __syncthreads();
    if (slice != 0) return;
    for (int sl = 1; sl < kSplit; ++sl) {
      const float* from = partial + (warp + sl * kGroup) * kWords * 32;
      for_each_acc([&](float& a, int word) { a += from[word * 32 + lane]; });
    }
  }

  // C fragment: c0, c1 = (row g, tokens 2t, 2t + 1), c2, c3 = (row g + 8, same tokens).
#pragma unroll
  for (int j = 0; j < kMT; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int token = 8 * j + 2 * t + (c & 1);
      const int h = c >> 1;
      if (token >= m) continue;
      if constexpr (kGlu) {
        const int64_t cc = rg * 16 + g + 8 * h;
        if (cc >= n) continue;
        const float bg = bias != nullptr ? __bfloat162float(bias[cc]) : 0.0f;
        const float bu = bias != nullptr ? __bfloat162float(bias[cc + n]) : 0.0f;
        // LinearCuda's rounding of gate and up, then SiluMulCuda's formula.
        const float gv = __bfloat162float(__float2bfloat16_rn(acc[0][j][c] + bg));
        const float uv = __bfloat162float(__float2bfloat16_rn(acc[1][j][c] + bu));
        y[int64_t{token} * n + cc] = __float2bfloat16_rn(gv / (1.0f + expf(-gv)) * uv);
      } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int64_t cc = rg * kRowsPerWarp + 16 * i + g + 8 * h;
          if (cc >= n) continue;
          const float b = bias != nullptr ? __bfloat162float(bias[cc]) : 0.0f;
          y[int64_t{token} * n + cc] = __float2bfloat16_rn(acc[i][j][c] + b);
        }
      }
    }
  }
}

template <int kMT, int kSplit, int kStages, bool kGlu>
void LaunchVariant(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int m, int n, int k,
                   cudaStream_t stream, bool pdl) {
  constexpr size_t kSmem = SmemBytes(kMT, kSplit, kStages);
  if constexpr (kSmem > kMaxSmem) {
    return;  // not served (SkinnyVariantSupported)
  } else {
    constexpr int kGroups = kWarps / kSplit;
    const int64_t cols_per_group = kGlu ? 16 : kRowsPerWarp;
    const int64_t groups = (int64_t{n} + cols_per_group - 1) / cols_per_group;
    const unsigned grid = static_cast<unsigned>((groups + kGroups - 1) / kGroups);
    auto kernel = &SkinnyGemmKernel<kMT, kSplit, kStages, kGlu>;
    if (kSmem > 48 * 1024) {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kSmem));
    }
    (void)cuda_detail::LaunchKernelMaybePdl(kernel, dim3(grid), dim3(kThreads), kSmem, stream,
                                            pdl, x, w, bias, y, m, n, k);
  }
}

// 8-token groups of the kernel LaunchForRows picks for m rows.
int TokenGroupsFor(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

template <int kSplit, int kStages, bool kGlu>
void LaunchForRows(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int m, int n, int k,
                   cudaStream_t stream, bool pdl) {
  static_assert(kSkinnyGemmMaxRows == 64);
  if (m <= 8) {
    LaunchVariant<1, kSplit, kStages, kGlu>(x, w, bias, y, m, n, k, stream, pdl);
  } else if (m <= 16) {
    LaunchVariant<2, kSplit, kStages, kGlu>(x, w, bias, y, m, n, k, stream, pdl);
  } else if (m <= 32) {
    LaunchVariant<4, kSplit, kStages, kGlu>(x, w, bias, y, m, n, k, stream, pdl);
  } else {
    LaunchVariant<8, kSplit, kStages, kGlu>(x, w, bias, y, m, n, k, stream, pdl);
  }
}

template <bool kGlu>
void LaunchForm(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int m, int n, int k,
                int split, int stages, cudaStream_t stream, bool pdl) {
  switch (stages * 10 + split) {
    case 31: LaunchForRows<1, 3, kGlu>(x, w, bias, y, m, n, k, stream, pdl); break;
    case 32: LaunchForRows<2, 3, kGlu>(x, w, bias, y, m, n, k, stream, pdl); break;
    case 34: LaunchForRows<4, 3, kGlu>(x, w, bias, y, m, n, k, stream, pdl); break;
    case 38: LaunchForRows<8, 3, kGlu>(x, w, bias, y, m, n, k, stream, pdl); break;
    case 41: LaunchForRows<1, 4, kGlu>(x, w, bias, y, m, n, k, stream, pdl); break;
    case 42: LaunchForRows<2, 4, kGlu>(x, w, bias, y, m, n, k, stream, pdl); break;
    case 44: LaunchForRows<4, 4, kGlu>(x, w, bias, y, m, n, k, stream, pdl); break;
    default: LaunchForRows<8, 4, kGlu>(x, w, bias, y, m, n, k, stream, pdl); break;
  }
}

}  // namespace

bool SkinnyVariantSupported(int64_t m, int split, int stages) {
  for (const SkinnyVariant& v : kSkinnyVariants) {
    if (v.split == split && v.stages == stages) return SmemBytes(TokenGroupsFor(m), split, stages) <= kMaxSmem;
  }
  return false;
}

bool SkinnySupported(const bf16* x, const bf16* w, int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kSkinnyGemmMaxRows && n >= 1 && n < (int64_t{1} << 30) && k >= 8 &&
         k % 8 == 0 && k <= 0x7fffffff && cuda_detail::Aligned16(x) &&
         cuda_detail::Aligned16(w);
}

void LaunchSkinny(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m, int64_t n,
                  int64_t k, int split, int stages, bool glu, cudaStream_t stream, bool pdl) {
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (glu) {
    LaunchForm<true>(x, w, bias, y, mi, ni, ki, split, stages, stream, pdl);
  } else {
    LaunchForm<false>(x, w, bias, y, mi, ni, ki, split, stages, stream, pdl);
  }
}

}  // namespace skinny_detail

namespace {

absl::Status CheckSkinny(const char* what, const bf16* x, const bf16* w, const bf16* y,
                         int64_t m, int64_t w_rows, int64_t k, int split, int stages) {
  if (y == nullptr || !skinny_detail::SkinnySupported(x, w, m, w_rows, k) ||
      !skinny_detail::SkinnyVariantSupported(m, split, stages)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": needs 1 <= m <= ", kSkinnyGemmMaxRows,
        ", 1 <= n < 2^30, k a positive multiple of 8, 16-byte aligned x and w, an output "
        "buffer, split 1|2|4|8 and stages 3|4 whose shared memory fits (m=", m, " w rows=", w_rows, " k=", k,
        " split=", split, " stages=", stages, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SkinnyGemmCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                            int64_t n, int64_t k, cudaStream_t stream, int split, int stages,
                            bool pdl) {
  absl::Status st = CheckSkinny("SkinnyGemmCuda", x, w, y, m, n, k, split, stages);
  if (!st.ok()) return st;
  skinny_detail::LaunchSkinny(x, w, bias, y, m, n, k, split, stages, false, stream, pdl);
  return CudaLaunchStatus("SkinnyGemmKernel");
}

absl::Status SkinnyGemmSiluMulCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                                   int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                                   int split, int stages, bool pdl) {
  absl::Status st = CheckSkinny("SkinnyGemmSiluMulCuda", x, w, y, m, 2 * n, k, split, stages);
  if (!st.ok()) return st;
  skinny_detail::LaunchSkinny(x, w, bias, y, m, n, k, split, stages, true, stream, pdl);
  return CudaLaunchStatus("SkinnyGemmKernel (SiLU·mul)");
}

}  // namespace sluice::kernels
