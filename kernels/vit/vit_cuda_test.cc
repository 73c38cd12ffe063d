// The ViT plumbing kernels (vit_cuda.h) against their CPU references (vit.h). Needs a GPU
// (kernels_cuda_test).
#include "kernels/vit/vit_cuda.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/vit/vit.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::RoundTrip;
using cuda_test::ToFloat;
using cuda_test::Upload;

std::vector<float> RandomFloats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// (images, image size, patch): llava-tiny, CLIP ViT-L/14-336, a non-square patch count.
const int64_t kGeometries[][3] = {{3, 32, 8}, {2, 336, 14}, {1, 60, 12}};

TEST(VitCudaTest, PatchUnfoldMatchesCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const auto& g : kGeometries) {
    const int64_t n = g[0], S = g[1], P = g[2], G = S / P, K = 3 * P * P;
    const auto pixels = RandomFloats(static_cast<size_t>(n * 3 * S * S), rng);
    auto d_pixels = Upload(pixels);
    std::vector<float> want(static_cast<size_t>(n * G * G * K));
    PatchUnfoldCpu(pixels.data(), n, 3, S, P, want.data());
    // Dense rows, then rows padded to a multiple of 8 (+ 8): the pad is zeros.
    for (const int64_t stride : {K, (K + 7) / 8 * 8 + 8}) {
      auto d_cols = NanBuffer(static_cast<size_t>(n * G * G * stride));
      ASSERT_TRUE(
          PatchUnfoldCuda(d_pixels.data(), n, 3, S, P, stride, d_cols.data(), nullptr).ok());
      std::vector<float> padded(static_cast<size_t>(n * G * G * stride), 0.0f);
      for (int64_t r = 0; r < n * G * G; ++r) {
        std::copy(want.begin() + r * K, want.begin() + (r + 1) * K, padded.begin() + r * stride);
      }
      // A copy + one rounding: exact.
      EXPECT_EQ(Download(d_cols), RoundTrip(padded))
          << "S=" << S << " P=" << P << " stride=" << stride;
    }
  }
  EXPECT_EQ(PatchUnfoldCuda(nullptr, 1, 3, 30, 7, 147, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(VitCudaTest, ClipEmbeddingsAndFeatureSelectionMatchCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t n = 3, patches = 576, D = 1024, N = patches + 1;
  const auto p = RandomBf16(static_cast<size_t>(n * patches * D), rng, -1.0f, 1.0f);
  const auto cls = RandomFloats(static_cast<size_t>(D), rng);
  const auto pos = RandomFloats(static_cast<size_t>(N * D), rng);
  auto d_p = Upload(p);
  auto d_cls = Upload(cls);
  auto d_pos = Upload(pos);
  auto d_h = DeviceBuffer<float>::Create(static_cast<size_t>(n * N * D));
  ASSERT_TRUE(d_h.ok());
  ASSERT_TRUE(ClipEmbeddingsCuda(d_p.data(), d_cls.data(), d_pos.data(), n, patches, D,
                                 d_h->data(), nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(static_cast<size_t>(n * N * D)), want(got.size());
  ASSERT_TRUE(d_h->CopyToHost(got.data()).ok());
  const auto pf = ToFloat(p);
  ClipEmbeddingsCpu(pf.data(), cls.data(), pos.data(), n, patches, D, want.data());
  EXPECT_EQ(got, want);  // one fp32 add each
  // Feature selection: "default" (skip CLS) and "full".
  for (const int64_t skip : {int64_t{1}, int64_t{0}}) {
    const int64_t count = N - skip;
    auto d_sel = NanBuffer(static_cast<size_t>(n * count * D));
    ASSERT_TRUE(
        SelectFeatureRowsCuda(d_h->data(), n, N, skip, count, D, d_sel.data(), nullptr).ok());
    std::vector<float> sel(static_cast<size_t>(n * count * D));
    SelectFeatureRowsCpu(want.data(), n, N, skip, count, D, sel.data());
    EXPECT_EQ(Download(d_sel), RoundTrip(sel)) << "skip=" << skip;
  }
  EXPECT_EQ(SelectFeatureRowsCuda(d_h->data(), n, N, 2, N - 1, D, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
