// 16-lane float vectors (GCC vector extension: one AVX-512 register, or two AVX2 registers)
// and the fixed-order horizontal sums the CPU kernels use for batch-invariant dot products.
#ifndef SLUICE_KERNELS_COMMON_VEC16_H_
#define SLUICE_KERNELS_COMMON_VEC16_H_

#include <cstdint>
#include <cstring>

namespace sluice::kernels::simd {

constexpr int kLanes = 16;
typedef float V16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t I16 __attribute__((vector_size(64)));

// Load/Store: unaligned 16-float access.
inline V16 Load(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, V16 v) { std::memcpy(p, &v, sizeof(v)); }

// Reduce: fixed-order horizontal sum, pairwise halves 16 → 8 → 4 → 2 → 1.
inline float Reduce(V16 v) {
  float a[kLanes];
  std::memcpy(a, &v, sizeof(a));
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) a[l] = a[l] + a[l + width];
  }
  return a[0];
}

// Reduce4 writes Reduce(a), Reduce(b), Reduce(c), Reduce(d) to out[0..3]: the same pairwise
// tree per vector computed on transposed lanes with shuffles, bit-identical to four Reduce
// calls at a fraction of their cost.
inline void Reduce4(V16 a, V16 b, V16 c, V16 d, float* out) {
#if defined(__clang__)
  // Clang (the fuzz build) has no __builtin_shuffle; the four plain sums give the same bits.
  out[0] = Reduce(a);
  out[1] = Reduce(b);
  out[2] = Reduce(c);
  out[3] = Reduce(d);
#else
  const I16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const I16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const V16 p01 = __builtin_shuffle(a, b, lo8) + __builtin_shuffle(a, b, hi8);
  const V16 p23 = __builtin_shuffle(c, d, lo8) + __builtin_shuffle(c, d, hi8);
  // q[4k + i] = v_k[i] + v_k[i + 4] over the 8 partial sums of vector k.
  const V16 q =
      __builtin_shuffle(p01, p23, I16{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}) +
      __builtin_shuffle(p01, p23, I16{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
  const V16 r = __builtin_shuffle(q, I16{0, 1, 4, 5, 8, 9, 12, 13, 0, 1, 4, 5, 8, 9, 12, 13}) +
                __builtin_shuffle(q, I16{2, 3, 6, 7, 10, 11, 14, 15, 2, 3, 6, 7, 10, 11, 14, 15});
  const V16 t = __builtin_shuffle(r, I16{0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6}) +
                __builtin_shuffle(r, I16{1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7, 1, 3, 5, 7});
  float lanes[kLanes];
  std::memcpy(lanes, &t, sizeof(lanes));
  for (int i = 0; i < 4; ++i) out[i] = lanes[i];
#endif
}

}  // namespace sluice::kernels::simd

#endif  // SLUICE_KERNELS_COMMON_VEC16_H_
