#include "services/serve/ppl_windows.h"

#include <vector>

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(PplWindowsTest, ShortSequenceIsOneWindowScoringAllButTheFirstToken) {
  EXPECT_EQ(PlanPplWindows(5, 8, 4), (std::vector<PplWindow>{{0, 5, 1}}));
  EXPECT_EQ(PlanPplWindows(8, 8, 4), (std::vector<PplWindow>{{0, 8, 1}}));
  EXPECT_TRUE(PlanPplWindows(1, 8, 4).empty());
  EXPECT_TRUE(PlanPplWindows(0, 8, 4).empty());
}

TEST(PplWindowsTest, LaterWindowsScoreStrideNewTokensWithFullContext) {
  // 20 tokens, windows of 8 scoring 3 new tokens each (context 5), the last one shorter.
  EXPECT_EQ(PlanPplWindows(20, 8, 3), (std::vector<PplWindow>{{0, 8, 1},
                                                                {3, 11, 8},
                                                                {6, 14, 11},
                                                                {9, 17, 14},
                                                                {12, 20, 17}}));
  EXPECT_EQ(PlanPplWindows(10, 8, 4), (std::vector<PplWindow>{{0, 8, 1}, {2, 10, 8}}));
  // Stride max_length - 1: one token of context.
  EXPECT_EQ(PlanPplWindows(5, 2, 1),
            (std::vector<PplWindow>{{0, 2, 1}, {1, 3, 2}, {2, 4, 3}, {3, 5, 4}}));
}

TEST(PplWindowsTest, EveryTokenAfterTheFirstIsScoredOnceWithinBounds) {
  for (int64_t n = 0; n < 70; ++n) {
    for (int64_t max_length : {2, 3, 7, 16}) {
      for (int64_t stride = 1; stride < max_length; ++stride) {
        std::vector<int> scored(static_cast<size_t>(n), 0);
        for (const PplWindow& w : PlanPplWindows(n, max_length, stride)) {
          ASSERT_GE(w.begin, 0);
          ASSERT_LE(w.end, n);
          ASSERT_LE(w.end - w.begin, max_length);
          ASSERT_LT(w.begin, w.first_scored);
          ASSERT_LT(w.first_scored, w.end);
          if (w.begin > 0) {
            ASSERT_EQ(w.end - w.begin, max_length);  // later windows are full
            ASSERT_GE(w.first_scored - w.begin, max_length - stride);
          }
          for (int64_t p = w.first_scored; p < w.end; ++p) ++scored[static_cast<size_t>(p)];
        }
        for (int64_t p = 0; p < n; ++p) {
          ASSERT_EQ(scored[static_cast<size_t>(p)], p == 0 ? 0 : 1)
              << "n=" << n << " max_length=" << max_length << " stride=" << stride
              << " p=" << p;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sluice
