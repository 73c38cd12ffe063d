// EmbeddingCuda against EmbeddingCpu on fresh random tables and ids. Needs a GPU
// (kernels_cuda_test).
#include "kernels/embedding/embedding_cuda.h"

#include <climits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/embedding/embedding.h"

namespace sluice::kernels {
namespace {

using cuda_test::Download;
using cuda_test::ExpectClose;
using cuda_test::NanBuffer;
using cuda_test::RandomBf16;
using cuda_test::ToFloat;
using cuda_test::Upload;

TEST(EmbeddingCudaTest, MatchesCpuReferenceExactly) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t shapes[][3] = {{1000, 64, 1}, {32000, 4096, 37}, {500, 13, 300}, {128, 2048, 7}};
  for (const auto& shape : shapes) {
    const int64_t vocab = shape[0], dim = shape[1], tokens = shape[2];
    const auto table = RandomBf16(static_cast<size_t>(vocab * dim), rng, -1.0f, 1.0f);
    std::uniform_int_distribution<int32_t> id_dist(0, static_cast<int32_t>(vocab - 1));
    std::vector<int32_t> ids(static_cast<size_t>(tokens));
    for (auto& id : ids) id = id_dist(rng);
    ids[0] = static_cast<int32_t>(vocab - 1);  // last row
    auto d_table = Upload(table);
    auto d_ids = Upload(ids);
    auto d_out = NanBuffer(static_cast<size_t>(tokens * dim));
    auto d_bad = Upload(std::vector<int32_t>{INT32_MAX});
    ASSERT_TRUE(EmbeddingCuda(d_table.data(), vocab, dim, d_ids.data(), tokens, d_out.data(),
                              d_bad.data(), nullptr)
                    .ok());
    const auto table_f = ToFloat(table);
    std::vector<float> want(static_cast<size_t>(tokens * dim));
    ASSERT_TRUE(EmbeddingCpu(table_f.data(), vocab, dim, ids.data(), tokens, want.data()).ok());
    ExpectClose(absl::StrCat("embedding vocab=", vocab, " dim=", dim, " tokens=", tokens),
                Download(d_out), want, 0.0, 0.0);
    int32_t bad = 0;
    ASSERT_EQ(cudaMemcpy(&bad, d_bad.data(), sizeof(bad), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(bad, INT32_MAX);
  }
}

TEST(EmbeddingCudaTest, ReportsFirstOutOfRangeIdAndZeroFillsItsRow) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t vocab = 100, dim = 64;
  const auto table = RandomBf16(static_cast<size_t>(vocab * dim), rng, -1.0f, 1.0f);
  const std::vector<int32_t> ids = {5, 99, 100, 7, -1, 0};
  auto d_table = Upload(table);
  auto d_ids = Upload(ids);
  auto d_out = NanBuffer(ids.size() * dim);
  auto d_bad = Upload(std::vector<int32_t>{INT32_MAX});
  ASSERT_TRUE(EmbeddingCuda(d_table.data(), vocab, dim, d_ids.data(),
                            static_cast<int64_t>(ids.size()), d_out.data(), d_bad.data(), nullptr)
                  .ok());
  const auto got = Download(d_out);
  int32_t bad = 0;
  ASSERT_EQ(cudaMemcpy(&bad, d_bad.data(), sizeof(bad), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(bad, 2);
  const auto table_f = ToFloat(table);
  for (size_t t = 0; t < ids.size(); ++t) {
    const bool valid = ids[t] >= 0 && ids[t] < vocab;
    for (int64_t j = 0; j < dim; ++j) {
      const float want = valid ? table_f[static_cast<size_t>(ids[t] * dim + j)] : 0.0f;
      ASSERT_EQ(got[t * dim + j], want) << "token " << t << " channel " << j;
    }
  }
  // The CPU reference rejects the same ids.
  std::vector<float> cpu_out(ids.size() * dim);
  EXPECT_EQ(EmbeddingCpu(table_f.data(), vocab, dim, ids.data(), static_cast<int64_t>(ids.size()),
                         cpu_out.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// EmbeddingFeedbackCuda: negative ids -(r + 1) become feedback[r] (written back to ids) and
// gather that row, bit-exact with EmbeddingCpu on the resolved ids; other ids are untouched.
// Llama-3-8B's width (one 16-byte vector per thread) and an odd width (scalar path).
TEST(EmbeddingCudaTest, FeedbackIdsResolveInTheGather) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  for (const int64_t dim : {int64_t{4096}, int64_t{13}}) {
    const int64_t vocab = 300;
    const auto table = RandomBf16(static_cast<size_t>(vocab * dim), rng, -1.0f, 1.0f);
    const std::vector<int32_t> feedback = {17, 299, 0};
    const std::vector<int32_t> ids = {-2, 5, -1, -3, 299, -2};
    const std::vector<int32_t> resolved = {299, 5, 17, 0, 299, 299};
    const int64_t tokens = static_cast<int64_t>(ids.size());
    auto d_table = Upload(table);
    auto d_ids = Upload(ids);
    auto d_feedback = Upload(feedback);
    auto d_out = NanBuffer(static_cast<size_t>(tokens * dim));
    auto d_bad = Upload(std::vector<int32_t>{INT32_MAX});
    ASSERT_TRUE(EmbeddingFeedbackCuda(d_table.data(), vocab, dim, d_ids.data(),
                                      d_feedback.data(), tokens, d_out.data(), d_bad.data(),
                                      nullptr)
                    .ok());
    std::vector<int32_t> got_ids(ids.size());
    ASSERT_EQ(cudaMemcpy(got_ids.data(), d_ids.data(), got_ids.size() * sizeof(int32_t),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(got_ids, resolved);
    const auto table_f = ToFloat(table);
    std::vector<float> want(static_cast<size_t>(tokens * dim));
    ASSERT_TRUE(
        EmbeddingCpu(table_f.data(), vocab, dim, resolved.data(), tokens, want.data()).ok());
    ExpectClose(absl::StrCat("embedding feedback dim=", dim), Download(d_out), want, 0.0, 0.0);
    int32_t bad = 0;
    ASSERT_EQ(cudaMemcpy(&bad, d_bad.data(), sizeof(bad), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(bad, INT32_MAX);
  }
  EXPECT_EQ(EmbeddingFeedbackCuda(nullptr, 10, 8, nullptr, nullptr, 1, nullptr, nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// ScatterRowsCuda against ScatterRowsCpu rounded to bf16: bitwise, rows in any order, the
// untouched rows keep the gathered embeddings; the vector (dim % 8 == 0, LLaVA-1.5's 4096) and
// scalar paths.
TEST(ScatterRowsCudaTest, MatchesCpuReferenceExactly) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t shapes[][2] = {{64, 30}, {4096, 600}, {13, 9}, {4104, 3}};  // dim, tokens
  for (const auto& shape : shapes) {
    const int64_t dim = shape[0], tokens = shape[1];
    const auto base = RandomBf16(static_cast<size_t>(tokens * dim), rng, -1.0f, 1.0f);
    // Every third token, last first, then token 1 (a chunk inside and at the ends of a run).
    std::vector<int32_t> rows;
    for (int64_t t = tokens - 1; t >= 0; t -= 3) rows.push_back(static_cast<int32_t>(t));
    if (tokens > 1 && (tokens - 1 - 1) % 3 != 0) rows.push_back(1);
    const int64_t n = static_cast<int64_t>(rows.size());
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    std::vector<float> values(static_cast<size_t>(n * dim));
    for (float& v : values) v = dist(rng);
    auto d_out = Upload(base);
    auto d_rows = Upload(rows);
    auto d_values = Upload(values);
    ASSERT_TRUE(ScatterRowsCuda(d_values.data(), d_rows.data(), n, dim, d_out.data(), tokens,
                                nullptr)
                    .ok());
    std::vector<float> want = ToFloat(base);
    ASSERT_TRUE(ScatterRowsCpu(values.data(), rows.data(), n, dim, want.data(), tokens).ok());
    for (float& v : want) v = Bf16ToFloat(FloatToBf16(v));
    ExpectClose(absl::StrCat("scatter rows dim=", dim, " tokens=", tokens, " rows=", n),
                Download(d_out), want, 0.0, 0.0);
  }
}

TEST(ScatterRowsCudaTest, SkipsRowsOutsideTheStep) {
  SLUICE_SKIP_WITHOUT_CUDA();
  auto rng = cuda_test::Rng();
  const int64_t dim = 16, tokens = 4;
  const auto base = RandomBf16(static_cast<size_t>(tokens * dim), rng, -1.0f, 1.0f);
  const std::vector<int32_t> rows = {4, -1, 2};
  const std::vector<float> values(3 * dim, 0.5f);
  auto d_out = Upload(base);
  auto d_rows = Upload(rows);
  auto d_values = Upload(values);
  ASSERT_TRUE(
      ScatterRowsCuda(d_values.data(), d_rows.data(), 3, dim, d_out.data(), tokens, nullptr).ok());
  std::vector<float> want = ToFloat(base);
  for (int64_t j = 0; j < dim; ++j) want[static_cast<size_t>(2 * dim + j)] = 0.5f;
  ExpectClose("scatter rows outside", Download(d_out), want, 0.0, 0.0);
  EXPECT_EQ(ScatterRowsCuda(d_values.data(), d_rows.data(), 1, 0, d_out.data(), tokens, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::kernels
