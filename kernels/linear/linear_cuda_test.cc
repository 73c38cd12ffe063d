// LinearCuda (cuBLASLt, bf16 in/out, fp32 accumulation) against LinearCpu on fresh random
// bf16 inputs. Needs a GPU (kernels_cuda_test).
#include "kernels/linear/linear_cuda.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/linear/linear.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

TEST(LinearCudaTest, MatchesCpuReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto lt = CublasLt::Create();
  ASSERT_TRUE(lt.ok()) << lt.status();
  auto rng = cuda_test::Rng();
  struct Shape {
    int64_t m, n, k;
    bool bias;
  };
  // Decode (m = 1), prefill-sized, bias epilogue, and odd sizes (unaligned leading dims).
  const Shape shapes[] = {{1, 4096, 4096, false}, {128, 4096, 4096, false}, {16, 1024, 512, true},
                          {33, 1000, 999, false}, {3, 77, 64, true},        {256, 512, 4096, true}};
  for (const Shape& s : shapes) {
    const auto x = RandomBf16(static_cast<size_t>(s.m * s.k), rng, -1.0f, 1.0f);
    const auto w = RandomBf16(static_cast<size_t>(s.n * s.k), rng, -1.0f, 1.0f);
    const auto b = RandomBf16(static_cast<size_t>(s.n), rng, -4.0f, 4.0f);
    auto d_x = Upload(x);
    auto d_w = Upload(w);
    auto d_b = Upload(b);
    auto d_y = NanBuffer(static_cast<size_t>(s.m * s.n));
    const absl::Status st = LinearCuda(**lt, d_x.data(), d_w.data(), s.bias ? d_b.data() : nullptr,
                                       d_y.data(), s.m, s.n, s.k, nullptr);
    ASSERT_TRUE(st.ok()) << st;
    const auto xf = ToFloat(x), wf = ToFloat(w), bf = ToFloat(b);
    std::vector<float> want(static_cast<size_t>(s.m * s.n));
    LinearCpu(xf.data(), wf.data(), s.bias ? bf.data() : nullptr, want.data(), s.m, s.n, s.k);
    // One bf16 rounding of the output plus fp32 accumulation-order differences.
    ExpectClose(absl::StrCat("linear m=", s.m, " n=", s.n, " k=", s.k, s.bias ? " +bias" : ""),
                Download(d_y), want, 1.0 / 128, 1e-3);
  }
}

TEST(LinearCudaTest, RejectsBadShapes) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto lt = CublasLt::Create(1 << 20);
  ASSERT_TRUE(lt.ok()) << lt.status();
  EXPECT_EQ(LinearCuda(**lt, nullptr, nullptr, nullptr, nullptr, 0, 8, 8, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
