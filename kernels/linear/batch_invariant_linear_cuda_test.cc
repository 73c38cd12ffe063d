// BatchInvariantLinearCuda (batch_invariant_linear.h) and LinearCuda / LinearSiluMulCuda with
// LinearOptions::batch_invariant: values against a double-precision reference, and one probe
// row's output bit for bit the same when it is computed alone (m = 1) or as row i of m-row
// batches of random other rows (m = 1, 7, 33, 64, 65, 256; the probe at several indices, so it
// lands in different 32/64-row chunks and token groups). Shapes: Llama-3-8B's projections,
// odd n, a GLU (SiLU·mul) weight. Needs a GPU: part of kernels_cuda_test, skipped without one.
#include "kernels/linear/batch_invariant_linear.h"

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/linear/linear_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::FirstBitMismatch;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

struct Shape {
  int64_t n, k;
  bool glu;
};

// Reference rows of x [rows, k] against w: the product (or SiLU(g)·u of the bf16-rounded g and
// u, LinearSiluMulCuda's formula) in double.
std::vector<float> Reference(const std::vector<float>& x, const std::vector<float>& w,
                             const std::vector<float>& bias, int64_t rows, const Shape& s) {
  const int64_t w_rows = s.glu ? 2 * s.n : s.n;
  std::vector<double> prod(static_cast<size_t>(rows * w_rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < w_rows; ++c) {
      double acc = bias.empty() ? 0.0 : bias[c];
      for (int64_t i = 0; i < s.k; ++i) acc += double{x[r * s.k + i]} * w[c * s.k + i];
      prod[r * w_rows + c] = acc;
    }
  }
  std::vector<float> out(static_cast<size_t>(rows * s.n));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < s.n; ++c) {
      if (!s.glu) {
        out[r * s.n + c] = static_cast<float>(prod[r * w_rows + c]);
        continue;
      }
      const float g = Bf16ToFloat(FloatToBf16(static_cast<float>(prod[r * w_rows + c])));
      const float u = Bf16ToFloat(FloatToBf16(static_cast<float>(prod[r * w_rows + s.n + c])));
      out[r * s.n + c] = g / (1.0f + std::exp(-g)) * u;
    }
  }
  return out;
}

class BatchInvariantLinearTest : public ::testing::TestWithParam<Shape> {};

TEST_P(BatchInvariantLinearTest, BatchInvariantRowsAndReference) {
  SLUICE_SKIP_WITHOUT_CUDA();
  const Shape s = GetParam();
  SCOPED_TRACE(absl::StrCat("n=", s.n, " k=", s.k, s.glu ? " glu" : "", " split=",
                            BatchInvariantGemmSplit(s.n, s.glu)));
  std::mt19937 rng = cuda_test::Rng();
  constexpr int64_t kMaxRows = 256;
  const int64_t w_rows = s.glu ? 2 * s.n : s.n;
  const auto w_host = RandomBf16(static_cast<size_t>(w_rows * s.k), rng, -0.05f, 0.05f);
  const auto b_host = RandomBf16(static_cast<size_t>(w_rows), rng, -0.5f, 0.5f);
  const auto probe = RandomBf16(static_cast<size_t>(s.k), rng, -1.0f, 1.0f);
  auto w = Upload(w_host);
  auto bias = Upload(b_host);

  // The probe alone.
  auto x1 = Upload(probe);
  auto y1 = NanBuffer(static_cast<size_t>(s.n));
  ASSERT_TRUE(BatchInvariantLinearCuda(x1.data(), w.data(), bias.data(), y1.data(), 1, s.n, s.k,
                                       s.glu, nullptr)
                  .ok());
  const std::vector<float> alone = Download(y1);
  ExpectClose("probe vs reference", alone,
              Reference(ToFloat(probe), ToFloat(w_host), ToFloat(b_host), 1, s), 1.0 / 64,
              1.0 / 256);

  for (int64_t m : {1, 7, 33, 64, 65, 256}) {
    for (int64_t at : {int64_t{0}, m / 2, m - 1}) {
      SCOPED_TRACE(absl::StrCat("m=", m, " probe row ", at));
      auto x_host = RandomBf16(static_cast<size_t>(m * s.k), rng, -1.0f, 1.0f);
      std::copy(probe.begin(), probe.end(), x_host.begin() + at * s.k);
      auto x = Upload(x_host);
      auto y = NanBuffer(static_cast<size_t>(m * s.n));
      ASSERT_TRUE(BatchInvariantLinearCuda(x.data(), w.data(), bias.data(), y.data(), m, s.n,
                                           s.k, s.glu, nullptr)
                      .ok());
      const std::vector<float> all = Download(y);
      const std::vector<float> row(all.begin() + at * s.n, all.begin() + (at + 1) * s.n);
      EXPECT_EQ(FirstBitMismatch(row, alone), -1);
      if (m == 7 && at == 0) {  // every row of one batch against the reference
        ExpectClose("m=7 vs reference", all,
                    Reference(ToFloat(x_host), ToFloat(w_host), ToFloat(b_host), m, s), 1.0 / 64,
                    1.0 / 256);
      }
      if (m == kMaxRows) break;  // one placement of the largest batch keeps the test short
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchInvariantLinearTest,
                         ::testing::Values(Shape{4096, 4096, false},   // o_proj: split 8
                                           Shape{6144, 4096, false},   // qkv: split 8
                                           Shape{14336, 4096, true},   // gate/up SiLU·mul
                                           Shape{1000, 520, false},    // ragged n and k blocks
                                           Shape{50000, 256, false}),  // lm_head-like: split 1
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return absl::StrCat("n", info.param.n, "_k", info.param.k,
                                               info.param.glu ? "_glu" : "");
                         });

// LinearCuda and LinearSiluMulCuda of a CublasLt created with LinearOptions::batch_invariant
// run BatchInvariantLinearCuda: the same bits, at every m, no cuBLASLt plan and no tuning
// (set_autotune is ignored by the mode).
TEST(BatchInvariantLinearTest, CublasLtInModeDispatchesToTheInvariantGemm) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  LinearOptions options;
  options.batch_invariant = true;
  auto lt = CublasLt::Create(CublasLt::kDefaultWorkspaceBytes, options);
  ASSERT_TRUE(lt.ok()) << lt.status();
  (*lt)->set_autotune(256);
  const int64_t n = 2048, k = 1024, inter = 1024;
  auto w = Upload(RandomBf16(static_cast<size_t>(n * k), rng, -0.05f, 0.05f));
  for (int64_t m : {1, 8, 64, 200}) {
    SCOPED_TRACE(absl::StrCat("m=", m));
    auto x = Upload(RandomBf16(static_cast<size_t>(m * k), rng, -1.0f, 1.0f));
    auto got = NanBuffer(static_cast<size_t>(m * n));
    auto want = NanBuffer(static_cast<size_t>(m * n));
    ASSERT_TRUE(LinearCuda(**lt, x.data(), w.data(), nullptr, got.data(), m, n, k, nullptr).ok());
    ASSERT_TRUE(
        BatchInvariantLinearCuda(x.data(), w.data(), nullptr, want.data(), m, n, k, false, nullptr)
            .ok());
    EXPECT_EQ(FirstBitMismatch(Download(got), Download(want)), -1);
    auto gate_up = NanBuffer(static_cast<size_t>(m * 2 * inter));
    auto glu_got = NanBuffer(static_cast<size_t>(m * inter));
    auto glu_want = NanBuffer(static_cast<size_t>(m * inter));
    ASSERT_TRUE(LinearSiluMulCuda(**lt, x.data(), w.data(), nullptr, gate_up.data(),
                                  glu_got.data(), m, inter, k, nullptr)
                    .ok());
    ASSERT_TRUE(BatchInvariantLinearCuda(x.data(), w.data(), nullptr, glu_want.data(), m, inter,
                                         k, true, nullptr)
                    .ok());
    EXPECT_EQ(FirstBitMismatch(Download(glu_got), Download(glu_want)), -1);
  }
  EXPECT_EQ((*lt)->DescribePlans(), "");  // no cuBLASLt plan was made
}

TEST(BatchInvariantLinearTest, SplitIsAShapeRule) {
  // Llama-3-8B: qkv, o, gate/up (GLU), down, lm_head.
  EXPECT_EQ(BatchInvariantGemmSplit(6144, false), 8);
  EXPECT_EQ(BatchInvariantGemmSplit(4096, false), 8);
  EXPECT_EQ(BatchInvariantGemmSplit(14336, true), 2);
  EXPECT_EQ(BatchInvariantGemmSplit(128256, false), 1);
  // LinearOptions::batch_invariant_target_ctas 64: the 4,096/6,144-column projections at split 4.
  EXPECT_EQ(BatchInvariantGemmSplit(4096, false, 64), 4);
  EXPECT_EQ(BatchInvariantGemmSplit(6144, false, 64), 4);
  EXPECT_EQ(BatchInvariantChunkRows(8), 32);
  EXPECT_EQ(BatchInvariantChunkRows(2), 64);
}

TEST(BatchInvariantLinearTest, RejectsUnservedOperands) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto x = NanBuffer(64);
  auto w = NanBuffer(64);
  auto y = NanBuffer(64);
  const absl::Status odd_k =
      BatchInvariantLinearCuda(x.data(), w.data(), nullptr, y.data(), 1, 4, 12, false, nullptr);
  EXPECT_EQ(odd_k.code(), absl::StatusCode::kInvalidArgument) << odd_k;
  EXPECT_NE(odd_k.message().find("k=12"), std::string::npos) << odd_k;
  EXPECT_EQ(BatchInvariantLinearCuda(x.data() + 1, w.data(), nullptr, y.data(), 1, 4, 16, false,
                                     nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      BatchInvariantLinearCuda(x.data(), w.data(), nullptr, y.data(), 0, 4, 16, false, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
