// The CUDA vision backend of VisionEncoder (engine/vision/vision_backend.h): LLaVA's CLIP
// vision tower, feature selection and projector on one GPU — the same math as the CPU tower
// (engine/vision/clip_vision.h) with bf16 weights and GEMM operands, fp32 accumulation and an
// fp32 residual stream:
//   cols     = unfold(pixel_values)                  kernels/vit (bf16)
//   patches  = cols · patch_weightᵀ                  LinearCuda (cuBLASLt)
//   h_0      = pre_LN([CLS; patches] + pos)          kernels/vit, kernels/layer_norm (fp32)
//   per layer: x = LN1(h); h += out_proj(attn(qkv(x)));  x = LN2(h); h += fc2(act(fc1(x)))
//            (LinearCuda with biases, DenseAttention, Gelu/QuickGeluCuda, AddLayerNormCuda)
//   features = select(h_layer) → linear_2(act(linear_1(features)))
// Images are encoded max_batch_images at a time on the backend's own stream; calls are
// serialized (one set of activations), and each returns after its results reached the host.
#ifndef SLUICE_ENGINE_CUDA_CUDA_VISION_H_
#define SLUICE_ENGINE_CUDA_CUDA_VISION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/dummy_weights.h"
#include "engine/vision/llava_config.h"
#include "engine/vision/vision_backend.h"

namespace sluice::cuda_runner {

struct CudaVisionOptions {
  int device = 0;  // CUDA device ordinal
  // Images per tower pass: activations are allocated for this many at load (ViT-L/14-336 with
  // a 4096-wide projector: about 25 MiB an image); larger calls run in passes.
  int64_t max_batch_images = 8;
  // Dummy weights (engine/model/dummy_weights.h: LayerNorm weights 1, biases 0, other tensors
  // normal(0, 0.02²)) instead of the folder's safetensors: benchmarks at real shapes from a
  // config.json alone.
  bool dummy_weights = false;
  uint64_t dummy_seed = kDefaultDummySeed;
};

// LoadCudaVisionBackend: the tower's first FeatureLayerIndex() layers and the projector of the
// LLaVA folder `dir` (both checkpoint layouts, as the CPU backend) on options.device.
// Errors: InvalidArgument for options out of range or an unsupported config (hidden size not
// divisible by the heads); those of LoadWeight (naming the tensor); Internal for CUDA/cuBLAS
// failures (no device, out of memory).
absl::StatusOr<std::unique_ptr<vision::VisionBackend>> LoadCudaVisionBackend(
    const std::string& dir, const vision::LlavaConfig& config, const CudaVisionOptions& options);

// CudaVisionBackendFactory: LoadCudaVisionBackend with `options`, for VisionEncoder::Load.
vision::VisionBackendFactory CudaVisionBackendFactory(const CudaVisionOptions& options);

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_CUDA_VISION_H_
