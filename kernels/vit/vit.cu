// CUDA ViT plumbing: elementwise gathers, one thread per output element (they run once per
// image batch, next to 24 layers of GEMMs).
#include "absl/strings/str_cat.h"
#include "kernels/vit/vit_cuda.h"

namespace sluice::kernels {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// One thread per element of cols [n·G·G, col_stride]; consecutive threads walk kx, so both the
// pixel reads (a patch row) and the writes are contiguous. Columns >= K are the zero pad.
__global__ void PatchUnfoldKernel(const float* __restrict__ pixels, int64_t total, int channels,
                                  int S, int P, int64_t col_stride, bf16* __restrict__ cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int G = S / P;
  const int64_t K = static_cast<int64_t>(channels) * P * P;
  const int64_t row = i / col_stride;
  const int64_t k = i - row * col_stride;
  if (k >= K) {
    cols[i] = __float2bfloat16_rn(0.0f);
    return;
  }
  const int ch = static_cast<int>(k / (P * P)), ky = static_cast<int>(k / P) % P,
            kx = static_cast<int>(k % P);
  const int64_t n = row / (G * G);
  const int g = static_cast<int>(row - n * G * G), gy = g / G, gx = g % G;
  const float v = pixels[((n * channels + ch) * S + gy * P + ky) * S + gx * P + kx];
  cols[i] = __float2bfloat16_rn(v);
}

__global__ void ClipEmbeddingsKernel(const bf16* __restrict__ patches,
                                     const float* __restrict__ class_emb,
                                     const float* __restrict__ pos, int64_t total,
                                     int64_t num_patches, int64_t dim, float* __restrict__ h) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t N = num_patches + 1;
  const int64_t row = i / dim, d = i - row * dim;
  const int64_t n = row / N, p = row - n * N;
  const float src =
      p == 0 ? class_emb[d] : __bfloat162float(patches[(n * num_patches + p - 1) * dim + d]);
  h[i] = src + pos[p * dim + d];
}

__global__ void SelectFeatureRowsKernel(const float* __restrict__ hidden, int64_t total,
                                        int64_t positions, int64_t skip, int64_t count,
                                        int64_t dim, bf16* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t row = i / dim, d = i - row * dim;
  const int64_t n = row / count, t = row - n * count;
  out[i] = __float2bfloat16_rn(hidden[(n * positions + skip + t) * dim + d]);
}

bool GridFits(int64_t total) { return (total + kThreads - 1) / kThreads <= 0x7fffffff; }

}  // namespace

absl::Status PatchUnfoldCuda(const float* pixels, int64_t num_images, int64_t channels,
                             int64_t image_size, int64_t patch_size, int64_t col_stride,
                             bf16* cols, cudaStream_t stream) {
  if (num_images < 1 || channels < 1 || patch_size < 1 || image_size < patch_size ||
      image_size % patch_size != 0 || image_size > 65536 ||
      col_stride < channels * patch_size * patch_size || pixels == nullptr || cols == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PatchUnfoldCuda: bad arguments images=", num_images, " channels=", channels,
        " image_size=", image_size, " patch_size=", patch_size, " col_stride=", col_stride));
  }
  const int64_t grid = image_size / patch_size;
  const int64_t total = num_images * grid * grid * col_stride;
  if (!GridFits(total)) return absl::InvalidArgumentError("PatchUnfoldCuda: too many pixels");
  PatchUnfoldKernel<<<Blocks(total), kThreads, 0, stream>>>(
      pixels, total, static_cast<int>(channels), static_cast<int>(image_size),
      static_cast<int>(patch_size), col_stride, cols);
  return CudaLaunchStatus("PatchUnfoldCuda");
}

absl::Status ClipEmbeddingsCuda(const bf16* patches, const float* class_emb, const float* pos,
                                int64_t num_images, int64_t num_patches, int64_t dim, float* h,
                                cudaStream_t stream) {
  if (num_images < 1 || num_patches < 1 || dim < 1 || patches == nullptr ||
      class_emb == nullptr || pos == nullptr || h == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClipEmbeddingsCuda: bad arguments images=", num_images, " patches=", num_patches,
        " dim=", dim));
  }
  const int64_t total = num_images * (num_patches + 1) * dim;
  if (!GridFits(total)) return absl::InvalidArgumentError("ClipEmbeddingsCuda: too large");
  ClipEmbeddingsKernel<<<Blocks(total), kThreads, 0, stream>>>(patches, class_emb, pos, total,
                                                               num_patches, dim, h);
  return CudaLaunchStatus("ClipEmbeddingsCuda");
}

absl::Status SelectFeatureRowsCuda(const float* hidden, int64_t num_images, int64_t positions,
                                   int64_t skip, int64_t count, int64_t dim, bf16* out,
                                   cudaStream_t stream) {
  if (num_images < 1 || count < 1 || dim < 1 || skip < 0 || skip + count > positions ||
      hidden == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SelectFeatureRowsCuda: bad arguments images=", num_images, " positions=", positions,
        " skip=", skip, " count=", count, " dim=", dim));
  }
  const int64_t total = num_images * count * dim;
  if (!GridFits(total)) return absl::InvalidArgumentError("SelectFeatureRowsCuda: too large");
  SelectFeatureRowsKernel<<<Blocks(total), kThreads, 0, stream>>>(hidden, total, positions, skip,
                                                                  count, dim, out);
  return CudaLaunchStatus("SelectFeatureRowsCuda");
}

}  // namespace sluice::kernels
