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

// Exp: e^x per lane, within about 2 ulp of expf for x in [-87.33, 88]; lanes below -87.33
// (where expf turns denormal) give 0, lanes above 88 give e^88. Cody–Waite reduction
// x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in a high part exact in float and a low part), a
// degree-7 Taylor polynomial of e^r (truncation error r^8/8! < 6e-9, under a tenth of an ulp),
// and 2^n from the exponent bits. Plain multiplies and adds, so a baseline build's AVX-512 clone
// and its SSE code compute the same bits (kernels/common/isa_clones.h).
inline V16 Exp(V16 x) {
  const V16 zero = V16{};
  const V16 lo = zero - 87.33f;
  const V16 hi = zero + 88.0f;
  const V16 in = x < lo ? lo : (x > hi ? hi : x);
  const V16 round = zero + 12582912.0f;  // 1.5 · 2^23: adding then subtracting it rounds
  const V16 n = (in * 1.44269504088896341f + round) - round;
  const V16 r = (in - n * 0.693359375f) - n * -2.12194440e-4f;
  V16 p = zero + (1.0f / 5040.0f);
  p = p * r + (1.0f / 720.0f);
  p = p * r + (1.0f / 120.0f);
  p = p * r + (1.0f / 24.0f);
  p = p * r + (1.0f / 6.0f);
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const I16 bits = (__builtin_convertvector(n, I16) + 127) << 23;
  V16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const V16 e = p * scale;
  return x < lo ? zero : e;
}

}  // namespace sluice::kernels::simd

#endif  // SLUICE_KERNELS_COMMON_VEC16_H_
