// The ViT plumbing around the encoder layers (CLIP's vision tower, "An Image is Worth 16x16
// Words", Dosovitskiy et al. 2021): patches unfolded for the patch-embedding GEMM, the class
// and position embeddings, and the selection of the hidden-state rows a VLM projects. CPU
// references, used by the CPU tower (engine/vision/clip_vision.cc) and checked against the
// CUDA versions (vit_cuda.h).
#ifndef SLUICE_KERNELS_VIT_VIT_H_
#define SLUICE_KERNELS_VIT_VIT_H_

#include <cstdint>

namespace sluice::kernels {

// PatchUnfoldCpu (im2col for a Conv2d whose kernel = stride = patch): pixels [num_images,
// channels, S, S] float32 → cols [num_images · G · G, channels · P · P] with G = S / P, patches
// in row-major grid order, each row ordered (c, ky, kx) like a conv weight [D, C, P, P], so
// patches = cols · weightᵀ. Needs S % P == 0.
void PatchUnfoldCpu(const float* pixels, int64_t num_images, int64_t channels,
                    int64_t image_size, int64_t patch_size, float* cols);

// ClipEmbeddingsCpu: h[n, 0, :] = class_emb + pos[0]; h[n, p, :] = patches[n, p − 1, :] + pos[p]
// for 1 <= p <= num_patches. patches [num_images · num_patches, dim], class_emb [dim],
// pos [num_patches + 1, dim], h [num_images · (num_patches + 1), dim], all float32.
void ClipEmbeddingsCpu(const float* patches, const float* class_emb, const float* pos,
                       int64_t num_images, int64_t num_patches, int64_t dim, float* h);

// SelectFeatureRowsCpu: LLaVA's feature selection, out[n, t, :] = hidden[n, skip + t, :] for
// t < count: hidden [num_images, positions, dim], out [num_images, count, dim]; skip = 1 drops
// CLS (strategy "default"), 0 keeps it ("full"). Needs skip + count <= positions.
void SelectFeatureRowsCpu(const float* hidden, int64_t num_images, int64_t positions,
                          int64_t skip, int64_t count, int64_t dim, float* out);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_VIT_VIT_H_
