#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention/bidirectional_attention.h"

namespace sluice::kernels {
namespace {

TEST(BidirectionalAttentionTest, MatchesFloat64ReferenceOnFusedQkv) {
  BidirectionalAttentionParams p;
  p.num_sequences = 3;
  p.seq_len = 17;
  p.num_heads = 2;
  p.head_dim = 16;
  p.scale = 0.25f;
  const int64_t width = p.num_heads * p.head_dim, stride = 3 * width;
  const int64_t rows = p.num_sequences * p.seq_len;
  std::mt19937 rng(26);
  std::normal_distribution<float> dist(0, 1);
  std::vector<float> qkv(rows * stride);
  for (float& x : qkv) x = dist(rng);
  std::vector<float> out(rows * width);
  BidirectionalAttentionCpu(qkv.data(), qkv.data() + width, qkv.data() + 2 * width, stride, p,
                            out.data());
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t base = row / p.seq_len * p.seq_len;
    for (int64_t h = 0; h < p.num_heads; ++h) {
      std::vector<double> s(p.seq_len);
      double m = -1e300, sum = 0;
      for (int64_t j = 0; j < p.seq_len; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < p.head_dim; ++d) {
          dot += double{qkv[row * stride + h * p.head_dim + d]} *
                 qkv[(base + j) * stride + width + h * p.head_dim + d];
        }
        s[j] = dot * p.scale;
        m = std::max(m, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - m));
      for (int64_t d = 0; d < p.head_dim; ++d) {
        double ref = 0;
        for (int64_t j = 0; j < p.seq_len; ++j) {
          ref += s[j] / sum * qkv[(base + j) * stride + 2 * width + h * p.head_dim + d];
        }
        EXPECT_NEAR(out[row * width + h * p.head_dim + d], ref, 1e-5);
      }
    }
  }
}

TEST(BidirectionalAttentionTest, EarlyQueriesSeeLaterKeys) {
  // One head, 2 positions, head_dim 1: the first query must weigh the second key (no causal
  // mask). q = k = [0, 10], v = [1, 3]: query 0 gives equal scores -> mean of v = 2.
  BidirectionalAttentionParams p{1, 2, 1, 1, 1.0f};
  const float q[] = {0, 10}, k[] = {0, 10}, v[] = {1, 3};
  float out[2];
  BidirectionalAttentionCpu(q, k, v, 1, p, out);
  EXPECT_FLOAT_EQ(out[0], 2.0f);
  EXPECT_NEAR(out[1], 3.0f, 1e-6);
}

}  // namespace
}  // namespace sluice::kernels
