// Batch-invariant MLA (DeepSeek-V2/V3) attention pieces for the CUDA DeepSeek runner's
// batch-invariant mode (CudaRunnerOptions::batch_invariant): the absorbed-form latent attention
// and the per-head query absorption (W_UK) and value up-projection (W_UV), each computing a
// row's values in an order fixed by the model's dims alone — not by the step's token count,
// the batch or how a prompt was chunked (the default kernels pick split-KV plans, GEMV vs
// batched-GEMM forms and cuBLAS algorithms by token count).
//
// MlaLatentAttentionInvariantCuda is the batch-invariant paged attention
// (kernels/attention/paged_attention_invariant.h: keys cut at absolute positions that are
// multiples of kBatchInvariantSplitKeys, fixed warp/key assignment, splits merged in order) with
// one shared KV head whose key is the cached latent row [R + dr] and whose value is its first R
// channels. HeadGemmInvariantCuda gives each output element one warp that sums its k terms
// lane-strided (lane l takes k ≡ l mod 32 in increasing order) and then a butterfly over the
// 32 lanes: the order depends on k alone. Launcher conventions: kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_MLA_ATTENTION_MLA_INVARIANT_CUDA_H_
#define SLUICE_KERNELS_MLA_ATTENTION_MLA_INVARIANT_CUDA_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/mla_attention/mla_attention.h"

namespace sluice::kernels {

// Workspace of MlaLatentAttentionInvariantCuda for these bounds (0 for invalid dims).
size_t MlaLatentAttentionInvariantWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                                 const MlaDims& dims);

// MlaLatentAttentionInvariantCuda: MlaLatentAttentionCuda's operands and result
// (mla_attention_cuda.h: q_latent [tokens, heads, R + dr] at q_token_stride, cache [blocks,
// block_size, R + dr], out_latent [tokens, heads, R] contiguous) with the batch-invariant
// reduction order; rows past query_start_loc[num_sequences] (graph padding) get zeros.
// Errors: InvalidArgument for sizes < 1, R + dr > 1024, a q_token_stride below
// heads · (R + dr), null pointers or a null workspace; Internal for launch errors.
absl::Status MlaLatentAttentionInvariantCuda(const bf16* q_latent, int64_t q_token_stride,
                                             const bf16* cache, int64_t block_size,
                                             const PagedAttentionCudaBatch& batch,
                                             const MlaDims& dims, void* workspace,
                                             bf16* out_latent, cudaStream_t stream);

// HeadGemmInvariantCuda: per head h < heads and token t < tokens,
//   y[t·y_token_stride + h·y_head_stride + j] = bf16(Σ_c x[t·x_token_stride + h·x_head_stride + c]
//                                                  · w[h·w_head_stride + j·w_n_stride + c·w_k_stride])
// for j < n, c < k (fp32 products and sums, one rounding). Query absorption:
// w = kv_b (head h's W_UK as [k = dn, n = R]: w_n_stride 1, w_k_stride R); value projection:
// w = kv_b + dn·R ([n = dv, k = R]: w_n_stride R, w_k_stride 1).
// Errors: InvalidArgument for tokens < 0, heads, n or k < 1, tokens > 65535 or heads > 65535,
// null pointers; Internal for launch errors.
absl::Status HeadGemmInvariantCuda(const bf16* x, int64_t x_token_stride, int64_t x_head_stride,
                                   const bf16* w, int64_t w_head_stride, int64_t w_n_stride,
                                   int64_t w_k_stride, bf16* y, int64_t y_token_stride,
                                   int64_t y_head_stride, int64_t tokens, int64_t heads,
                                   int64_t n, int64_t k, cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MLA_ATTENTION_MLA_INVARIANT_CUDA_H_
