#include "kernels/vit/vit.h"

#include <vector>

#include <gtest/gtest.h>

namespace sluice::kernels {
namespace {

TEST(VitTest, PatchUnfoldOrdersRowsLikeTheConvWeight) {
  // 2 images, 3 channels, 4x4 pixels, patch 2: pixel value = its flat index.
  const int64_t n = 2, C = 3, S = 4, P = 2, G = 2, K = C * P * P;
  std::vector<float> pixels(n * C * S * S);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i);
  std::vector<float> cols(n * G * G * K, -1.0f);
  PatchUnfoldCpu(pixels.data(), n, C, S, P, cols.data());
  // Image 1, patch (gy 1, gx 0) = row 1·4 + 2 = 6; element (c 2, ky 1, kx 1) = 2·4 + 1·2 + 1.
  // Pixel: image 1, channel 2, y = 1·2 + 1 = 3, x = 0·2 + 1 = 1.
  EXPECT_EQ(cols[6 * K + 11], static_cast<float>(((1 * C + 2) * S + 3) * S + 1));
  // Image 0, patch (0, 1), element (c 0, ky 0, kx 0): pixel (0, 0, 0, 2).
  EXPECT_EQ(cols[1 * K + 0], 2.0f);
  for (float v : cols) EXPECT_GE(v, 0.0f);  // every element written
}

TEST(VitTest, ClipEmbeddingsPutsClassFirstAndAddsPositions) {
  const int64_t n = 2, patches = 3, D = 2;
  std::vector<float> p(n * patches * D);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i);  // 0..11
  const std::vector<float> cls = {100, 200};
  const std::vector<float> pos = {1, 2, 3, 4, 5, 6, 7, 8};  // [4, 2]
  std::vector<float> h(n * (patches + 1) * D);
  ClipEmbeddingsCpu(p.data(), cls.data(), pos.data(), n, patches, D, h.data());
  const std::vector<float> want = {101, 202, 3, 5, 7, 9, 11, 13,     // image 0
                                   101, 202, 9, 11, 13, 15, 17, 19};  // image 1
  EXPECT_EQ(h, want);
}

TEST(VitTest, SelectFeatureRowsDropsClass) {
  const std::vector<float> hidden = {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};  // [2, 3, 2]
  std::vector<float> out(2 * 2 * 2);
  SelectFeatureRowsCpu(hidden.data(), 2, 3, 1, 2, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{2, 3, 4, 5, 12, 13, 14, 15}));
  std::vector<float> all(hidden.size());
  SelectFeatureRowsCpu(hidden.data(), 2, 3, 0, 3, 2, all.data());
  EXPECT_EQ(all, hidden);
}

}  // namespace
}  // namespace sluice::kernels
