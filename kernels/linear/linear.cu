// LinearCuda through cuBLASLt. cuBLASLt is column-major, so the row-major product
// y[m, n] = x[m, k] · w[n, k]ᵀ is issued as the column-major yᵀ[n, m] = op(A) · B with
// A = w seen as a k×n column-major matrix (op = transpose), B = x seen as k×m, C = D = y seen as
// n×m (ld n). The bias epilogue adds bias[n] along D's rows (CUBLASLT_EPILOGUE_BIAS).
//
// Autotune (CublasLt::set_autotune): the first call of a small-m shape, outside stream capture,
// times up to LinearOptions::tune_candidates of cuBLASLt's heuristic algorithms and, for m <= kGemvMaxRows,
// GemvCuda on the caller's own operands (L2 flushed before each timed run), and keeps the
// fastest. Small-m products are weight-streaming (bandwidth-bound): the heuristic's first pick
// there is often a split-K algorithm with a separate reduction pass, which a one-pass GEMV
// avoids.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kernels/activation/activation_cuda.h"
#include "kernels/cuda/cublas_status.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/linear/batch_invariant_linear.h"
#include "kernels/linear/gemm_algo_search.h"
#include "kernels/linear/gemm_tuning_table.h"
#include "kernels/linear/linear_cuda.h"
#include "kernels/linear/skinny_gemm.h"

namespace sluice::kernels {

absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cublasLtGetStatusName(s), ": ", cublasLtGetStatusString(s)));
}

namespace {

using cuda_detail::Aligned16;
using cuda_detail::Bf16x8;
using cuda_detail::ToFloat8;
using cuda_detail::WarpSum;

// Upper bound of LinearOptions::tune_candidates.
constexpr int kMaxTuneCandidates = 64;
constexpr int kGemvThreads = 256;
// The autotuner keeps the best GEMV unless cuBLASLt is faster by more than this factor.
constexpr float kGemvPreference = 1.05f;

// Weights are read exactly once per call: load them through the non-coherent path without
// allocating in L1, which keeps L1 for the x rows every warp re-reads.
__device__ __forceinline__ Bf16x8 LoadStreaming(const Bf16x8* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  Bf16x8 v;
  static_assert(sizeof(v) == sizeof(r));
  memcpy(&v, &r, sizeof(v));
  return v;
}

// x rows are re-read by every warp (L1 hits): one 16-byte load, where dereferencing a Bf16x8
// pointer compiles to four 4-byte loads.
__device__ __forceinline__ Bf16x8 LoadX(const Bf16x8* p) {
  const uint4 r = __ldg(reinterpret_cast<const uint4*>(p));
  Bf16x8 v;
  static_assert(sizeof(v) == sizeof(r));
  memcpy(&v, &r, sizeof(v));
  return v;
}

// kSplit warps per output column n (a CTA of kGemvThreads holds kGemvThreads / 32 / kSplit
// columns): warp s of a column streams the s-th of kSplit equal slices of w[n, :] in 16-byte
// vectors (kUnroll in flight per lane), each multiplied by the same 8 elements of every x row
// (m <= kM), fp32 sums reduced across the warp, then (kSplit > 1) across the column's warps
// through shared memory in slice order; one thread adds the bias and rounds once. The order of
// the sums depends only on (k, kSplit, kUnroll), so a plan's results are deterministic.
// A small w (e.g. 4096 × 4096 at m = 1) leaves each warp only a few rounds of loads, so the
// round-trip latency per round, not the bandwidth, sets the time: a deeper unroll (16: a
// 4096-wide row in one round) trades registers (so resident warps) for fewer rounds; a split
// (4: a quarter row per warp) keeps registers low and cuts each warp's rounds the same way,
// with smaller units of work that fill the last wave of CTAs more evenly. The autotuner picks
// (kUnroll, kSplit) per shape.
//
// kGlu (GemvSiluMulCuda): w is a fused [gate; up] matrix of 2n rows and y gets n columns
// y[r, j] = bf16(silu(g) · u), g and u being the bf16-rounded outputs j and n + j: the CTA's
// first half of columns computes gate rows, the second half the matching up rows, and the
// epilogue pairs them through shared memory (SiluMulCuda's formula on LinearCuda's outputs).
// The part of w one warp of GemvColumns streams for column group `cta`: output column col,
// row `row` of w, 16-byte vectors [begin, end) of it (end = 0 when col >= n).
struct GemvWarpSlice {
  int col;
  int64_t row;
  int slice;
  int begin, end;
  bool active;
};

template <int kSplit, bool kGlu>
__device__ __forceinline__ GemvWarpSlice GemvSliceOf(int cta, int n, int k) {
  static_assert(kSplit >= 1 && (kGemvThreads / 32) % kSplit == 0);
  constexpr int kColsPerCta = kGemvThreads / 32 / kSplit;
  static_assert(!kGlu || kColsPerCta % 2 == 0);
  constexpr int kPairs = kColsPerCta / 2;
  const int warp = threadIdx.x >> 5;
  const int vcol = warp / kSplit;  // the CTA's column this warp works on
  GemvWarpSlice s;
  s.col = cta * (kGlu ? kPairs : kColsPerCta) + (kGlu ? vcol % (kPairs > 0 ? kPairs : 1) : vcol);
  s.row = kGlu && vcol >= kPairs ? int64_t{s.col} + n : s.col;
  s.slice = warp % kSplit;
  s.active = s.col < n;
  const int vecs = k / 8;
  // Slice bounds in vectors; a multiple of 32 per slice keeps every lane's loads aligned to
  // the warp's 512-byte rounds.
  const int per_slice = kSplit == 1 ? vecs : ((vecs + kSplit - 1) / kSplit + 31) / 32 * 32;
  s.begin = s.slice * per_slice;
  s.end = s.active ? min(vecs, s.begin + per_slice) : 0;
  return s;
}

// GemvColumns: the work of one CTA-sized group of output columns (`cta`) of GemvKernel below.
// first / preloaded: when `preloaded`, first[] holds the warp's first round of weight vectors
// (GemvPreload, loaded before the kernel's dependency wait), which the loop then skips loading;
// the sums run in the same order either way.
template <int kM, int kUnroll, int kSplit, bool kGlu>
__device__ __forceinline__ void GemvColumns(int cta, const bf16* __restrict__ x,
                                            const bf16* __restrict__ w,
                                            const bf16* __restrict__ bias, bf16* __restrict__ y,
                                            int m, int n, int k,
                                            const Bf16x8 (&first)[kUnroll] = {},
                                            bool preloaded = false) {
  constexpr int kColsPerCta = kGemvThreads / 32 / kSplit;
  constexpr int kPairs = kColsPerCta / 2;
  constexpr bool kShared = kSplit > 1 || kGlu;  // partial sums meet in shared memory
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const GemvWarpSlice ws = GemvSliceOf<kSplit, kGlu>(cta, n, k);
  const int col = ws.col, slice = ws.slice, begin = ws.begin, end = ws.end;
  const int64_t row = ws.row;
  const bool active = ws.active;
  // No early return with kShared: every thread must reach the barrier below.
  if (!kShared && !active) return;
  const Bf16x8* wr = reinterpret_cast<const Bf16x8*>(w + (active ? row : 0) * k);
  float acc[kM];
#pragma unroll
  for (int r = 0; r < kM; ++r) acc[r] = 0.0f;
  auto fma_vec = [&](const Bf16x8& wv, int vi) {
    float wf[8];
    ToFloat8(wv, wf);
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      if (r < m) {
        float xf[8];
        const Bf16x8* xr = reinterpret_cast<const Bf16x8*>(x + int64_t{r} * k) + vi;
        ToFloat8(LoadX(xr), xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] = fmaf(wf[j], xf[j], acc[r]);
      }
    }
  };
  // Every round issues its kUnroll loads predicated on the slice end: a separate remainder
  // loop would take one more round trip per leftover vector (k = 14336 at unroll 16: 8).
  int i0 = begin + lane;
  if (preloaded) {  // the first round's loads were issued before the dependency wait
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i0 + 32 * u < end) fma_vec(first[u], i0 + 32 * u);
    }
    i0 += 32 * kUnroll;
  }
  for (int i = i0; i < end; i += 32 * kUnroll) {
    Bf16x8 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + 32 * u < end) wv[u] = LoadStreaming(wr + i + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + 32 * u < end) fma_vec(wv[u], i + 32 * u);
    }
  }
#pragma unroll
  for (int r = 0; r < kM; ++r) acc[r] = WarpSum(acc[r]);
  if constexpr (kGlu) {
    __shared__ float partial[kGemvThreads / 32][kM];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kM; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();
    // Thread p < kPairs finishes output column p of the CTA: gate from virtual column p, up
    // from kPairs + p, each summed over its slices in order, biased and rounded as LinearCuda
    // rounds, then SiluMulCuda's g / (1 + e^-g) · u rounded once.
    const int p = threadIdx.x;
    const int out_col = cta * kPairs + p;
    if (p >= kPairs || out_col >= n) return;
    const float bg = bias != nullptr ? __bfloat162float(bias[out_col]) : 0.0f;
    const float bu = bias != nullptr ? __bfloat162float(bias[int64_t{out_col} + n]) : 0.0f;
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      if (r < m) {
        float g = partial[p * kSplit][r], u = partial[(kPairs + p) * kSplit][r];
#pragma unroll
        for (int s = 1; s < kSplit; ++s) {
          g += partial[p * kSplit + s][r];
          u += partial[(kPairs + p) * kSplit + s][r];
        }
        g = __bfloat162float(__float2bfloat16_rn(g + bg));
        u = __bfloat162float(__float2bfloat16_rn(u + bu));
        y[int64_t{r} * n + out_col] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
      }
    }
    return;
  }
  if constexpr (kSplit > 1) {
    __shared__ float partial[kGemvThreads / 32][kM];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kM; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      acc[r] = partial[warp][r];
#pragma unroll
      for (int s = 1; s < kSplit; ++s) acc[r] += partial[warp + s][r];
    }
  }
  if (lane == 0 && active) {
    const float b = bias != nullptr ? __bfloat162float(bias[col]) : 0.0f;
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      if (r < m) y[int64_t{r} * n + col] = __float2bfloat16_rn(acc[r] + b);
    }
  }
}

// GemvPreload: the weight reads a GEMV warp may issue before its dependency wait in a
// programmatic-dependent chain (pdl.cuh; the weights are never written by a step), so the HBM
// stream of this kernel starts during the previous kernel's tail: with `preload`, the warp's
// first round of kUnroll vectors per lane goes into first[] (and *preloaded is set). (Asking L2
// for the rest of the warp's slice as well overflowed L2 with every resident CTA's slice.)
template <int kUnroll, int kSplit, bool kGlu>
__device__ __forceinline__ void GemvPreload(int cta, const bf16* __restrict__ w, int n, int k,
                                            bool preload, Bf16x8 (&first)[kUnroll],
                                            bool* preloaded) {
  *preloaded = false;
  if (!preload) return;
  const GemvWarpSlice ws = GemvSliceOf<kSplit, kGlu>(cta, n, k);
  if (!ws.active) return;
  const int lane = threadIdx.x & 31;
  const Bf16x8* wr = reinterpret_cast<const Bf16x8*>(w + ws.row * k);
  const int i = ws.begin + lane;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (i + 32 * u < ws.end) first[u] = LoadStreaming(wr + i + 32 * u);
  }
  *preloaded = true;
}

// preload: launched as a programmatic dependent (`pdl`). The trigger comes first (the next kernel of the chain may launch
// once every CTA of this grid has started), the weight reads next, and the wait before x is
// read or y written (an earlier kernel may still read y's buffer).
template <int kM, int kUnroll, int kSplit, bool kGlu>
__global__ void __launch_bounds__(kGemvThreads)
    GemvKernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
               const bf16* __restrict__ bias, bf16* __restrict__ y, int m, int n, int k,
               bool preload) {
  cuda_detail::LaunchDependents();
  const int cta = static_cast<int>(blockIdx.x);
  Bf16x8 first[kUnroll];
  bool preloaded = false;
  GemvPreload<kUnroll, kSplit, kGlu>(cta, w, n, k, preload, first, &preloaded);
  cuda_detail::GridDependencyWait();
  GemvColumns<kM, kUnroll, kSplit, kGlu>(cta, x, w, bias, y, m, n, k, first, preloaded);
}

// Reads `bytes` (a multiple of 16) of `buf` so L2 holds clean lines of it and nothing of the
// operands a tuning run is about to read — as in a decode step, where the layers in between
// evicted the weights with reads. (A memset flush instead leaves L2 full of dirty lines whose
// write-back competes with the timed kernel's reads and changed which GEMV shape won.)
__global__ void FlushL2ReadKernel(const uint4* __restrict__ buf, int64_t n, int* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcg(buf + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = 1;  // keeps the loads; the buffer is zeros, so never taken
}

void FlushL2ByReading(const uint8_t* buf, size_t bytes, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(bytes / 16);
  // The sink is never written (see the kernel); a pointer into the buffer keeps it valid.
  FlushL2ReadKernel<<<1024, 256, 0, stream>>>(reinterpret_cast<const uint4*>(buf), n,
                                             reinterpret_cast<int*>(const_cast<uint8_t*>(buf)));
}

bool GemvSupported(const bf16* x, const bf16* w, int64_t m, int64_t n, int64_t k) {
  return m >= 1 && m <= kGemvMaxRows && k % 8 == 0 && n <= 0x7fffffff / 32 &&
         k <= 0x7fffffff && Aligned16(x) && Aligned16(w);
}

// n: output columns (kGlu: w has 2n rows).
template <int kUnroll, int kSplit, bool kGlu>
void LaunchGemvVariant(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                       int64_t n, int64_t k, cudaStream_t stream, bool pdl) {
  if constexpr (kGlu && kGemvThreads / 32 / kSplit < 2) {
    return;  // not served (GemvGluVariantSupported)
  } else {
    constexpr int64_t kCols = kGemvThreads / 32 / kSplit / (kGlu ? 2 : 1);
    const unsigned grid = static_cast<unsigned>((n + kCols - 1) / kCols);
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    auto kernel = m == 1   ? &GemvKernel<1, kUnroll, kSplit, kGlu>
                  : m == 2 ? &GemvKernel<2, kUnroll, kSplit, kGlu>
                  : m <= 4 ? &GemvKernel<4, kUnroll, kSplit, kGlu>
                           : &GemvKernel<8, kUnroll, kSplit, kGlu>;
    // Errors surface through CudaLaunchStatus (cudaGetLastError) at the callers.
    (void)cuda_detail::LaunchKernelMaybePdl(kernel, dim3(grid), dim3(kGemvThreads), 0, stream,
                                            pdl, x, w, bias, y, mi, ni, ki, pdl);
  }
}

// The (unroll, split) pairs GemvCuda serves, in the order the autotuner times them.
struct GemvVariant {
  int unroll, split;
};
constexpr GemvVariant kGemvVariants[] = {{4, 1}, {8, 1}, {16, 1}, {4, 2},
                                         {8, 2}, {4, 4}, {8, 4},  {4, 8}};

bool GemvVariantSupported(int unroll, int split) {
  for (const GemvVariant& v : kGemvVariants) {
    if (v.unroll == unroll && v.split == split) return true;
  }
  return false;
}

// The fused SiLU·mul form needs two columns per CTA: split <= 4.
bool GemvGluVariantSupported(int unroll, int split) {
  return GemvVariantSupported(unroll, split) && split <= 4;
}

// Calls f(Int<kUnroll>, Int<kSplit>) for the served (unroll, split) pair ((4, 1) for any other).
template <int kValue>
using Int = std::integral_constant<int, kValue>;

template <typename F>
void DispatchGemvVariant(int unroll, int split, F&& f) {
  switch (split * 100 + unroll) {
    case 116: f(Int<16>{}, Int<1>{}); break;
    case 108: f(Int<8>{}, Int<1>{}); break;
    case 204: f(Int<4>{}, Int<2>{}); break;
    case 208: f(Int<8>{}, Int<2>{}); break;
    case 404: f(Int<4>{}, Int<4>{}); break;
    case 408: f(Int<8>{}, Int<4>{}); break;
    case 804: f(Int<4>{}, Int<8>{}); break;
    default: f(Int<4>{}, Int<1>{}); break;
  }
}

template <bool kGlu>
void LaunchGemvForm(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                    int64_t n, int64_t k, int unroll, int split, cudaStream_t stream, bool pdl) {
  DispatchGemvVariant(unroll, split, [&](auto u, auto s) {
    LaunchGemvVariant<decltype(u)::value, decltype(s)::value, kGlu>(x, w, bias, y, m, n, k,
                                                                     stream, pdl);
  });
}

// Launch without validating (callers checked GemvSupported and Gemv[Glu]VariantSupported).
void LaunchGemv(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m, int64_t n,
                int64_t k, int unroll, int split, cudaStream_t stream, bool pdl) {
  LaunchGemvForm<false>(x, w, bias, y, m, n, k, unroll, split, stream, pdl);
}
// n: the SiLU·mul outputs per row (w: [2n, k]).
void LaunchGemvGlu(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m, int64_t n,
                   int64_t k, int unroll, int split, cudaStream_t stream, bool pdl) {
  LaunchGemvForm<true>(x, w, bias, y, m, n, k, unroll, split, stream, pdl);
}

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic must know how
// aligned the operands are.
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}

// One cached matmul configuration.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  // Heuristic results in its order (algo = candidates[0] until tuned).
  std::vector<cublasLtMatmulAlgo_t> candidates;
  bool tuned = false;
  bool gemv = false;      // the tuned choice is GemvCuda
  int gemv_unroll = 4;    // its unroll depth
  int gemv_split = 1;     // and warps per output column
  float best_us = 0.0f;   // tuned: the winner's time
  float first_us = 0.0f;  // tuned: the heuristic's first pick's time
  float gemv_us = 0.0f;   // tuned: GemvCuda's best time over the depths (0 when not eligible)
  bool skinny = false;    // the tuned choice is SkinnyGemmCuda
  int skinny_split = 1;   // its (split, stages)
  int skinny_stages = 3;
  float skinny_us = 0.0f;  // tuned: its best time over the variants (0 when not eligible)
  // tuned: a two-part N split that beat every single call (LinearOptions::algo_search); runs instead.
  std::unique_ptr<gemm_search::SplitGemm> split;
  bool table_checked = false;  // the process's GEMM tuning table was consulted
  bool from_table = false;     // tuned = a saved choice (LoadGemmTuning), not timed here
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// (m, n, k, has_bias, align_x, align_w, align_y, align_bias)
using PlanKey = std::tuple<int64_t, int64_t, int64_t, bool, uint32_t, uint32_t, uint32_t, uint32_t>;

// ---- The process's GEMM tuning table (LoadGemmTuning / SaveGemmTuning) ----

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(CublasLtAlgoWords));

CublasLtAlgoWords WordsOf(const cublasLtMatmulAlgo_t& algo) {
  CublasLtAlgoWords w;
  std::memcpy(w.data(), &algo, sizeof(w));
  return w;
}

cublasLtMatmulAlgo_t AlgoOf(const CublasLtAlgoWords& w) {
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, w.data(), sizeof(w));
  return algo;
}

// The current device's identity (cudaGetDeviceProperties once per device).
absl::StatusOr<GemmTuningDevice> CurrentTuningDevice() {
  static std::mutex mu;
  static absl::flat_hash_map<int, GemmTuningDevice> known;
  int device = 0;
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device);
  if (it != known.end()) return it->second;
  cudaDeviceProp prop{};
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  GemmTuningDevice d{prop.name, 10 * prop.major + prop.minor, prop.multiProcessorCount,
                     static_cast<int>(cublasLtGetVersion())};
  known.emplace(device, d);
  return d;
}

// Loaded and newly tuned choices; the table's device is the one they apply to (the first
// device that loaded or tuned: a process tunes one GPU model).
struct TuningRegistry {
  std::mutex mu;
  std::optional<GemmTuningTable> table;
};

TuningRegistry& Registry() {
  static TuningRegistry* r = new TuningRegistry();
  return *r;
}

// Whether the autotuner times SkinnyGemmCuda for this plan (LinearOptions::skinny_tuning).
bool SkinnyCandidate(const LinearOptions& o, const bf16* x, const bf16* w, int64_t m, int64_t n,
                     int64_t k) {
  return o.skinny_tuning && m >= kSkinnyTuneMinRows && m <= kSkinnyTuneMaxRows &&
         skinny_detail::SkinnySupported(x, w, m, n, k);
}

// The search bits a plan is tuned (and its table entry looked up) with: the options'
// algo_search mask, plus kGemmTunedSkinny where SkinnyGemmCuda is a candidate.
int TuningMask(const LinearOptions& o, const bf16* x, const bf16* w, int64_t m, int64_t n,
               int64_t k) {
  return o.algo_search | (SkinnyCandidate(o, x, w, m, n, k) ? kGemmTunedSkinny : 0);
}

GemmTuningKey TuningKeyOf(const PlanKey& key, bool glu) {
  GemmTuningKey k;
  std::tie(k.m, k.n, k.k, k.bias, k.align_x, k.align_w, k.align_y, k.align_bias) = key;
  k.glu = glu;
  return k;
}

// `path` as a table file: a directory names its GemmTuningFileName(device) entry.
std::filesystem::path TuningFile(const std::string& path, const GemmTuningDevice& device) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return std::filesystem::path(path) / GemmTuningFileName(device.name);
  }
  return std::filesystem::path(path);
}

}  // namespace

absl::StatusOr<int> LoadGemmTuning(const std::string& path) {
  auto device = CurrentTuningDevice();
  if (!device.ok()) return device.status();
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(path, ec);
  const std::filesystem::path file = TuningFile(path, *device);
  if (!std::filesystem::exists(file, ec)) {
    if (is_dir) return 0;  // no table for this GPU model
    return absl::NotFoundError(absl::StrCat("LoadGemmTuning: no file ", path));
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InternalError(absl::StrCat("LoadGemmTuning: cannot read ", file.string()));
  }
  absl::StatusOr<GemmTuningTable> table = GemmTuningTable::Parse(text.str());
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.string(), ": ", table.status().message()));
  }
  if (!table->Applies(*device)) return 0;
  const bool cublaslt = table->CublasLtApplies(*device);
  TuningRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.table.has_value()) r.table.emplace(*device);
  if (!r.table->Applies(*device)) return 0;  // the process already tunes another GPU model
  int taken = 0;
  for (const auto& [key, choice] : table->entries()) {
    if (!cublaslt && choice.kind != GemmTuningChoice::Kind::kGemv) continue;
    r.table->Insert(key, choice);
    ++taken;
  }
  return taken;
}

absl::StatusOr<std::string> SaveGemmTuning(const std::string& path) {
  auto device = CurrentTuningDevice();
  if (!device.ok()) return device.status();
  std::string text;
  {
    TuningRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    text = r.table.has_value() ? r.table->Serialize() : GemmTuningTable(*device).Serialize();
  }
  const std::filesystem::path file = TuningFile(path, *device);
  const std::filesystem::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.good()) {
      return absl::InternalError(absl::StrCat("SaveGemmTuning: cannot write ", tmp.string()));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);  // whole file or none for a concurrent reader
  if (ec) {
    return absl::InternalError(
        absl::StrCat("SaveGemmTuning: cannot rename to ", file.string(), ": ", ec.message()));
  }
  return file.string();
}

struct CublasLt::Impl {
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer<uint8_t> workspace;
  DeviceBuffer<uint8_t> flush;  // Tune's L2 flush buffer (allocated on first use)
  std::mutex mu;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans;
  double setup_seconds = 0.0;  // host time of the calls that created a plan
  int64_t autotune_max_m = 0;  // plans with m <= this are tuned
  LinearOptions options;
  std::unique_ptr<gemm_search::SplitResources> split_res;  // two-stream splits' side stream

  ~Impl() {
    plans.clear();
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  absl::StatusOr<Plan*> GetPlan(const PlanKey& key) {
    auto it = plans.find(key);
    if (it != plans.end()) return it->second.get();
    const auto [m, n, k, has_bias, align_x, align_w, align_y, align_bias] = key;
    auto plan = std::make_unique<Plan>();
    SLUICE_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate");
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    SLUICE_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                       sizeof(trans_a)),
        "set TRANSA");
    SLUICE_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                       sizeof(trans_b)),
        "set TRANSB");
    if (has_bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      SLUICE_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                         sizeof(epilogue)),
          "set EPILOGUE");
      const cudaDataType_t bias_type = CUDA_R_16BF;
      SLUICE_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                         sizeof(bias_type)),
          "set BIAS_DATA_TYPE");
    }
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, n, k),
                                  "layout A");
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, m, k),
                                  "layout B");
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_16BF, n, m, n),
                                  "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref),
                                  "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = workspace.bytes();
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_x},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_y},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_y}};
    for (const auto& [attr, value] : aligns) {
      if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
      }
    }
    (void)align_bias;  // Part of the key only: the bias epilogue reads it element-wise.
    cublasLtMatmulHeuristicResult_t results[kMaxTuneCandidates];
    int count = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulAlgoGetHeuristic(handle, plan->op, plan->a, plan->b, plan->c, plan->c, pref,
                                         m <= autotune_max_m ? options.tune_candidates : 1, results,
                                         &count);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    SLUICE_CUBLAS_RETURN_IF_ERROR(s, "cublasLtMatmulAlgoGetHeuristic");
    if (count < 1) {
      return absl::InternalError(
          absl::StrCat("cuBLASLt has no bf16 algorithm for m=", m, " n=", n, " k=", k));
    }
    plan->algo = results[0].algo;
    for (int i = 0; i < count; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->candidates.push_back(results[i].algo);
    }
    if (m <= autotune_max_m && m >= kGemmSearchMinRows &&
        (options.algo_search & kGemmSearchAlgos) != 0) {  // timed after the heuristic's by Tune
      absl::Status st = gemm_search::EnumerateAlgos(handle, plan->op, plan->a, plan->b, plan->c,
                                                    workspace.bytes(),
                                                    gemm_search::kMaxEnumerated, &plan->candidates);
      if (!st.ok()) return st;
    }
    Plan* raw = plan.get();
    plans.emplace(key, std::move(plan));
    return raw;
  }

  cublasStatus_t RunAlgo(Plan& p, const cublasLtMatmulAlgo_t& algo, const bf16* x, const bf16* w,
                         bf16* y, cudaStream_t stream) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(handle, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &algo,
                          workspace.data(), workspace.bytes(), stream);
  }

  // ApplySaved takes the process table's choice for `tk` (tuned with at least the current
  // search bits) when it still fits this plan: a cuBLASLt algorithm must pass
  // cublasLtMatmulAlgoCheck, a GEMV must be a served variant for these operands, a split's
  // parts likewise. Returns whether p is now tuned. No timing, no sync: safe during capture.
  bool ApplySaved(Plan& p, const GemmTuningKey& tk, const bf16* x, const bf16* w) {
    GemmTuningChoice c;
    {
      TuningRegistry& r = Registry();
      std::lock_guard<std::mutex> lock(r.mu);
      if (!r.table.has_value()) return false;
      auto device = CurrentTuningDevice();
      if (!device.ok() || !r.table->Applies(*device)) return false;
      const GemmTuningChoice* found =
          r.table->Find(tk, TuningMask(options, x, w, tk.m, tk.n, tk.k));
      if (found == nullptr) return false;
      c = *found;
    }
    switch (c.kind) {
      case GemmTuningChoice::Kind::kCublasLt: {
        const cublasLtMatmulAlgo_t algo = AlgoOf(c.algo);
        if (!gemm_search::CheckAlgo(handle, p.op, p.a, p.b, p.c, algo, workspace.bytes())) {
          return false;
        }
        p.algo = algo;
        break;
      }
      case GemmTuningChoice::Kind::kGemv:
        if (!GemvSupported(x, w, tk.m, tk.n, tk.k) ||
            !GemvVariantSupported(c.gemv_unroll, c.gemv_split) ||
            (tk.glu && !GemvGluVariantSupported(c.gemv_unroll, c.gemv_split))) {
          return false;
        }
        p.gemv = true;
        p.gemv_unroll = c.gemv_unroll;
        p.gemv_split = c.gemv_split;
        p.gemv_us = c.us;
        break;
      case GemmTuningChoice::Kind::kSkinny:
        if (!SkinnyCandidate(options, x, w, tk.m, tk.n, tk.k) ||
            !skinny_detail::SkinnyVariantSupported(tk.m, c.skinny_split, c.skinny_stages)) {
          return false;
        }
        p.skinny = true;
        p.skinny_split = c.skinny_split;
        p.skinny_stages = c.skinny_stages;
        p.skinny_us = c.us;
        break;
      case GemmTuningChoice::Kind::kSplit: {
        auto split = gemm_search::SplitGemm::Make(tk.m, tk.n, tk.k, c.split_n1, tk.bias);
        if (!split.ok()) return false;
        if (c.split_two_streams &&
            gemm_search::EnsureSplitResources(&split_res, workspace.bytes()) == nullptr) {
          return false;
        }
        if (!(*split)
                 ->Restore(handle, AlgoOf(c.split_algos[0]), AlgoOf(c.split_algos[1]),
                           c.split_two_streams, workspace.bytes())
                 .ok()) {
          return false;
        }
        p.split = *std::move(split);
        break;
      }
    }
    p.best_us = c.us;
    p.tuned = true;
    p.from_table = true;
    return true;
  }

  // RecordTuned adds p's timed choice to the process table (SaveGemmTuning writes it).
  void RecordTuned(const Plan& p, const GemmTuningKey& tk, int search_mask) {
    auto device = CurrentTuningDevice();
    if (!device.ok()) return;
    GemmTuningChoice c;
    c.us = p.best_us;
    c.search_mask = search_mask;
    if (p.skinny) {
      c.kind = GemmTuningChoice::Kind::kSkinny;
      c.skinny_split = p.skinny_split;
      c.skinny_stages = p.skinny_stages;
      c.describe = absl::StrCat("skinny split ", p.skinny_split, " stages ", p.skinny_stages);
    } else if (p.gemv) {
      c.kind = GemmTuningChoice::Kind::kGemv;
      c.gemv_unroll = p.gemv_unroll;
      c.gemv_split = p.gemv_split;
      c.describe = absl::StrCat("gemv unroll ", p.gemv_unroll, " split ", p.gemv_split);
    } else if (p.split != nullptr) {
      c.kind = GemmTuningChoice::Kind::kSplit;
      c.split_n1 = p.split->n1();
      c.split_two_streams = p.split->two_streams();
      c.split_algos = {WordsOf(p.split->part_algo(0)), WordsOf(p.split->part_algo(1))};
      c.describe = p.split->Describe();
    } else {
      c.kind = GemmTuningChoice::Kind::kCublasLt;
      c.algo = WordsOf(p.algo);
      c.describe = gemm_search::DescribeAlgo(p.algo);
    }
    TuningRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.table.has_value()) r.table.emplace(*device);
    if (r.table->Applies(*device)) r.table->Insert(tk, std::move(c));
  }

  // Tune times each candidate (and GemvCuda when eligible) on the caller's operands: 2 warm-up
  // runs, then the mean of 5 between CUDA events. y is overwritten (the real call follows).
  // A candidate that fails to run is skipped. Synchronizes `stream`.
  // glu_out (LinearSiluMulCuda): what runs is timed — a cuBLASLt candidate with SiluMulCuda
  // after it, a GEMV in its fused SiLU·mul form (only the forms served) — since the epilogue
  // changes which GEMV shape is fastest (H200, n = 28672: unroll 4 split 4 fused is ~3 us
  // faster than the unroll 8 split 4 that wins the plain product).
  absl::Status Tune(Plan& p, const PlanKey& key, const bf16* x, const bf16* w, const bf16* bias,
                    bf16* y, bf16* glu_out, cudaStream_t stream) {
    const int64_t m = std::get<0>(key), n = std::get<1>(key), k = std::get<2>(key);
    cudaEvent_t ev[2];
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&ev[0]), "cudaEventCreate");
    if (cudaEventCreate(&ev[1]) != cudaSuccess) {
      cudaEventDestroy(ev[0]);
      return absl::InternalError("cudaEventCreate");
    }
    constexpr int kWarm = 2, kReps = 5;
    // In a decode step each GEMM streams weights that are not in L2 (the layers in between
    // evicted them), so every timed run starts from a flushed L2: a read of twice its size,
    // outside the timed span.
    if (flush.size() == 0) {
      int device = 0, l2 = 0;
      cudaGetDevice(&device);
      cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
      auto buf = DeviceBuffer<uint8_t>::Create(std::max<size_t>(2 * static_cast<size_t>(l2), 1));
      if (buf.ok() && cudaMemsetAsync(buf->data(), 0, buf->bytes(), stream) == cudaSuccess) {
        flush = std::move(*buf);
      }
    }
    // Returns the mean microseconds of `run`, or a negative value when it failed.
    auto time = [&](auto&& run) -> float {
      for (int i = 0; i < kWarm; ++i) {
        if (!run()) return -1.0f;
      }
      float total = 0.0f;
      for (int i = 0; i < kReps; ++i) {
        if (flush.size() > 0) FlushL2ByReading(flush.data(), flush.bytes(), stream);
        cudaEventRecord(ev[0], stream);
        run();
        cudaEventRecord(ev[1], stream);
        float ms = 0.0f;
        if (cudaEventSynchronize(ev[1]) != cudaSuccess ||
            cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess) {
          return -1.0f;
        }
        total += ms;
      }
      return total * 1e3f / kReps;
    };
    float best = -1.0f;
    for (size_t i = 0; i < p.candidates.size(); ++i) {
      const cublasLtMatmulAlgo_t& algo = p.candidates[i];
      const float us = time([&] {
        if (RunAlgo(p, algo, x, w, y, stream) != CUBLAS_STATUS_SUCCESS) return false;
        return glu_out == nullptr || SiluMulCuda(y, glu_out, m, n / 2, stream).ok();
      });
      if (i == 0) p.first_us = us;
      if (us >= 0.0f && (best < 0.0f || us < best)) {
        best = us;
        p.algo = algo;
      }
    }
    // Two-part N splits (LinearOptions::algo_search; m >= kGemmSearchMinRows only, so never a
    // GEMV).
    p.split = gemm_search::TuneBestSplit(
        handle, m, n, k, x, w, bias, y, workspace.data(), workspace.bytes(), &split_res, stream,
        options.algo_search, options.tune_candidates,
        [&](const std::function<bool()>& run) { return time(run); },
        glu_out == nullptr ? std::function<bool()>()
                           : [&] { return SiluMulCuda(y, glu_out, m, n / 2, stream).ok(); },
        &best);
    if (GemvSupported(x, w, m, n, k)) {
      for (const GemvVariant& v : kGemvVariants) {
        if (glu_out != nullptr && !GemvGluVariantSupported(v.unroll, v.split)) continue;
        const float us = time([&] {
          if (glu_out != nullptr) {
            LaunchGemvGlu(x, w, bias, glu_out, m, n / 2, k, v.unroll, v.split, stream,
                          options.pdl);
          } else {
            LaunchGemv(x, w, bias, y, m, n, k, v.unroll, v.split, stream, options.pdl);
          }
          return cudaPeekAtLastError() == cudaSuccess;
        });
        if (us >= 0.0f && (p.gemv_us <= 0.0f || us < p.gemv_us)) {
          p.gemv_us = us;
          p.gemv_unroll = v.unroll;
          p.gemv_split = v.split;
        }
      }
      // cuBLASLt must win by kGemvPreference: its small-m algorithms are often split-K with a
      // reduction launch, a boundary that costs more inside a decode graph than in this
      // isolated timing (H200, Llama-3-8B down_proj at m = 1: a cuBLASLt pick 0.3 us "faster"
      // here ran 3.4 us slower per layer in the graph).
      if (p.gemv_us > 0.0f && (best < 0.0f || p.gemv_us <= best * kGemvPreference)) {
        best = p.gemv_us;
        p.gemv = true;
      }
    }
    // SkinnyGemmCuda (kSkinnyTuneMinRows..kSkinnyTuneMaxRows rows), in its SiLU·mul form for
    // glu_out. One launch like the GEMV, so it is compared with the best so far as timed.
    if (SkinnyCandidate(options, x, w, m, n, k)) {
      for (const skinny_detail::SkinnyVariant& v : skinny_detail::kSkinnyVariants) {
        if (!skinny_detail::SkinnyVariantSupported(m, v.split, v.stages)) continue;
        const float us = time([&] {
          skinny_detail::LaunchSkinny(x, w, bias, glu_out != nullptr ? glu_out : y, m,
                                      glu_out != nullptr ? n / 2 : n, k, v.split, v.stages,
                                      glu_out != nullptr, stream, options.pdl);
          return cudaPeekAtLastError() == cudaSuccess;
        });
        if (us >= 0.0f && (p.skinny_us <= 0.0f || us < p.skinny_us)) {
          p.skinny_us = us;
          p.skinny_split = v.split;
          p.skinny_stages = v.stages;
        }
      }
      if (p.skinny_us > 0.0f && (best < 0.0f || p.skinny_us < best)) {
        best = p.skinny_us;
        p.skinny = true;
        p.gemv = false;
      }
    }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    // A failed timing run leaves a sticky launch error only for real faults; clear the
    // non-sticky one a rejected candidate may have set.
    (void)cudaGetLastError();
    p.best_us = best;
    p.tuned = true;
    return absl::OkStatus();
  }
};

CublasLt::CublasLt(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CublasLt::~CublasLt() = default;

absl::StatusOr<std::unique_ptr<CublasLt>> CublasLt::Create(size_t workspace_bytes,
                                                          const LinearOptions& options) {
  if (options.tune_candidates < 1 || options.tune_candidates > kMaxTuneCandidates ||
      options.algo_search < 0 ||
      options.algo_search > (kGemmSearchAlgos | kGemmSearchSplitN | kGemmSearchStreams) ||
      options.batch_invariant_target_ctas < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CublasLt: LinearOptions tune_candidates must be in 1..", kMaxTuneCandidates, " (got ",
        options.tune_candidates, "), algo_search a mask of 1, 2, 4 (got ", options.algo_search,
        "), batch_invariant_target_ctas >= 1 (got ", options.batch_invariant_target_ctas, ")"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&impl->handle), "cublasLtCreate");
  auto ws = DeviceBuffer<uint8_t>::Create(workspace_bytes);
  if (!ws.ok()) return ws.status();
  impl->workspace = *std::move(ws);
  return std::unique_ptr<CublasLt>(new CublasLt(std::move(impl)));
}

namespace {

// LinearCuda's body. With `glu_out` (LinearSiluMulCuda: n = 2 · inter), a plan whose tuned
// choice is a GEMV variant that the fused form serves writes SiLU·mul straight to glu_out and
// sets *fused (y is then left alone); otherwise y gets the product and *fused is false.
absl::Status RunLinear(CublasLt::Impl& impl, const bf16* x, const bf16* w, const bf16* bias,
                       bf16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                       bf16* glu_out, bool* fused) {
  constexpr int64_t kMaxLd = 0x7fffffff;
  if (m < 1 || n < 1 || k < 1 || m > kMaxLd || n > kMaxLd || k > kMaxLd) {
    return absl::InvalidArgumentError(
        absl::StrCat("LinearCuda: bad shape m=", m, " n=", n, " k=", k));
  }
  if (fused != nullptr) *fused = false;
  if (impl.options.batch_invariant) {  // no plan, heuristic or tuning: an order fixed by (n, k)
    if (glu_out != nullptr) *fused = true;
    const int64_t ctas = impl.options.batch_invariant_target_ctas;
    return glu_out != nullptr
               ? BatchInvariantLinearCuda(x, w, bias, glu_out, m, n / 2, k, true, stream, ctas)
               : BatchInvariantLinearCuda(x, w, bias, y, m, n, k, false, stream, ctas);
  }
  std::lock_guard<std::mutex> lock(impl.mu);
  const auto started = std::chrono::steady_clock::now();
  const PlanKey key{m,
                    n,
                    k,
                    bias != nullptr,
                    Alignment(x),
                    Alignment(w),
                    Alignment(y),
                    bias != nullptr ? Alignment(bias) : 256u};
  // A call that creates the plan counts its whole host time as set-up (SetupTimer below).
  struct SetupTimer {
    CublasLt::Impl& impl;
    bool on;
    std::chrono::steady_clock::time_point started;
    ~SetupTimer() {
      if (on) {
        impl.setup_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      }
    }
  } setup_timer{impl, impl.plans.find(key) == impl.plans.end(), started};
  auto plan = impl.GetPlan(key);
  if (!plan.ok()) return plan.status();
  Plan& p = **plan;
  // Only untuned plans within the autotune limit look at the tuning table (once) or time:
  // the plans every later call finds skip all of this.
  if (m <= impl.autotune_max_m && !p.tuned) {
    const GemmTuningKey tuning_key = TuningKeyOf(key, glu_out != nullptr);
    if (!p.table_checked) {
      p.table_checked = true;
      impl.ApplySaved(p, tuning_key, x, w);
    }
  }
  if (m <= impl.autotune_max_m && !p.tuned) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    if (capture == cudaStreamCaptureStatusNone) {
      if (bias != nullptr) {
        SLUICE_CUBLAS_RETURN_IF_ERROR(
            cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof(bias)),
            "set BIAS_POINTER");
      }
      absl::Status st = impl.Tune(p, key, x, w, bias, y, glu_out, stream);
      if (!st.ok()) return st;
      impl.RecordTuned(p, TuningKeyOf(key, glu_out != nullptr),
                       TuningMask(impl.options, x, w, m, n, k));
    }
  }
  if (p.skinny) {
    if (glu_out != nullptr) {
      skinny_detail::LaunchSkinny(x, w, bias, glu_out, m, n / 2, k, p.skinny_split,
                                  p.skinny_stages, true, stream, impl.options.pdl);
      *fused = true;
      return CudaLaunchStatus("SkinnyGemmKernel (SiLU·mul)");
    }
    skinny_detail::LaunchSkinny(x, w, bias, y, m, n, k, p.skinny_split, p.skinny_stages, false,
                                stream, impl.options.pdl);
    return CudaLaunchStatus("SkinnyGemmKernel");
  }
  if (p.gemv && glu_out != nullptr && GemvGluVariantSupported(p.gemv_unroll, p.gemv_split)) {
    // The tuned GEMV variant, streaming the same rows, with the SiLU·mul epilogue.
    LaunchGemvGlu(x, w, bias, glu_out, m, n / 2, k, p.gemv_unroll, p.gemv_split, stream,
                  impl.options.pdl);
    *fused = true;
    return CudaLaunchStatus("GemvKernel (SiLU·mul)");
  }
  if (p.gemv) {
    LaunchGemv(x, w, bias, y, m, n, k, p.gemv_unroll, p.gemv_split, stream, impl.options.pdl);
    return CudaLaunchStatus("GemvKernel");
  }
  if (p.split != nullptr) {
    SLUICE_CUBLAS_RETURN_IF_ERROR(
        p.split->Run(impl.handle, x, w, bias, y, impl.workspace.data(), impl.workspace.bytes(),
                     impl.split_res.get(), stream),
        "cublasLtMatmul (N split)");
    return absl::OkStatus();
  }
  if (bias != nullptr) {
    SLUICE_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
                                      p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                                  "set BIAS_POINTER");
  }
  SLUICE_CUBLAS_RETURN_IF_ERROR(impl.RunAlgo(p, p.algo, x, w, y, stream), "cublasLtMatmul");
  return absl::OkStatus();
}

}  // namespace

absl::Status LinearCuda(CublasLt& lt, const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                        int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  return RunLinear(*lt.impl_, x, w, bias, y, m, n, k, stream, nullptr, nullptr);
}

absl::Status LinearSiluMulCuda(CublasLt& lt, const bf16* x, const bf16* w, const bf16* bias,
                               bf16* gate_up, bf16* out, int64_t m, int64_t inter, int64_t k,
                               cudaStream_t stream) {
  if (inter < 1 || inter > 0x3fffffff || gate_up == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LinearSiluMulCuda: needs 1 <= inter < 2^30 and gate_up, out buffers (inter=", inter, ")"));
  }
  bool fused = false;
  absl::Status st =
      RunLinear(*lt.impl_, x, w, bias, gate_up, m, 2 * inter, k, stream, out, &fused);
  if (!st.ok() || fused) return st;
  return SiluMulCuda(gate_up, out, m, inter, stream);
}

const LinearOptions& CublasLt::options() const { return impl_->options; }

void CublasLt::set_autotune(int64_t max_m) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->autotune_max_m = max_m;
}

double CublasLt::setup_seconds() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->setup_seconds;
}

std::string CublasLt::DescribePlans() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::pair<PlanKey, const Plan*>> sorted;
  for (const auto& [key, plan] : impl_->plans) sorted.emplace_back(key, plan.get());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& [key, p] : sorted) {
    const auto [m, n, k, has_bias, ax, aw, ay, ab] = key;
    int32_t algo_id = -1, tile = -1, splitk = 1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id,
                                         sizeof(algo_id), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                         sizeof(tile), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                         sizeof(splitk), &written);
    char line[384];
    std::snprintf(line, sizeof(line),
                  "m=%lld n=%lld k=%lld%s: %s; cublasLt algo %d tile %d splitK %d; candidates %zu; "
                  "tuned %d: best %.1f us, heuristic first %.1f us, gemv %.1f us "
                  "(unroll %d split %d), skinny %.1f us (split %d stages %d)",
                  static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                  has_bias ? " +bias" : "",
                  p->skinny ? "skinny" : p->gemv ? "GEMV" : "cuBLASLt", algo_id, tile, splitk,
                  p->candidates.size(), p->tuned ? 1 : 0, p->best_us, p->first_us, p->gemv_us,
                  p->gemv_unroll, p->gemv_split, p->skinny_us, p->skinny_split,
                  p->skinny_stages);
    out += line;
    if (p->from_table) out += " (GEMM tuning table)";
    if ((impl_->options.algo_search != 0 || p->from_table) && !p->gemv &&
        !p->skinny) {  // the algorithm in full
      out += "; " + (p->split != nullptr ? p->split->Describe() : gemm_search::DescribeAlgo(p->algo));
    }
    out += "\n";
  }
  return out;
}

absl::Status GemvCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                      int64_t n, int64_t k, cudaStream_t stream, int unroll, int split,
                      bool pdl) {
  if (n < 1 || k < 1 || !GemvSupported(x, w, m, n, k) || y == nullptr ||
      !GemvVariantSupported(unroll, split)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemvCuda: needs 1 <= m <= ", kGemvMaxRows, ", k % 8 == 0, 16-byte aligned x and w "
        "and (unroll, split) one of (4|8|16, 1), (4|8, 2), (4|8, 4), (4, 8) (m=", m, " n=", n,
        " k=", k, " unroll=", unroll, " split=", split, ")"));
  }
  LaunchGemv(x, w, bias, y, m, n, k, unroll, split, stream, pdl);
  return CudaLaunchStatus("GemvKernel");
}

absl::Status GemvSiluMulCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                             int64_t n, int64_t k, cudaStream_t stream, int unroll, int split,
                             bool pdl) {
  if (n < 1 || n > 0x3fffffff || k < 1 || !GemvSupported(x, w, m, 2 * n, k) || y == nullptr ||
      !GemvGluVariantSupported(unroll, split)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemvSiluMulCuda: needs 1 <= m <= ", kGemvMaxRows, ", k % 8 == 0, 16-byte aligned x and "
        "w and (unroll, split) one of (4|8|16, 1), (4|8, 2), (4|8, 4) (m=", m, " n=", n, " k=", k,
        " unroll=", unroll, " split=", split, ")"));
  }
  LaunchGemvGlu(x, w, bias, y, m, n, k, unroll, split, stream, pdl);
  return CudaLaunchStatus("GemvKernel (SiLU·mul)");
}

}  // namespace sluice::kernels
