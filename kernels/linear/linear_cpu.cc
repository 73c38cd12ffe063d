// LinearCpu: register-tiled float32 GEMM y = x · Wᵀ (+ bias), batch invariant.
//
// Every output element y[i, j] is computed by the same sequence of operations whatever m is and
// wherever (i, j) falls in the tiling: one 16-lane accumulator over k in steps of 16
// (lane l sums x[i, k]·w[j, k] for k ≡ l mod 16, in increasing k), a fixed pairwise reduction
// of the 16 lanes, then the k % 16 tail in increasing k, then the bias. Tiles only decide how
// many (i, j) pairs share loads, never the arithmetic of one pair.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "kernels/common/isa_clones.h"
#include "kernels/common/parallel.h"
#include "kernels/common/vec16.h"
#include "kernels/linear/linear.h"

namespace sluice::kernels {
namespace {

using simd::kLanes;
using simd::Load;
using simd::Reduce;
using simd::Reduce4;
using simd::Store;
using simd::V16;

// LoadW: 16 weights as floats; bfloat16 weights (uint16_t bits) widen exactly (bits << 16), so
// a bf16 weight matrix gives the bits of the float32 matrix holding the same values.
inline V16 LoadW(const float* p) { return Load(p); }
inline V16 LoadW(const uint16_t* p) {
  typedef uint16_t U16x16 __attribute__((vector_size(32), aligned(2)));
  typedef uint32_t U32x16 __attribute__((vector_size(64)));
  U16x16 h;
  std::memcpy(&h, p, sizeof(h));
#if defined(__AVX512F__) && !defined(__clang__)
  // One 16-lane vpmovzxwd: GCC 12 lowers the generic conversion below to two 8-lane halves and
  // a merge (five instructions), which slows a decode GEMM on cached weights by about 1.5×.
  typedef short S16x16 __attribute__((vector_size(32)));
  typedef int S32x16 __attribute__((vector_size(64)));
  const U32x16 wide = reinterpret_cast<U32x16>(__builtin_ia32_pmovzxwd512_mask(
                          reinterpret_cast<S16x16>(h), S32x16{}, static_cast<uint16_t>(0xffff)))
                      << 16;
#else
  const U32x16 wide = __builtin_convertvector(h, U32x16) << 16;
#endif
  V16 v;
  std::memcpy(&v, &wide, sizeof(v));
  return v;
}
inline float WidenW(float w) { return w; }
inline float WidenW(uint16_t w) {
  const uint32_t bits = static_cast<uint32_t>(w) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// MulAdd: x·w + s, fused where the target has FMA — explicitly, so every instantiation rounds
// alike whatever GCC's contraction (-ffp-contract=fast) makes of each; without FMA (a
// non-native build) nothing can be contracted and the plain expression is as stable.
inline float MulAdd(float x, float w, float s) {
#ifdef __FMA__
  return __builtin_fmaf(x, w, s);
#else
  return s + x * w;
#endif
}

// Computes the MR × NR block y[i0.., j0..]. Arithmetic per element is independent of MR/NR.
// With `prefetch`, the k loop also prefetches `prefetch_bytes` from `prefetch`, spread over its
// iterations: the caller points it at the next block's weight rows, which a decode-sized GEMM
// streams from DRAM once. The hardware prefetcher alone leaves the core waiting on each new
// block (about 8 GB/s from one core here, 10-14 GB/s with the software prefetch).
template <int MR, int NR, typename W>
inline void MicroKernel(const float* x, const W* w, const float* bias, float* y, int64_t n,
                        int64_t k, int64_t i0, int64_t j0, const char* prefetch = nullptr,
                        int64_t prefetch_bytes = 0) {
  V16 acc[MR][NR];
  for (int a = 0; a < MR; ++a) {
    for (int b = 0; b < NR; ++b) acc[a][b] = V16{};
  }
  const int64_t k_main = k - k % kLanes;
  const float* xr[MR];
  const W* wr[NR];
  for (int a = 0; a < MR; ++a) xr[a] = x + (i0 + a) * k;
  for (int b = 0; b < NR; ++b) wr[b] = w + (j0 + b) * k;
  // Cache lines of the prefetch range per k step, rounded up so the range is covered.
  const int64_t steps = std::max<int64_t>(1, k_main / kLanes);
  const int64_t lines_per_step = (prefetch_bytes / 64 + steps - 1) / steps;
  const char* next_line = prefetch;
  const char* prefetch_end = prefetch + prefetch_bytes;
  for (int64_t kk = 0; kk < k_main; kk += kLanes) {
    if (prefetch != nullptr) {
      for (int64_t l = 0; l < lines_per_step && next_line < prefetch_end; ++l, next_line += 64) {
        __builtin_prefetch(next_line);
      }
    }
    V16 wv[NR];
    for (int b = 0; b < NR; ++b) wv[b] = LoadW(wr[b] + kk);
    for (int a = 0; a < MR; ++a) {
      V16 xv = Load(xr[a] + kk);
      for (int b = 0; b < NR; ++b) acc[a][b] = acc[a][b] + xv * wv[b];
    }
  }
  float red[MR][NR];
  for (int a = 0; a < MR; ++a) {
    if constexpr (NR % 4 == 0) {
      for (int b = 0; b < NR; b += 4) Reduce4(acc[a][b], acc[a][b + 1], acc[a][b + 2], acc[a][b + 3], &red[a][b]);
    } else {
      for (int b = 0; b < NR; ++b) red[a][b] = Reduce(acc[a][b]);
    }
  }
  if (k_main == k && bias == nullptr) {  // the common case, kept free of the loops below
    for (int a = 0; a < MR; ++a) std::memcpy(y + (i0 + a) * n + j0, red[a], sizeof(red[a]));
    return;
  }
  for (int a = 0; a < MR; ++a) {
    for (int b = 0; b < NR; ++b) {
      float s = red[a][b];
      for (int64_t kk = k_main; kk < k; ++kk) s = MulAdd(xr[a][kk], WidenW(wr[b][kk]), s);
      if (bias != nullptr) s += bias[j0 + b];
      y[(i0 + a) * n + j0 + b] = s;
    }
  }
}

// Columns [j0, j0 + NR) for every row, MR rows per tile. The first tile reads the NR weight
// rows from memory and prefetches the NR rows after them (up to j_end), which the next call
// reads; later tiles find them in L1, so all m rows share one weight read.
template <int MR, int NR, typename W>
void ColumnBlock(const float* x, const W* w, const float* bias, float* y, int64_t m, int64_t n,
                 int64_t k, int64_t j0, int64_t j_end) {
  const int64_t next_rows = std::min<int64_t>(NR, j_end - (j0 + NR));
  const char* prefetch =
      next_rows > 0 ? reinterpret_cast<const char*>(w + (j0 + NR) * k) : nullptr;
  int64_t prefetch_bytes = next_rows > 0 ? next_rows * k * int64_t{sizeof(W)} : 0;
  int64_t i = 0;
  for (; i + MR <= m; i += MR, prefetch = nullptr, prefetch_bytes = 0) {
    MicroKernel<MR, NR>(x, w, bias, y, n, k, i, j0, prefetch, prefetch_bytes);
  }
  if constexpr (MR > 3) {
    if (m - i == 3) MicroKernel<3, NR>(x, w, bias, y, n, k, i, j0, prefetch, prefetch_bytes);
  }
  if (m - i == 2) MicroKernel<2, NR>(x, w, bias, y, n, k, i, j0, prefetch, prefetch_bytes);
  if (m - i == 1) MicroKernel<1, NR>(x, w, bias, y, n, k, i, j0, prefetch, prefetch_bytes);
}

// Tiles of 3 rows × 8 columns: 24 accumulators and 8 weight vectors, the AVX-512 register file's
// worth when the multiply-add is fused. Unfused (a baseline build's clones) each product needs a
// register too, and beyond a few rows 4 × 4 tiles are faster (bench/linear_cpu_bench.cc A/B,
// bench/results/cpu_linear_tiles_ab.json).
#ifdef __FMA__
constexpr int64_t kMaxRowsFor3x8 = INT64_MAX;
#else
constexpr int64_t kMaxRowsFor3x8 = 8;  // decode and speculative verification steps
#endif

template <typename W>
void Panel(const float* x, const W* w, const float* bias, float* y, int64_t m, int64_t n,
           int64_t k, int64_t j_begin, int64_t j_end) {
  int64_t j = j_begin;
  if (m <= kMaxRowsFor3x8) {
    for (; j + 8 <= j_end; j += 8) ColumnBlock<3, 8>(x, w, bias, y, m, n, k, j, j_end);
    for (; j + 4 <= j_end; j += 4) ColumnBlock<3, 4>(x, w, bias, y, m, n, k, j, j_end);
    for (; j < j_end; ++j) ColumnBlock<3, 1>(x, w, bias, y, m, n, k, j, j_end);
  } else {
    for (; j + 4 <= j_end; j += 4) ColumnBlock<4, 4>(x, w, bias, y, m, n, k, j, j_end);
    for (; j < j_end; ++j) ColumnBlock<4, 1>(x, w, bias, y, m, n, k, j, j_end);
  }
}

// The panels are where LinearCpu spends its time: AVX-512 clones in a baseline build.
SLUICE_AVX512_CLONES void PanelF32(const float* x, const float* w, const float* bias, float* y,
                                   int64_t m, int64_t n, int64_t k, int64_t j_begin,
                                   int64_t j_end) {
  Panel(x, w, bias, y, m, n, k, j_begin, j_end);
}
SLUICE_AVX512_CLONES void PanelBf16(const float* x, const uint16_t* w, const float* bias,
                                    float* y, int64_t m, int64_t n, int64_t k, int64_t j_begin,
                                    int64_t j_end) {
  Panel(x, w, bias, y, m, n, k, j_begin, j_end);
}
inline void PanelFor(const float* x, const float* w, const float* bias, float* y, int64_t m,
                     int64_t n, int64_t k, int64_t j_begin, int64_t j_end) {
  PanelF32(x, w, bias, y, m, n, k, j_begin, j_end);
}
inline void PanelFor(const float* x, const uint16_t* w, const float* bias, float* y, int64_t m,
                     int64_t n, int64_t k, int64_t j_begin, int64_t j_end) {
  PanelBf16(x, w, bias, y, m, n, k, j_begin, j_end);
}

template <typename W>
void Linear(const float* x, const W* w, const float* bias, float* y, int64_t m, int64_t n,
            int64_t k) {
  if (m <= 0 || n <= 0) return;
  // Split n in groups of 8 columns; each chunk gets at least ~256K multiply-adds.
  constexpr int64_t kGroup = 8;
  const int64_t groups = (n + kGroup - 1) / kGroup;
  const int64_t work_per_group = std::max<int64_t>(1, m * k * kGroup);
  // ~32K multiply-adds per chunk: the spinning pool (kernels/common/parallel.cc) makes a
  // split this small pay off, so an m=1 decode GEMM uses every core.
  const int64_t min_chunk = std::max<int64_t>(1, (int64_t{1} << 15) / work_per_group);
  ParallelFor(groups, min_chunk, [&](int64_t g_begin, int64_t g_end) {
    PanelFor(x, w, bias, y, m, n, k, g_begin * kGroup, std::min(n, g_end * kGroup));
  });
}

}  // namespace

void LinearCpu(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
               int64_t k) {
  Linear(x, w, bias, y, m, n, k);
}

void LinearBf16Cpu(const float* x, const uint16_t* w, const float* bias, float* y, int64_t m,
                   int64_t n, int64_t k) {
  Linear(x, w, bias, y, m, n, k);
}

uint16_t ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace sluice::kernels
