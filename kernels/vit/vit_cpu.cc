#include <cstring>

#include "kernels/vit/vit.h"

namespace sluice::kernels {

void PatchUnfoldCpu(const float* pixels, int64_t num_images, int64_t channels,
                    int64_t image_size, int64_t patch_size, float* cols) {
  const int64_t S = image_size, P = patch_size, G = S / P, K = channels * P * P;
  for (int64_t n = 0; n < num_images; ++n) {
    const float* img = pixels + n * channels * S * S;
    for (int64_t gy = 0; gy < G; ++gy) {
      for (int64_t gx = 0; gx < G; ++gx) {
        float* col = cols + ((n * G + gy) * G + gx) * K;
        for (int64_t ch = 0; ch < channels; ++ch) {
          for (int64_t ky = 0; ky < P; ++ky) {
            std::memcpy(col + (ch * P + ky) * P, img + (ch * S + gy * P + ky) * S + gx * P,
                        static_cast<size_t>(P) * sizeof(float));
          }
        }
      }
    }
  }
}

void ClipEmbeddingsCpu(const float* patches, const float* class_emb, const float* pos,
                       int64_t num_images, int64_t num_patches, int64_t dim, float* h) {
  const int64_t N = num_patches + 1;
  for (int64_t n = 0; n < num_images; ++n) {
    for (int64_t p = 0; p < N; ++p) {
      const float* src = p == 0 ? class_emb : patches + (n * num_patches + p - 1) * dim;
      float* dst = h + (n * N + p) * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] = src[d] + pos[p * dim + d];
    }
  }
}

void SelectFeatureRowsCpu(const float* hidden, int64_t num_images, int64_t positions,
                          int64_t skip, int64_t count, int64_t dim, float* out) {
  for (int64_t n = 0; n < num_images; ++n) {
    std::memcpy(out + n * count * dim, hidden + (n * positions + skip) * dim,
                static_cast<size_t>(count * dim) * sizeof(float));
  }
}

}  // namespace sluice::kernels
