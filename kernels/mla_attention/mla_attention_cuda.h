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
// (W_UV), with the split-KV combine and the projection in one launch (SetMlaDecodeFusion 2):
//   out[t, h·v_head_dim + j] = bf16(Σ_c w_uv[h·w_head_stride + j·kv_lora_rank + c] · o[t, h, c])
// where o[t, h] is the bf16 latent output MlaLatentAttentionCuda would write (fp32 sums).
//   w_uv:       head h's [v_head_dim, kv_lora_rank] bf16 block at w_uv + h·w_head_stride (the
//               DeepSeek kv_b_proj rows after W_UK_h); 4-byte aligned, w_head_stride even
//   out:        token t's heads at out + t·out_token_stride, v_head_dim bf16 each
//   out_latent: scratch of MlaLatentAttentionCuda's size (written only when nothing splits;
//               contents unspecified afterwards)
// Each output row is a GEMV over L2-resident weights per CTA: meant for decode steps of a few
// tokens (the runner uses it up to 8), where it saves the batched GEMM's launch.
// Errors: those of MlaLatentAttentionCuda; InvalidArgument for v_head_dim < 1, a null or
// misaligned w_uv or out, w_head_stride < v_head_dim · kv_lora_rank or odd, out_token_stride
// < num_heads · v_head_dim; Internal for launch errors.
//   l2_prefetch: null, or weight spans (never written during a step; e.g. the o_proj GEMV's
//               weight that runs next) a kernel of the chain asks L2 for (SetMlaDecodeL2Prefetch),
//               `site`: the decode attention kernel before its dependency wait, or the combine
//               + W_UV kernel after its wait (kPrologue: the caller's prologue launch; none
//               here). A hint: it never changes a result; spans that are not 16-byte aligned
//               are skipped, and a span's last bytes % 16 are not fetched.
enum class MlaL2PrefetchSite { kAttention, kCombine, kPrologue };
struct MlaL2Prefetch {
  const void* ptr[2] = {nullptr, nullptr};
  size_t bytes[2] = {0, 0};
  MlaL2PrefetchSite site = MlaL2PrefetchSite::kAttention;
};
absl::Status MlaLatentAttentionVUpCuda(const bf16* q_latent, int64_t q_token_stride,
                                       const bf16* cache, int64_t block_size,
                                       const PagedAttentionCudaBatch& batch, const MlaDims& dims,
                                       void* workspace, bf16* out_latent, const bf16* w_uv,
                                       int64_t w_head_stride, int64_t v_head_dim, bf16* out,
                                       int64_t out_token_stride, cudaStream_t stream,
                                       const MlaL2Prefetch* l2_prefetch = nullptr);

// SetMlaLatentAttentionDecodeKernel: the kernel decode-shaped launches (max_query_len 1,
// tensor-core dims) use. The pipelined decode kernel: one CTA = a sequence's key partition ×
// a group of 16 heads, 32-row latent tiles through a cp.async ring, splits sized to fill the
// SMs; its ring is 2 deep (two CTAs per SM) or 4 deep (one). 0 (the default): pipelined, 4
// deep when the grid is a few sequences (latency-bound), else 2 deep; 1: the 64-row tile
// kernel that also serves prefill (kept for A/B benches and tests); 2: pipelined, 2 deep;
// 3: pipelined, 4 deep. Process-wide, read when a launch is planned; the split plan and so
// MlaLatentAttentionCudaWorkspaceBytes depend on it: set it before sizing workspaces or
// capturing graphs. InvalidArgument for other values; MlaLatentAttentionDecodeKernel returns it.
absl::Status SetMlaLatentAttentionDecodeKernel(int kernel);
int MlaLatentAttentionDecodeKernel();

// SetMlaPrefillKernel: the kernel prefill-shaped launches (max_query_len > 1, tensor-core dims)
// use. 0: MlaLatentMmaKernel<4>, 4 query tokens × 16 heads per CTA, one 64-row
// latent tile at a time. 1 (the default): MlaPrefillMmaKernel, the same CTA shape and split plan (so
// MlaLatentAttentionCudaWorkspaceBytes does not depend on it) with a 2-deep cp.async tile ring,
// swizzled shared memory, scores and softmax in registers; it needs kv_lora_rank and
// kv_lora_rank + qk_rope_head_dim multiples of 64 and ~227 KB of shared memory per CTA (sm_90),
// and launches that do not meet that run kernel 0. Process-wide, read when a launch is planned.
// InvalidArgument for other values; MlaPrefillKernel returns it. Measured on an H200
// (DeepSeek-V2-Lite shapes, 27 layers; bench/results/cuda_dsv2lite_h200.json): attention 79.4 /
// 46.1 ms at 4k tokens and 1,089 / 704 ms at 16k for 0 / 1.
absl::Status SetMlaPrefillKernel(int kernel);
int MlaPrefillKernel();

// SetMlaDecodeFusion: launch fusion of the DeepSeek runner's MLA block at decode sizes
// (cuda_deepseek_runner.cc, steps on the fused-prologue path of MoeDecodeVariant() >= 2).
// 0: separate launches. 1: the latent prologue (kv_a norm, RoPE, latent cache
// write, the queries' RoPE) runs in extra blocks of the absorbed-query GEMV
// (cuda_runner::MlaPrologueAbsorbCuda), one launch instead of two, bit-equal. 2: 1, and decode
// attention's split-KV combine and the W_UV value projection in one launch
// (MlaLatentAttentionVUpCuda) instead of the combine and a batched GEMM. 3: 2, and the decode
// attention kernel and the combine + W_UV kernel go out as programmatic dependent launches
// (3 is the default)
// (cudaLaunchAttributeProgrammaticStreamSerialization, sm_90+; each waits on griddepcontrol
// before reading its inputs), so their launches overlap the kernel before each. Process-wide,
// read when a step is enqueued: set it before capturing graphs. InvalidArgument outside 0..3;
// MlaDecodeFusion returns it.
absl::Status SetMlaDecodeFusion(int level);
int MlaDecodeFusion();

// SetMlaDecodePdlMask: which of the MLA decode block's programmatic-dependent-launch pieces are
// on (kernels/cuda/pdl.cuh), one bit each, to tell apart why DecodePdlLevel 2 (all of them)
// measured slower than level 1 (none) and to keep the ones that pay. -1 (the default): from
// DecodePdlLevel (>= 2: kMlaPdlLevel2; 1: kMlaPdlLevel1; 0: none). Bits:
//   kMlaPdlAbsorb (1): the prologue + absorbed-query launch (cuda_runner::MlaPrologueAbsorbCuda)
//     is a programmatic dependent of the fused input projection; it waits before any load;
//   kMlaPdlAbsorbPreload (2): 1, with its GEMV blocks loading W_UK before that wait;
//   kMlaPdlAbsorbLateTrigger (4): that launch lets the decode attention kernel launch only
//     after its wait (default: at its start, so the attention's CTAs may get resident while
//     the input projection still runs);
//   kMlaPdlVUpPreload (8): the combine + W_UV kernel loads W_UV before its wait;
//   kMlaPdlVUpTrigger (16): the combine + W_UV kernel lets its dependent (o_proj) launch right
//     after its wait instead of at its exit;
//   kMlaPdlAttnLateTrigger (32): the decode attention kernel lets the combine launch only at its
//     exit (default: right after its wait, so the combine's CTAs, and what they load before
//     their wait, overlap the attention).
// Process-wide, read when a step is enqueued (set it before capturing graphs); all bits are off
// below sm_90. InvalidArgument outside -1..63. MlaDecodePdlMask returns the setting,
// MlaDecodePdlBits the bits in effect.
inline constexpr int kMlaPdlAbsorb = 1, kMlaPdlAbsorbPreload = 2, kMlaPdlAbsorbLateTrigger = 4,
                     kMlaPdlVUpPreload = 8, kMlaPdlVUpTrigger = 16, kMlaPdlAttnLateTrigger = 32;
inline constexpr int kMlaPdlLevel2 =
    kMlaPdlAbsorb | kMlaPdlAbsorbPreload | kMlaPdlVUpPreload | kMlaPdlVUpTrigger;
// The bits of DecodePdlLevel 1 (the default): level 2 without kMlaPdlVUpPreload, whose W_UV loads
// before the wait slow the latency-bound attention kernel they overlap (H200, DeepSeek-V2-Lite
// batch 1, with SetMlaDecodeEarlyKv(1): 2.293-2.294 ms vs 2.308-2.311 with the bit and
// 2.338 with no bits; bench/results/cuda_dsv2lite_mla_chain_ab_h200.json).
inline constexpr int kMlaPdlLevel1 = kMlaPdlAbsorb | kMlaPdlAbsorbPreload | kMlaPdlVUpTrigger;
absl::Status SetMlaDecodePdlMask(int mask);
int MlaDecodePdlMask();
int MlaDecodePdlBits();

// SetMlaDecodeL2Prefetch: which weights the DeepSeek runner's decode steps (the fused combine +
// W_UV path, <= 8 tokens) have a kernel of the MLA chain pull into L2 (MlaL2Prefetch) while the
// chain leaves HBM idle: bit 1 the layer's o_proj weight (read by the GEMV after the combine),
// bit 2 its kv_b_proj (W_UK and W_UV). Which kernel asks: the decode attention kernel before
// its wait (neither 4 nor 8), the combine + W_UV kernel after its wait (4), or the prologue +
// absorbed-query launch at its start (8). 0 (the default): none. Process-wide, read when a
// step is enqueued. InvalidArgument outside 0..15 or with both 4 and 8.
absl::Status SetMlaDecodeL2Prefetch(int mode);
int MlaDecodeL2Prefetch();

// SetMlaDecodeEarlyKv(1): the pipelined decode kernel (SetMlaLatentAttentionDecodeKernel) reads
// the batch metadata (query_start_loc, context_lens, block_tables) and starts its first latent
// tiles' copies before its programmatic dependency wait (kernels/cuda/pdl.cuh), skipping each
// sequence's newest row (position context_lens[s], this step's token) and the queries, which it
// reads after the wait. So when launched as a programmatic dependent (SetMlaDecodeFusion(3)) its
// metadata chain and the older rows' HBM latency overlap the kernel before it. Only valid when
// no kernel that may still run writes the metadata or a cached row other than each sequence's
// newest one: true of the DeepSeek runner's decode steps (the metadata is copied in before the
// step; the prologue appends only row context_lens[s]). Same results either way. 1 is the
// default (H200, DeepSeek-V2-Lite batch 1 with kMlaPdlLevel1: 2.293-2.294 ms vs 2.391-2.396 with
// neither); 0: everything after the wait. Process-wide, read when a launch is planned.
// InvalidArgument outside 0..1.
absl::Status SetMlaDecodeEarlyKv(int mode);
int MlaDecodeEarlyKv();

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MLA_ATTENTION_MLA_ATTENTION_CUDA_H_
