// DenseAttention: non-causal multi-head attention over dense, equally long sequences (the
// self-attention of ViT encoders), on the CUDA backend — the device counterpart of
// kernels/attention/bidirectional_attention.h's BidirectionalAttentionCpu. Per sequence, all
// heads at once:
//   S = Q·Kᵀ        cuBLAS strided-batched GEMM (BatchedGemm), fp32 scores
//   P = softmax(scale·S)   kernels/softmax (fp32 math, bf16 P)
//   O = P·V         BatchedGemm, fp32 accumulation, bf16 out
// The paged prefill kernels are causal over a paged KV cache; a ViT's sequences are short
// (577 positions for CLIP-L/14-336), so the [heads, L, L] scores fit in a scratch buffer and
// both products run on tensor cores through cuBLAS.
#ifndef SLUICE_ENGINE_CUDA_DENSE_ATTENTION_H_
#define SLUICE_ENGINE_CUDA_DENSE_ATTENTION_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/batched_gemm.h"
#include "kernels/attention/bidirectional_attention.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::cuda_runner {

class DenseAttention {
 public:
  // Create binds a cuBLAS handle to `stream`. Errors: Internal for cuBLAS/CUDA failures.
  static absl::StatusOr<std::unique_ptr<DenseAttention>> Create(cudaStream_t stream);

  // Run enqueues out = softmax(scale · q·kᵀ) · v per sequence and head on the stream:
  //   q, k, v: bf16 [num_sequences · seq_len, num_heads · head_dim], row stride `row_stride`
  //            elements (column slices of one fused qkv buffer, as BidirectionalAttentionCpu);
  //   out:     bf16 [num_sequences · seq_len, num_heads · head_dim], contiguous.
  // The scores scratch ([num_heads, seq_len, seq_len] fp32 + bf16) grows on first use of a
  // larger shape (a cudaMalloc: not inside stream capture). Not thread-safe.
  // Errors: InvalidArgument for sizes < 1 or a row_stride shorter than num_heads · head_dim;
  // those of BatchedGemm and the softmax launch; Internal for allocation failures.
  absl::Status Run(const kernels::bf16* q, const kernels::bf16* k, const kernels::bf16* v,
                   int64_t row_stride, const kernels::BidirectionalAttentionParams& params,
                   kernels::bf16* out);

 private:
  DenseAttention() = default;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<BatchedGemm> gemm_;
  kernels::DeviceBuffer<float> scores_;
  kernels::DeviceBuffer<kernels::bf16> probs_;
};

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_DENSE_ATTENTION_H_
