// CUDA MLA attention core over the paged latent cache, absorbed form (mla_attention.h has
// the math). The absorbed query and the output projection are per-head GEMMs done outside:
//   q_latent_h = [W_UK_hᵀ · q_nope_h, q_pe_h]                [kv_lora_rank + qk_rope_head_dim]
//   out_latent_h = Σ_j softmax_j(scale · q_latent_h · entry_j) · c_j        [kv_lora_rank]
//   out_h = W_UV_h · out_latent_h                                           [v_head_dim]
// where entry_j = [c_j, k_pe_j] is cache slot j's row. Every head reads the same latent rows
// (one "KV head"), so a CTA serves a group of heads and shares each row it loads.
// Launcher conventions: kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_CUDA_H_
#define SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_CUDA_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/mla_attention/mla_attention.h"

namespace sluice::kernels {

// MlaLatentAttentionCudaWorkspaceBytes: device scratch MlaLatentAttentionCuda needs for
// split-KV partial results with these bounds (0 when it does not split). 0 for invalid dims.
size_t MlaLatentAttentionCudaWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                            const MlaDims& dims);

// MlaLatentAttentionCuda: causal attention of each sequence's query tokens (positions
// context_lens[s] + i) over its cached latent rows, all heads sharing them.
//   q_latent:   [num_tokens, num_heads, kv_lora_rank + qk_rope_head_dim] bf16, row stride
//               q_token_stride elements (absorbed q_nope, then roped q_pe)
//   cache:      [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim] bf16 (one layer;
//               WriteKvCacheCuda with v_elems_per_token 0 fills it)
//   batch:      step metadata as for PagedAttentionCuda (device pointers, host bounds)
//   dims:       num_heads, kv_lora_rank, qk_rope_head_dim, softmax_scale are used
//   workspace:  MlaLatentAttentionCudaWorkspaceBytes(batch, dims) bytes (null when 0)
//   out_latent: [num_tokens, num_heads, kv_lora_rank] bf16, contiguous
// Errors: InvalidArgument for sizes < 1, kv_lora_rank odd or > 512, a row width
// (kv_lora_rank + qk_rope_head_dim) not a multiple of 8 or > 1024, misaligned pointers, a
// missing workspace; Internal for launch errors.
absl::Status MlaLatentAttentionCuda(const bf16* q_latent, int64_t q_token_stride, const bf16* cache,
                                    int64_t block_size, const PagedAttentionCudaBatch& batch,
                                    const MlaDims& dims, void* workspace, bf16* out_latent,
                                    cudaStream_t stream);

// MlaLatentAttentionVUpCuda: MlaLatentAttentionCuda followed by the per-head value projection
// (W_UV), with the split-KV combine and the projection in one launch:
//   out[t, h·v_head_dim + j] = bf16(Σ_c w_uv[h·w_head_stride + j·kv_lora_rank + c] · o[t, h, c])
// where o[t, h] is the bf16 latent output MlaLatentAttentionCuda would write (fp32 sums).
//   w_uv:       head h's [v_head_dim, kv_lora_rank] bf16 block at w_uv + h·w_head_stride (the
//               DeepSeek kv_b_proj rows after W_UK_h); 4-byte aligned, w_head_stride even
//   out:        token t's heads at out + t·out_token_stride, v_head_dim bf16 each
//   out_latent: scratch of MlaLatentAttentionCuda's size (written only when nothing splits;
//               contents unspecified afterwards)
// Each output row is a GEMV over L2-resident weights per CTA: meant for decode steps of a few
// tokens (the runner uses it up to kMlaAbsorbMaxTokens), where it saves the batched GEMM's launch.
// pdl_bits: MlaDecodePdlBits(level) below (its kMlaPdlVUpPreload and kMlaPdlVUpTrigger pieces).
// Errors: those of MlaLatentAttentionCuda; InvalidArgument for v_head_dim < 1, a null or
// misaligned w_uv or out, w_head_stride < v_head_dim · kv_lora_rank or odd, out_token_stride
// < num_heads · v_head_dim; Internal for launch errors.
absl::Status MlaLatentAttentionVUpCuda(const bf16* q_latent, int64_t q_token_stride,
                                       const bf16* cache, int64_t block_size,
                                       const PagedAttentionCudaBatch& batch, const MlaDims& dims,
                                       void* workspace, bf16* out_latent, const bf16* w_uv,
                                       int64_t w_head_stride, int64_t v_head_dim, bf16* out,
                                       int64_t out_token_stride, cudaStream_t stream,
                                       int pdl_bits = 0);

// Kernel choice (shape and device rules, no settings):
//  - decode-shaped launches (max_query_len 1, tensor-core dims): the pipelined decode kernel,
//    one CTA = a sequence's key partition × 16 heads, 32-row latent tiles through a cp.async
//    ring 4 deep (one CTA per SM) when the grid is a few sequences (latency-bound), else 2 deep
//    (two CTAs per SM); splits sized to fill the SMs. On sm_90+ it is a programmatic dependent
//    launch: it reads the batch metadata and starts copying the latent rows older than each
//    sequence's newest (position context_lens[s]) before its dependency wait, and the queries
//    and the newest row after it. So no kernel that may still run when it is launched may write
//    the metadata or a cached row other than each sequence's newest one (true of stream-ordered
//    callers and of the DeepSeek runner's decode steps).
//  - prefill-shaped launches (tensor-core dims): a 4-token × 16-head CTA over 64-row tiles, with
//    a 2-deep cp.async ring and swizzled shared memory when kv_lora_rank and kv_lora_rank +
//    qk_rope_head_dim are multiples of 64 and the device gives ~227 KB of shared memory per CTA;
//    otherwise the same CTA shape with one tile at a time (same split plan either way).
//  - other dims (e.g. the tiny test fixtures): an fp32 FMA kernel.

// MlaDecodePdlBits(level): which programmatic-dependent-launch pieces of the MLA decode block
// (the `pdl_bits` of MlaLatentAttentionVUpCuda and MlaPrologueAbsorbCuda) are on at decode PDL
// level `level` (cuda_runner::CudaRunnerOptions::decode_pdl_level; callers pass 0 where
// !PdlSupported()):
//   kMlaPdlAbsorb (1): the prologue + absorbed-query launch (cuda_runner::MlaPrologueAbsorbCuda)
//     is a programmatic dependent of the fused input projection; it waits before any load;
//   kMlaPdlAbsorbPreload (2): 1, with its GEMV blocks loading W_UK before that wait;
//   kMlaPdlVUpPreload (8): the combine + W_UV kernel loads W_UV before its wait;
//   kMlaPdlVUpTrigger (16): the combine + W_UV kernel lets its dependent (o_proj) launch right
//     after its wait instead of at its exit.
// Level >= 2: kMlaPdlLevel2; level 1 (the default): kMlaPdlLevel1 (level 2 without the W_UV
// preload, which slows the latency-bound attention kernel it overlaps); level 0: none.
inline constexpr int kMlaPdlAbsorb = 1, kMlaPdlAbsorbPreload = 2, kMlaPdlVUpPreload = 8,
                     kMlaPdlVUpTrigger = 16;
inline constexpr int kMlaPdlLevel2 =
    kMlaPdlAbsorb | kMlaPdlAbsorbPreload | kMlaPdlVUpPreload | kMlaPdlVUpTrigger;
inline constexpr int kMlaPdlLevel1 = kMlaPdlAbsorb | kMlaPdlAbsorbPreload | kMlaPdlVUpTrigger;
constexpr int MlaDecodePdlBits(int level) {
  return level >= 2 ? kMlaPdlLevel2 : level == 1 ? kMlaPdlLevel1 : 0;
}

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_CUDA_H_
