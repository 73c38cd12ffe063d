#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/rms_norm/rms_norm.h"

namespace sluice::kernels {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double RefNorm(const float* x, const float* w, int64_t j, int64_t dim, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < dim; ++i) ss += double{x[i]} * x[i];
  return x[j] / std::sqrt(ss / dim + eps) * w[j];
}

TEST(RmsNormTest, MatchesReferenceWithStrides) {
  for (int64_t dim : {1, 7, 16, 64, 129}) {
    std::mt19937 rng(static_cast<uint32_t>(dim));
    const int64_t rows = 11, x_stride = dim + 3, out_stride = dim + 5;
    auto x = Random(static_cast<size_t>(rows * x_stride), rng, -3, 3);
    auto w = Random(static_cast<size_t>(dim), rng, 0.5f, 1.5f);
    std::vector<float> out(static_cast<size_t>(rows * out_stride), 42.0f);
    RmsNormCpu(x.data(), x_stride, w.data(), out.data(), out_stride, rows, dim, 1e-6f);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < dim; ++j) {
        EXPECT_NEAR(out[r * out_stride + j], RefNorm(x.data() + r * x_stride, w.data(), j, dim, 1e-6f),
                    1e-5);
      }
      for (int64_t j = dim; j < out_stride; ++j) EXPECT_EQ(out[r * out_stride + j], 42.0f);
    }
  }
}

TEST(RmsNormTest, InPlaceAndEps) {
  // x = [3, 4]: mean square 12.5; with eps 7.5 the scale is 1/sqrt(20).
  std::vector<float> x = {3, 4};
  const float w[] = {1.0f, 2.0f};
  RmsNormCpu(x.data(), 2, w, x.data(), 2, 1, 2, 7.5f);
  EXPECT_NEAR(x[0], 3 / std::sqrt(20.0), 1e-6);
  EXPECT_NEAR(x[1], 8 / std::sqrt(20.0), 1e-6);
}

TEST(RmsNormTest, AddRmsNormUpdatesResidual) {
  const int64_t rows = 5, dim = 48;
  std::mt19937 rng(3);
  auto x = Random(static_cast<size_t>(rows * dim), rng, -1, 1);
  auto res = Random(static_cast<size_t>(rows * dim), rng, -1, 1);
  auto w = Random(static_cast<size_t>(dim), rng, 0.5f, 1.5f);
  auto expect_res = res;
  for (size_t i = 0; i < res.size(); ++i) expect_res[i] += x[i];
  std::vector<float> out(static_cast<size_t>(rows * dim));
  AddRmsNormCpu(x.data(), res.data(), w.data(), out.data(), rows, dim, 1e-5f);
  EXPECT_EQ(res, expect_res);
  std::vector<float> out2(out.size());
  RmsNormCpu(expect_res.data(), dim, w.data(), out2.data(), dim, rows, dim, 1e-5f);
  EXPECT_EQ(out, out2);
}

}  // namespace
}  // namespace sluice::kernels
