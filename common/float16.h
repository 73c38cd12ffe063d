#ifndef SLUICE_COMMON_FLOAT16_H_
#define SLUICE_COMMON_FLOAT16_H_

// Host conversions between float32 and the 16-bit float formats that checkpoints and KV caches
// store (bfloat16, IEEE 754 binary16), bit-exact and platform-independent.

#include <cstdint>
#include <cstring>

namespace sluice {

// Bf16ToFloat widens exactly; Fp16ToFloat too (subnormals, inf and NaN included);
// FloatToBf16 rounds to the nearest bfloat16, ties to even (NaN stays a quiet NaN).
inline float Bf16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float Fp16ToFloat(uint16_t h) {
  // IEEE 754 binary16 → binary32, exact (handles subnormals, inf, NaN).
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      // Subnormal: normalize.
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t FloatToBf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

}  // namespace sluice

#endif  // SLUICE_COMMON_FLOAT16_H_
