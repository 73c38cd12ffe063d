#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/rope/rope.h"

namespace sluice::kernels {
namespace {

TEST(RopeTableTest, DefaultInverseFrequencies) {
  RopeParams p;
  p.theta = 10000.0;
  p.rotary_dim = 16;
  auto t = MakeRopeTable(p);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->inv_freq.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(t->inv_freq[i], std::pow(10000.0, -2.0 * i / 16), 1e-6 * t->inv_freq[0]);
  }
  EXPECT_EQ(t->inv_freq[0], 1.0f);
  EXPECT_EQ(t->attention_scaling, 1.0f);
}

TEST(RopeTableTest, LinearDividesByFactor) {
  RopeParams p;
  p.rotary_dim = 8;
  auto base = MakeRopeTable(p);
  p.rope_type = "linear";
  p.factor = 4.0;
  auto lin = MakeRopeTable(p);
  ASSERT_TRUE(base.ok() && lin.ok());
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(lin->inv_freq[i], base->inv_freq[i] / 4.0f);
}

TEST(RopeTableTest, YarnBlendsExtrapolationAndInterpolation) {
  RopeParams p;
  p.rope_type = "yarn";
  p.theta = 10000.0;
  p.rotary_dim = 64;
  p.factor = 4.0;
  p.original_max_position_embeddings = 4096;
  auto t = MakeRopeTable(p);
  ASSERT_TRUE(t.ok()) << t.status();
  // High-frequency dims (many rotations in the original context) keep the original frequency;
  // low-frequency dims are interpolated by 1/factor (YaRN, Peng et al. 2023, §3.2).
  const double f0 = 1.0, f31 = std::pow(10000.0, -62.0 / 64);
  EXPECT_NEAR(t->inv_freq[0], f0, 1e-6);
  EXPECT_NEAR(t->inv_freq[31], f31 / 4.0, 1e-6 * f31);
  // attention factor 0.1 ln(s) + 1 when mscale_all_dim is not given.
  EXPECT_NEAR(t->attention_scaling, 0.1 * std::log(4.0) + 1.0, 1e-6);
  // DeepSeek-V3 sets mscale == mscale_all_dim: the ratio is 1.
  p.mscale = 1.0;
  p.mscale_all_dim = 1.0;
  auto d = MakeRopeTable(p);
  ASSERT_TRUE(d.ok());
  EXPECT_FLOAT_EQ(d->attention_scaling, 1.0f);
  // Monotone: frequencies never increase with the dim index.
  for (size_t i = 1; i < t->inv_freq.size(); ++i) EXPECT_LE(t->inv_freq[i], t->inv_freq[i - 1]);
}

TEST(RopeTableTest, Llama3ScalesOnlyLowFrequencies) {
  RopeParams p;
  p.rope_type = "llama3";
  p.theta = 500000.0;
  p.rotary_dim = 128;
  p.factor = 8.0;
  p.low_freq_factor = 1.0;
  p.high_freq_factor = 4.0;
  p.original_max_position_embeddings = 8192;
  auto t = MakeRopeTable(p);
  ASSERT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < 64; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / 128);
    const double wavelen = 2 * M_PI / f;
    if (wavelen < 8192.0 / 4) EXPECT_NEAR(t->inv_freq[i], f, 1e-6 * f) << i;
    if (wavelen > 8192.0) EXPECT_NEAR(t->inv_freq[i], f / 8, 1e-6 * f) << i;
  }
}

TEST(RopeTableTest, Errors) {
  RopeParams p;
  p.rotary_dim = 7;
  EXPECT_EQ(MakeRopeTable(p).status().code(), absl::StatusCode::kInvalidArgument);
  p.rotary_dim = 8;
  p.rope_type = "dynamic-ntk-made-up";
  EXPECT_EQ(MakeRopeTable(p).status().code(), absl::StatusCode::kInvalidArgument);
  p.rope_type = "yarn";  // needs original_max_position_embeddings
  EXPECT_EQ(MakeRopeTable(p).status().code(), absl::StatusCode::kInvalidArgument);
}

// Naive rotate-half (transformers' apply_rotary_pos_emb) in double precision.
void RefRotate(std::vector<double>& v, int64_t pos, const std::vector<float>& inv_freq) {
  const size_t half = inv_freq.size();
  std::vector<double> out(v.size());
  for (size_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(pos) * inv_freq[i];
    out[i] = v[i] * std::cos(a) - v[i + half] * std::sin(a);
    out[i + half] = v[i + half] * std::cos(a) + v[i] * std::sin(a);
  }
  v = out;
}

TEST(RopeCpuTest, MatchesReferenceWithOffsetAndInterleave) {
  RopeParams p;
  p.rotary_dim = 8;
  auto table = MakeRopeTable(p);
  ASSERT_TRUE(table.ok());
  const int64_t tokens = 6, heads = 3, head_stride = 13, token_stride = 41, offset = 4;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0, 1);
  const int32_t positions[] = {0, 1, 5, 100, 1023, 2047};
  for (bool interleave : {false, true}) {
    std::vector<float> x(tokens * token_stride);
    for (float& v : x) v = dist(rng);
    const std::vector<float> orig = x;
    RopeCpu(x.data(), tokens, heads, token_stride, head_stride, offset, positions, *table,
            interleave);
    std::vector<bool> touched(x.size(), false);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = t * token_stride + h * head_stride + offset;
        std::vector<double> v(8);
        for (int i = 0; i < 8; ++i) {
          // Interleave: pairs (x0,x1),(x2,x3).. become halves [x0,x2,x4,x6,x1,x3,x5,x7].
          const int src = interleave ? (i < 4 ? 2 * i : 2 * (i - 4) + 1) : i;
          v[i] = orig[base + src];
          touched[base + i] = true;
        }
        RefRotate(v, positions[t], table->inv_freq);
        for (int i = 0; i < 8; ++i) {
          EXPECT_NEAR(x[base + i], v[i], 1e-4) << "t=" << t << " h=" << h << " i=" << i;
        }
        if (positions[t] == 0 && !interleave) {
          for (int i = 0; i < 8; ++i) EXPECT_EQ(x[base + i], orig[base + i]);
        }
      }
    }
    for (size_t i = 0; i < x.size(); ++i) {
      if (!touched[i]) EXPECT_EQ(x[i], orig[i]) << "channel " << i << " outside the rotary span";
    }
  }
}

}  // namespace
}  // namespace sluice::kernels
