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

}  // namespace
}  // namespace sluice::kernels
