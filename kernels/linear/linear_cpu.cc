// LinearCpu: register-tiled float32 GEMM y = x · Wᵀ (+ bias), batch invariant.
//
// Every output element y[i, j] is computed by the same sequence of operations whatever m is and
// wherever (i, j) falls in the tiling: one 16-lane accumulator over k in steps of 16
// (lane l sums x[i, k]·w[j, k] for k ≡ l mod 16, in increasing k), a fixed pairwise reduction
// of the 16 lanes, then the k % 16 tail in increasing k, then the bias. Tiles only decide how
// many (i, j) pairs share loads, never the arithmetic of one pair.
#include <algorithm>
#include <cstring>

#include "kernels/common/parallel.h"
#include "kernels/linear/linear.h"

namespace sluice::kernels {
namespace {

constexpr int kLanes = 16;
typedef float V16 __attribute__((vector_size(64), aligned(4)));

inline V16 Load(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Fixed-order horizontal sum: pairwise halves 16 → 8 → 4 → 2 → 1.
inline float Reduce(V16 v) {
  float a[kLanes];
  std::memcpy(a, &v, sizeof(a));
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) a[l] = a[l] + a[l + width];
  }
  return a[0];
}

typedef int32_t I16 __attribute__((vector_size(64)));
// Reduce4 writes the horizontal sums of a, b, c, d to out[0..3]: the same pairwise tree as
// Reduce (so results are bit-identical) but four vectors at a time with shuffles.
inline void Reduce4(V16 a, V16 b, V16 c, V16 d, float* out) {
  const V16 p01 = __builtin_shuffle(a, b, I16{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) +
                  __builtin_shuffle(a, b, I16{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
  const V16 p23 = __builtin_shuffle(c, d, I16{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) +
                  __builtin_shuffle(c, d, I16{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
  const V16 q = __builtin_shuffle(p01, p23, I16{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}) +
                __builtin_shuffle(p01, p23, I16{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
  const V16 r = __builtin_shuffle(q, I16{0, 1, 4, 5, 8, 9, 12, 13, 0, 1, 4, 5, 8, 9, 12, 13}) +
                __builtin_shuffle(q, I16{2, 3, 6, 7, 10, 11, 14, 15, 2, 3, 6, 7, 10, 11, 14, 15});
  const V16 t = __builtin_shuffle(r, I16{0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6}) +
                __builtin_shuffle(r, I16{1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7});
  float lanes[kLanes];
  std::memcpy(lanes, &t, sizeof(lanes));
  for (int i = 0; i < 4; ++i) out[i] = lanes[i];
}

// Computes the MR × NR block y[i0.., j0..]. Arithmetic per element is independent of MR/NR.
template <int MR, int NR>
inline void MicroKernel(const float* x, const float* w, const float* bias, float* y, int64_t n,
                        int64_t k, int64_t i0, int64_t j0) {
  V16 acc[MR][NR];
  for (int a = 0; a < MR; ++a) {
    for (int b = 0; b < NR; ++b) acc[a][b] = V16{};
  }
  const int64_t k_main = k - k % kLanes;
  const float* xr[MR];
  const float* wr[NR];
  for (int a = 0; a < MR; ++a) xr[a] = x + (i0 + a) * k;
  for (int b = 0; b < NR; ++b) wr[b] = w + (j0 + b) * k;
  for (int64_t kk = 0; kk < k_main; kk += kLanes) {
    V16 wv[NR];
    for (int b = 0; b < NR; ++b) wv[b] = Load(wr[b] + kk);
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
  for (int a = 0; a < MR; ++a) {
    for (int b = 0; b < NR; ++b) {
      float s = red[a][b];
      for (int64_t kk = k_main; kk < k; ++kk) s += xr[a][kk] * wr[b][kk];
      if (bias != nullptr) s += bias[j0 + b];
      y[(i0 + a) * n + j0 + b] = s;
    }
  }
}

template <int NR>
void RowBlocks(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
               int64_t k, int64_t j0) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) MicroKernel<4, NR>(x, w, bias, y, n, k, i, j0);
  for (; i < m; ++i) MicroKernel<1, NR>(x, w, bias, y, n, k, i, j0);
}

// Column panel [j_begin, j_end): panels of 64 columns stay hot in L2 while every x row
// streams past them.
void Panel(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
           int64_t k, int64_t j_begin, int64_t j_end) {
  constexpr int64_t kPanel = 64;
  for (int64_t p = j_begin; p < j_end; p += kPanel) {
    const int64_t p_end = std::min(j_end, p + kPanel);
    int64_t j = p;
    if (m == 1) {
      // Decode: more independent accumulators per x load to keep the FMA pipes busy.
      for (; j + 8 <= p_end; j += 8) MicroKernel<1, 8>(x, w, bias, y, n, k, 0, j);
    }
    for (; j + 4 <= p_end; j += 4) RowBlocks<4>(x, w, bias, y, m, n, k, j);
    for (; j < p_end; ++j) RowBlocks<1>(x, w, bias, y, m, n, k, j);
  }
}

}  // namespace

void LinearCpu(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n,
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
    Panel(x, w, bias, y, m, n, k, g_begin * kGroup, std::min(n, g_end * kGroup));
  });
}

}  // namespace sluice::kernels
