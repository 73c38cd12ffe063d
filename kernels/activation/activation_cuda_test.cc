// SiluMulCuda, GeluCuda and QuickGeluCuda against their CPU references on fresh random bf16
// inputs. Needs a GPU (kernels_cuda_test).
#include "kernels/activation/activation_cuda.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/activation/activation.h"
#include "kernels/cuda/cuda_test_util.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

TEST(SiluMulCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  // Vector path (d % 8 == 0), scalar path (odd d), and > 65535 rows (grid split).
  const int64_t shapes[][2] = {{1, 8}, {5, 13}, {64, 1408}, {3, 14336}, {17, 11008}, {70000, 8}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], d = shape[1];
    const auto gate_up = RandomBf16(static_cast<size_t>(rows * 2 * d), rng, -8.0f, 8.0f);
    auto d_in = Upload(gate_up);
    auto d_out = NanBuffer(static_cast<size_t>(rows * d));
    ASSERT_TRUE(SiluMulCuda(d_in.data(), d_out.data(), rows, d, nullptr).ok());
    const auto in_f = ToFloat(gate_up);
    std::vector<float> want(static_cast<size_t>(rows * d));
    SiluMulCpu(in_f.data(), want.data(), rows, d);
    ExpectClose(absl::StrCat("silu_mul rows=", rows, " d=", d), Download(d_out), want, 1.0 / 128,
                1e-5);
  }
}

TEST(SiluMulCudaTest, RejectsBadShapes) {
  SLUICE_SKIP_WITHOUT_CUDA();
  EXPECT_EQ(SiluMulCuda(nullptr, nullptr, 1, 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SiluMulCuda(nullptr, nullptr, -1, 8, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GeluCudaTest, MatchCpuReferences) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  // Vector path (n % 8 == 0), scalar path, and in place.
  for (const int64_t n : {int64_t{8}, int64_t{1001}, int64_t{577} * 4096}) {
    const auto x = RandomBf16(static_cast<size_t>(n), rng, -6.0f, 6.0f);
    const auto xf = ToFloat(x);
    std::vector<float> gelu(xf.size()), quick(xf.size());
    GeluCpu(xf.data(), gelu.data(), n);
    QuickGeluCpu(xf.data(), quick.data(), n);
    auto d_x = Upload(x);
    auto d_out = NanBuffer(static_cast<size_t>(n));
    ASSERT_TRUE(GeluCuda(d_x.data(), d_out.data(), n, nullptr).ok());
    ExpectClose(absl::StrCat("gelu n=", n), Download(d_out), gelu, 1.0 / 128, 1e-5);
    ASSERT_TRUE(QuickGeluCuda(d_x.data(), d_x.data(), n, nullptr).ok());  // in place
    ExpectClose(absl::StrCat("quick_gelu n=", n), Download(d_x), quick, 1.0 / 128, 1e-5);
  }
  EXPECT_EQ(GeluCuda(nullptr, nullptr, -1, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
