// ScaledSoftmaxRowsCuda against ScaledSoftmaxRowsCpu on fresh random scores. Needs a GPU
// (kernels_cuda_test).
#include "kernels/softmax/softmax_cuda.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/softmax/softmax.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::Upload;

TEST(SoftmaxCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  // ViT sequence lengths (CLIP-L/14-336: 577, -224: 257, llava-tiny: 17) and one > 1 K.
  const int64_t shapes[][2] = {{16 * 577, 577}, {3, 257}, {34, 17}, {5, 1500}};
  for (const auto& s : shapes) {
    const int64_t rows = s[0], n = s[1];
    std::uniform_real_distribution<float> dist(-40.0f, 40.0f);
    std::vector<float> x(static_cast<size_t>(rows * n));
    for (float& v : x) v = dist(rng);
    const float scale = 0.125f;
    auto d_x = Upload(x);
    auto d_out = NanBuffer(x.size());
    ASSERT_TRUE(ScaledSoftmaxRowsCuda(d_x.data(), rows, n, scale, d_out.data(), nullptr).ok());
    std::vector<float> want(x.size());
    ScaledSoftmaxRowsCpu(x.data(), rows, n, scale, want.data());
    // Probabilities in [0, 1]: bf16 rounding (rtol 2^-8) plus a few ulps of fp32 exp; tiny
    // probabilities are absorbed by the absolute term.
    ExpectClose(absl::StrCat("softmax rows=", rows, " n=", n), Download(d_out), want, 1.0 / 128,
                1e-6);
  }
  EXPECT_EQ(ScaledSoftmaxRowsCuda(nullptr, 1, 0, 1.0f, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
