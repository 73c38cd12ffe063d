// simd::Exp against the C library's expf and its edge cases.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "kernels/common/vec16.h"

namespace sluice::kernels::simd {
namespace {

int64_t UlpDistance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, sizeof(a));
  std::memcpy(&ib, &b, sizeof(b));
  return std::abs(int64_t{ia} - int64_t{ib});  // both positive here
}

// Every 256th float of [-87.33, 88] (about 8 million inputs, dense near 0 as floats are):
// within 2 ulp of expf.
TEST(Vec16ExpTest, WithinTwoUlpOfExpf) {
  int64_t worst = 0;
  float worst_x = 0;
  float lanes[kLanes];
  int filled = 0;
  auto flush = [&]() {
    float out[kLanes];
    Store(out, Exp(Load(lanes)));
    for (int l = 0; l < filled; ++l) {
      const int64_t d = UlpDistance(out[l], std::exp(lanes[l]));
      if (d > worst) {
        worst = d;
        worst_x = lanes[l];
      }
    }
    filled = 0;
  };
  auto add = [&](uint32_t bits) {
    std::memcpy(&lanes[filled++], &bits, sizeof(float));
    if (filled == kLanes) flush();
  };
  uint32_t pos_end, neg_end;
  const float pos_max = 88.0f, neg_min = -87.33f;
  std::memcpy(&pos_end, &pos_max, sizeof(float));
  std::memcpy(&neg_end, &neg_min, sizeof(float));
  for (uint32_t bits = 0; bits <= pos_end; bits += 256) add(bits);
  for (uint32_t bits = 0x80000000u; bits <= neg_end; bits += 256) add(bits);
  if (filled > 0) flush();
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
  RecordProperty("worst_ulp", static_cast<int>(worst));
}

TEST(Vec16ExpTest, EdgeCases) {
  const float in[kLanes] = {0.0f, -0.0f, 1.0f, -1.0f, -87.0f, -87.4f, -100.0f, -1e30f,
                            -std::numeric_limits<float>::infinity(), 88.0f, 1e-8f, -1e-8f,
                            0.5f, -0.5f, 10.0f, -10.0f};
  float out[kLanes];
  Store(out, Exp(Load(in)));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_LE(UlpDistance(out[2], std::exp(1.0f)), 1);
  EXPECT_LE(UlpDistance(out[3], std::exp(-1.0f)), 1);
  EXPECT_LE(UlpDistance(out[4], std::exp(-87.0f)), 2);
  EXPECT_EQ(out[5], 0.0f);  // below -87.33: expf's denormals become 0
  EXPECT_EQ(out[6], 0.0f);
  EXPECT_EQ(out[7], 0.0f);
  EXPECT_EQ(out[8], 0.0f);  // a masked score
  EXPECT_LE(UlpDistance(out[9], std::exp(88.0f)), 2);
  EXPECT_EQ(out[10], 1.0f);
  EXPECT_EQ(out[11], 1.0f);
}

}  // namespace
}  // namespace sluice::kernels::simd
