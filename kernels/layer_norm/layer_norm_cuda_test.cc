// LayerNormCuda / AddLayerNormCuda against the CPU reference (layer_norm.h) on fresh random
// inputs, at ViT widths. Needs a GPU: part of kernels_cuda_test, skipped without a device.
#include "kernels/layer_norm/layer_norm_cuda.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/layer_norm/layer_norm.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> DownloadFloat(const DeviceBuffer<float>& buf) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> host(buf.size());
  EXPECT_TRUE(buf.CopyToHost(host.data()).ok());
  return host;
}

constexpr float kEps = 1e-5f;
// dims: CLIP ViT-B (768), ViT-L (1024), llava-tiny (32), an odd width.
const int64_t kShapes[][2] = {{17, 32}, {577, 1024}, {50, 768}, {3, 1001}};

TEST(LayerNormCudaTest, FloatOutMatchesCpuInPlace) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const auto& s : kShapes) {
    const int64_t rows = s[0], dim = s[1];
    // An offset mean, as embeddings + position embeddings have.
    const auto x = RandomFloats(static_cast<size_t>(rows * dim), rng, -2.0f, 4.0f);
    const auto w = RandomFloats(static_cast<size_t>(dim), rng, 0.5f, 1.5f);
    const auto b = RandomFloats(static_cast<size_t>(dim), rng, -0.5f, 0.5f);
    auto d_x = Upload(x);
    auto d_w = Upload(w);
    auto d_b = Upload(b);
    ASSERT_TRUE(LayerNormCuda(d_x.data(), d_w.data(), d_b.data(), d_x.data(), rows, dim, kEps,
                              nullptr)
                    .ok());
    std::vector<float> want(x.size());
    LayerNormCpu(x.data(), w.data(), b.data(), want.data(), rows, dim, kEps);
    ExpectClose(absl::StrCat("layer_norm f32 rows=", rows, " dim=", dim), DownloadFloat(d_x),
                want, 1e-5, 1e-5);
  }
}

TEST(LayerNormCudaTest, AddLayerNormMatchesCpu) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const auto& s : kShapes) {
    const int64_t rows = s[0], dim = s[1];
    const size_t n = static_cast<size_t>(rows * dim);
    const auto h = RandomFloats(n, rng, -3.0f, 3.0f);
    const auto delta = RandomBf16(n, rng, -1.0f, 1.0f);
    const auto w = RandomFloats(static_cast<size_t>(dim), rng, 0.5f, 1.5f);
    const auto b = RandomFloats(static_cast<size_t>(dim), rng, -0.5f, 0.5f);
    auto d_h = Upload(h);
    auto d_delta = Upload(delta);
    auto d_w = Upload(w);
    auto d_b = Upload(b);
    auto d_out = NanBuffer(n);
    ASSERT_TRUE(AddLayerNormCuda(d_h.data(), d_delta.data(), d_w.data(), d_b.data(),
                                 d_out.data(), rows, dim, kEps, nullptr)
                    .ok());
    std::vector<float> want_h = h, want(n);
    const auto delta_f = ToFloat(delta);
    AddLayerNormCpu(want_h.data(), delta_f.data(), w.data(), b.data(), want.data(), rows, dim,
                    kEps);
    const std::string tag = absl::StrCat("rows=", rows, " dim=", dim);
    // The residual is the same fp32 add on both sides: bit-equal.
    EXPECT_EQ(DownloadFloat(d_h), want_h) << tag;
    ExpectClose("add_layer_norm " + tag, Download(d_out), want, 1.0 / 128, 1e-5);
    // The add alone (no output), then the norm alone (no delta).
    ASSERT_TRUE(AddLayerNormCuda(d_h.data(), d_delta.data(), nullptr, nullptr, nullptr, rows,
                                 dim, kEps, nullptr)
                    .ok());
    AddLayerNormCpu(want_h.data(), delta_f.data(), nullptr, nullptr, nullptr, rows, dim, kEps);
    EXPECT_EQ(DownloadFloat(d_h), want_h) << tag;
    ASSERT_TRUE(AddLayerNormCuda(d_h.data(), nullptr, d_w.data(), nullptr, d_out.data(), rows,
                                 dim, kEps, nullptr)
                    .ok());
    AddLayerNormCpu(want_h.data(), nullptr, w.data(), nullptr, want.data(), rows, dim, kEps);
    ExpectClose("layer_norm no bias " + tag, Download(d_out), want, 1.0 / 128, 1e-5);
  }
}

TEST(LayerNormCudaTest, RejectsBadArguments) {
  SLUICE_SKIP_WITHOUT_CUDA();
  EXPECT_EQ(LayerNormCuda(nullptr, nullptr, nullptr, nullptr, 1, 0, kEps, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  float* h = nullptr;
  bf16* out = reinterpret_cast<bf16*>(16);
  EXPECT_EQ(AddLayerNormCuda(h, nullptr, nullptr, nullptr, out, 1, 8, kEps, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
