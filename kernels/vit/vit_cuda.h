// CUDA versions of vit.h's ViT plumbing (float32 pixels and residual stream, bf16 GEMM
// operands). Launcher conventions: kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_VIT_VIT_CUDA_H_
#define SLUICE_KERNELS_VIT_VIT_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels {

// PatchUnfoldCuda: PatchUnfoldCpu with bf16 cols (each pixel rounded once) whose rows are
// `col_stride` >= K = channels·P·P elements apart, the K..col_stride pad written as zeros: a
// GEMM wants 16-byte rows (ViT-L/14: K = 588, padded to 592 with a zero-padded weight).
// Errors: InvalidArgument for sizes < 1, S % P != 0, col_stride < K or null pointers;
// Internal for launch errors.
absl::Status PatchUnfoldCuda(const float* pixels, int64_t num_images, int64_t channels,
                             int64_t image_size, int64_t patch_size, int64_t col_stride,
                             bf16* cols, cudaStream_t stream);

// ClipEmbeddingsCuda: ClipEmbeddingsCpu with bf16 patches (the patch GEMM's output); class_emb,
// pos and h float32. Errors: InvalidArgument for sizes < 1 or null pointers; Internal.
absl::Status ClipEmbeddingsCuda(const bf16* patches, const float* class_emb, const float* pos,
                                int64_t num_images, int64_t num_patches, int64_t dim, float* h,
                                cudaStream_t stream);

// SelectFeatureRowsCuda: SelectFeatureRowsCpu from the float32 residual stream into bf16 (the
// projector's input), each value rounded once. Errors: InvalidArgument for sizes < 1,
// skip < 0, skip + count > positions or null pointers; Internal for launch errors.
absl::Status SelectFeatureRowsCuda(const float* hidden, int64_t num_images, int64_t positions,
                                   int64_t skip, int64_t count, int64_t dim, bf16* out,
                                   cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_VIT_VIT_CUDA_H_
