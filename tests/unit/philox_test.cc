// Philox4x32-10 against Random123's published known-answer vectors, and the sampling draw key's
// layout (expected uniforms computed independently from the same counter/key packing).
#include "engine/sample/philox.h"

#include <cstdint>
#include <set>

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(PhiloxTest, Random123KnownAnswers) {
  EXPECT_EQ(Philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(Philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(Philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// DrawUniform(key, draw) = top 53 bits of word1:word0 of Philox4x32_10(
//   {position lo, position hi, choice, draw}, {seed lo, seed hi}) · 2^-53.
TEST(PhiloxTest, DrawUniformExactValues) {
  EXPECT_EQ(DrawUniform({0, 0, 0}), 7931020870206717 * 0x1.0p-53);  // (0xe169c58d6627e8d5 >> 11)
  EXPECT_EQ(DrawUniform({42, 0, 7}), 3675708453517232 * 0x1.0p-53);
  EXPECT_EQ(DrawUniform({42, 1, 7}), 2902952990314264 * 0x1.0p-53);
  EXPECT_EQ(DrawUniform({42, 0, 8}), 1210225037248842 * 0x1.0p-53);
  EXPECT_EQ(DrawUniform({42, 0, 7}, 1), 7502868835416152 * 0x1.0p-53);
  EXPECT_EQ(DrawUniform({0x123456789abcdef0u, 3, int64_t{1} << 33}),
            4476682404073244 * 0x1.0p-53);
}

TEST(PhiloxTest, DrawsAreInUnitIntervalAndDistinct) {
  std::set<double> seen;
  for (int64_t position = 0; position < 1000; ++position) {
    const double u = DrawUniform({1, 0, position});
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    seen.insert(u);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(PhiloxTest, NewRandomSeedFitsInAJsonNumber) {
  for (int i = 0; i < 100; ++i) ASSERT_LT(NewRandomSeed(), uint64_t{1} << 53);
  EXPECT_NE(NewRandomSeed(), NewRandomSeed());  // 2^-53 chance of a false failure
}

}  // namespace
}  // namespace sluice
