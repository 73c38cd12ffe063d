// RMSNorm in the batch-invariant mode: RmsNormCuda and AddRmsNormCuda reduce each row in one
// CTA whose thread count and vector width follow the row width and pointer alignment only, so a
// row's bits do not depend on how many rows the call has. Checked bit for bit for a probe row
// alone and as row 0 / m - 1 of m = 7, 64, 256 rows (dims of Llama-3-8B, a tiny model, and an
// odd width on the scalar path). Needs a GPU: part of kernels_cuda_test, skipped without one.
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/rms_norm/rms_norm_cuda.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::FirstBitMismatch;
using cuda_test::RandomBf16;
using cuda_test::Upload;

TEST(RmsNormBatchInvariantTest, RowsAreBatchInvariant) {
  SLUICE_SKIP_WITHOUT_CUDA();
  std::mt19937 rng = cuda_test::Rng();
  for (int64_t dim : {4096, 64, 1001}) {
    SCOPED_TRACE(absl::StrCat("dim ", dim));
    const auto weight = Upload(RandomBf16(dim, rng, 0.5f, 1.5f));
    const auto probe_x = RandomBf16(dim, rng, -1.0f, 1.0f);
    const auto probe_res = RandomBf16(dim, rng, -4.0f, 4.0f);
    std::vector<float> alone_norm, alone_add, alone_res;
    for (int64_t m : {1, 7, 64, 256}) {
      for (int64_t at : {int64_t{0}, m - 1}) {
        auto x_host = RandomBf16(static_cast<size_t>(m * dim), rng, -1.0f, 1.0f);
        auto res_host = RandomBf16(static_cast<size_t>(m * dim), rng, -4.0f, 4.0f);
        std::copy(probe_x.begin(), probe_x.end(), x_host.begin() + at * dim);
        std::copy(probe_res.begin(), probe_res.end(), res_host.begin() + at * dim);
        auto x = Upload(x_host);
        auto res = Upload(res_host);
        auto out = cuda_test::NanBuffer(static_cast<size_t>(m * dim));
        auto out_add = cuda_test::NanBuffer(static_cast<size_t>(m * dim));
        ASSERT_TRUE(RmsNormCuda(x.data(), dim, weight.data(), out.data(), dim, m, dim, 1e-5f,
                                nullptr)
                        .ok());
        ASSERT_TRUE(
            AddRmsNormCuda(x.data(), res.data(), weight.data(), out_add.data(), m, dim, 1e-5f,
                           nullptr)
                .ok());
        auto row = [&](const std::vector<float>& v) {
          return std::vector<float>(v.begin() + at * dim, v.begin() + (at + 1) * dim);
        };
        const auto norm = row(Download(out)), add = row(Download(out_add)),
                   res_row = row(Download(res));
        if (m == 1) {
          alone_norm = norm;
          alone_add = add;
          alone_res = res_row;
          continue;
        }
        SCOPED_TRACE(absl::StrCat("m=", m, " row ", at));
        EXPECT_EQ(FirstBitMismatch(norm, alone_norm), -1);
        EXPECT_EQ(FirstBitMismatch(add, alone_add), -1);
        EXPECT_EQ(FirstBitMismatch(res_row, alone_res), -1);
      }
    }
  }
}

}  // namespace
}  // namespace sluice::kernels
