#include <vector>

#include <gtest/gtest.h>

#include "kernels/embedding/embedding.h"

namespace sluice::kernels {
namespace {

TEST(EmbeddingTest, CopiesRows) {
  const int64_t vocab = 5, dim = 3;
  std::vector<float> table(vocab * dim);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i);
  const int32_t ids[] = {4, 0, 4, 2};
  std::vector<float> out(4 * dim);
  ASSERT_TRUE(EmbeddingCpu(table.data(), vocab, dim, ids, 4, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{12, 13, 14, 0, 1, 2, 12, 13, 14, 6, 7, 8}));
}

TEST(EmbeddingTest, RejectsOutOfRangeIds) {
  const std::vector<float> table(10, 1.0f);
  std::vector<float> out(4);
  for (int32_t bad : {5, -1}) {
    const int32_t ids[] = {1, bad};
    absl::Status s = EmbeddingCpu(table.data(), 5, 2, ids, 2, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("token id " + std::to_string(bad)), std::string::npos) << s;
  }
}

TEST(ScatterRowsTest, OverwritesTheNamedRowsOnly) {
  const int64_t dim = 2;
  std::vector<float> out = {0, 1, 2, 3, 4, 5, 6, 7};  // 4 tokens
  const std::vector<float> values = {10, 11, 20, 21};
  const int32_t rows[] = {3, 1};
  ASSERT_TRUE(ScatterRowsCpu(values.data(), rows, 2, dim, out.data(), 4).ok());
  EXPECT_EQ(out, (std::vector<float>{0, 1, 20, 21, 4, 5, 10, 11}));
  EXPECT_TRUE(ScatterRowsCpu(values.data(), rows, 0, dim, out.data(), 4).ok());
}

TEST(ScatterRowsTest, RejectsRowsOutsideTheStepOrNamedTwice) {
  std::vector<float> out(8);
  const std::vector<float> values(6, 1.0f);
  const int32_t outside[] = {0, 4};
  absl::Status s = ScatterRowsCpu(values.data(), outside, 2, 2, out.data(), 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "input embedding 1: row 4 is outside [0, 4)");
  const int32_t negative[] = {-1};
  EXPECT_EQ(ScatterRowsCpu(values.data(), negative, 1, 2, out.data(), 4).code(),
            absl::StatusCode::kInvalidArgument);
  const int32_t twice[] = {2, 0, 2};
  s = ScatterRowsCpu(values.data(), twice, 3, 2, out.data(), 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "input embedding 2: row 2 is named twice");
}

}  // namespace
}  // namespace sluice::kernels
