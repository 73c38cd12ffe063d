// The per-token MLA plumbing around the attention core (mla_attention_cuda.h) that the DeepSeek
// runner (engine/cuda/cuda_deepseek_runner.cc) launches: the latent prologue (kv_a norm, RoPE,
// latent cache write), the absorbed query, and the MHA form's gather and K/V assembly; plus two
// layout helpers. mla_plumbing.h has the CPU references. Launcher conventions:
// kernels/cuda/cuda_common.h (device pointers, enqueued on `stream`, no synchronization,
// graph-capturable).
#ifndef SLUICE_KERNELS_MLA_ATTENTION_MLA_PLUMBING_CUDA_H_
#define SLUICE_KERNELS_MLA_ATTENTION_MLA_PLUMBING_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/mla_attention/mla_attention_cuda.h"

namespace sluice::kernels {

// StridedCopy describes [num_tokens, num_heads, width] bf16 spans of a wider buffer:
// element (t, h, i) is at ptr[t · token_stride + h · head_stride + i].
struct HeadSpans {
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// CopyHeadsCuda: dst(t, h, i) = src(t, h, i) for t < num_tokens, h < num_heads, i < width
// (e.g. the q_pe channels of every head into the absorbed query, the k_pe channels into the
// latent cache row). Spans of dst must not overlap src.
// The `pdl` of this file's launchers (kernels/cuda/cuda_common.h; the DeepSeek runner's decode
// PDL level >= 2): a programmatic dependent launch that reads nothing before its wait.
// Errors: InvalidArgument for negative sizes; Internal for launch errors.
absl::Status CopyHeadsCuda(const bf16* src, HeadSpans src_spans, bf16* dst, HeadSpans dst_spans,
                           int64_t num_tokens, int64_t num_heads, int64_t width,
                           cudaStream_t stream, bool pdl = false);

// AddInPlaceCuda: y[i] = bf16(float(y[i]) + float(x[i])) for i < n (x, y bf16, contiguous).
// Errors: InvalidArgument for n < 0; Internal for launch errors.
absl::Status AddInPlaceCuda(bf16* y, const bf16* x, int64_t n, cudaStream_t stream,
                            bool pdl = false);

// MlaPrologueArgs: the per-token MLA plumbing between the fused input projection and the
// absorbed attention, for MlaPrologueCuda. Token t's rows:
//   kv + t·kv_stride: c_kv [R] then k_pe [dr] (kv_a_proj_with_mqa's output, bf16);
//   q_pe of head h: q_pe + t·q_token_stride + h·q_head_stride, dr bf16;
//   q_out of head h: q_out + t·q_out_token_stride + h·q_out_head_stride, dr bf16 (written).
// cache: the layer's latent cache [slots, R + dr] bf16; slots [T] int64 (< 0: not cached),
// positions [T] int32; inv_freq [dr / 2] fp32 and scaling: the RoPE table (kernels/rope).
struct MlaPrologueArgs {
  const bf16* kv = nullptr;
  int64_t kv_stride = 0;
  const bf16* kv_norm = nullptr;  // [R] kv_a_layernorm weight
  float eps = 1e-6f;
  const bf16* q_pe = nullptr;
  int64_t q_token_stride = 0, q_head_stride = 0;
  bf16* q_out = nullptr;
  int64_t q_out_token_stride = 0, q_out_head_stride = 0;
  int64_t heads = 0, R = 0, dr = 0;
  const int32_t* positions = nullptr;
  const int64_t* slots = nullptr;
  const float* inv_freq = nullptr;
  float scaling = 1.0f;
  bool interleave = false;
  bf16* cache = nullptr;
};

// MlaPrologueCuda: in one launch (a block per token), what RmsNormCuda + CopyHeadsCuda +
// RopeCuda + WriteKvCacheCuda (the latent row) and CopyHeadsCuda + RopeCuda (the queries'
// rope channels) compute:
//   cache[slot, :R]    = bf16(c_kv · rsqrt(mean(c_kv²) + eps) · kv_norm)   (fp32 math)
//   cache[slot, R:]    = rope(k_pe, pos)
//   q_out[t, h, :dr]   = rope(q_pe[t, h], pos)      for h < heads
// with RopeCuda's rotation (rotate-half, or pairs (2i, 2i + 1) with `interleave`; fp32 angle
// pos · inv_freq[i], sincosf, cos and sin times scaling; one bf16 rounding). The norm's sum
// of squares is a fixed-order block reduction (deterministic; it may differ from RmsNormCuda's
// in the last fp32 bit). q_out must not overlap kv, q_pe or the cache.
// Errors: InvalidArgument for num_tokens < 0, R < 1, dr < 2 or odd, heads < 0, null pointers
// (when num_tokens > 0); Internal for launch errors.
absl::Status MlaPrologueCuda(const MlaPrologueArgs& args, int64_t num_tokens, cudaStream_t stream,
                             bool pdl = false);

// Most tokens MlaAbsorbQueryCuda takes (a decode-sized GEMV; prefill uses the batched GEMM).
inline constexpr int64_t kMlaAbsorbMaxTokens = 8;

// MlaAbsorbQueryCuda: the absorbed queries' latent part for a few tokens,
//   out[t, h, r] = bf16(Σ_{d < dn} q[t, h, d] · w[h, d, r])   (fp32 products and sums)
// with q of token t, head h at q + t·q_token_stride + h·q_head_stride (dn bf16: q_nope), w
// the per-head [dn, R] blocks at w + h·w_head_stride (row stride R: W_UK_h inside kv_b_proj),
// out at out + t·out_token_stride + h·out_head_stride (R bf16). What BatchedGemm::Run with
// w_is_kn computes, as one launch of heads · ⌈R/128⌉ blocks that read each weight once with
// 16-byte loads all in flight; sums in a fixed order (deterministic; may differ from cuBLAS's
// in the last bit before rounding).
// Errors: InvalidArgument for num_tokens outside [0, kMlaAbsorbMaxTokens], heads < 1, dn < 1,
// R < 8 or R % 8 != 0, w / w_head_stride not 16-byte aligned, null pointers; Internal for
// launch errors.
absl::Status MlaAbsorbQueryCuda(const bf16* q, int64_t q_token_stride, int64_t q_head_stride,
                                const bf16* w, int64_t w_head_stride, bf16* out,
                                int64_t out_token_stride, int64_t out_head_stride,
                                int64_t num_tokens, int64_t heads, int64_t dn, int64_t R,
                                cudaStream_t stream, bool pdl = false);

// MlaPrologueAbsorbCuda: MlaPrologueCuda(prologue, num_tokens) and MlaAbsorbQueryCuda(q, ...,
// num_tokens, heads, dn, R) in one launch (both read only the fused input projection's output,
// so they need no order): num_tokens extra blocks run the
// prologue beside the GEMV's heads · ⌈R/128⌉ blocks, with the same device code, so every output
// equals the two separate launches' bit for bit. The prologue's q_out and cache spans must not
// overlap `out`, nor either of them the inputs. Programmatic dependent launch pieces: those of
// pdl_bits = kernels::MlaDecodePdlBits(level) (kMlaPdlAbsorb, kMlaPdlAbsorbPreload).
// Errors: those of MlaPrologueCuda and MlaAbsorbQueryCuda; Internal for launch errors.
absl::Status MlaPrologueAbsorbCuda(const MlaPrologueArgs& prologue, const bf16* q,
                                   int64_t q_token_stride, int64_t q_head_stride, const bf16* w,
                                   int64_t w_head_stride, bf16* out, int64_t out_token_stride,
                                   int64_t out_head_stride, int64_t num_tokens, int64_t heads,
                                   int64_t dn, int64_t R, cudaStream_t stream, int pdl_bits = 0);

// ---- MLA prefill in the non-absorbed (MHA) form (kernels::MlaOptions, mla_options.h).
// Instead of attending over the 576-wide latent rows (absorbed: 2·H·(2·R + dr) FLOPs per
// query-key pair), large steps up-project every sequence's context once with kv_b_proj into
// per-head k_nope [dn] and v [dv] and run ordinary causal attention with head_dim dn + dr and
// v_head_dim dv (2·H·(dn + dr + dv) FLOPs per pair: 3.4x fewer at DeepSeek-V2/V3's 512/64/128),
// as vLLM's and SGLang's MLA prefill does (DeepSeek-V2 paper, arXiv:2405.04434, §2.1.2: the
// absorption is a decode-time saving).

// MlaGatherLatentCuda: every sequence's context rows of the paged latent cache into contiguous
// scratch. Sequence s owns rows [s·rows_per_seq, (s + 1)·rows_per_seq) of the outputs; its row
// j < len_s = context_lens[s] + query_start_loc[s + 1] − query_start_loc[s] (the cached prefix
// plus this step's tokens, whose rows the prologue has already written) is cache slot
// block_tables[s·max_blocks_per_seq + j / block_size]·block_size + j % block_size:
//   kv_c[row, :]  = cache[slot, :R]      ([num_seqs·rows_per_seq, R])
//   k_pe[row, :]  = cache[slot, R:R+dr]  ([num_seqs·rows_per_seq, dr])
// and rows j >= len_s are zeros (so everything computed from them stays finite). cache: one
// layer's [slots, R + dr] bf16; metadata int32 device arrays (PagedAttentionCudaBatch's).
// rows_per_seq must be >= every len_s (not checked on the device).
// Errors: InvalidArgument for R < 2 or odd, dr < 2 or odd, negative sizes, rows_per_seq or
// block_size < 1, null pointers (with rows); Internal for launch errors.
absl::Status MlaGatherLatentCuda(const bf16* cache, int64_t R, int64_t dr,
                                 const int32_t* context_lens, const int32_t* query_start_loc,
                                 const int32_t* block_tables, int64_t max_blocks_per_seq,
                                 int64_t block_size, int64_t num_seqs, int64_t rows_per_seq,
                                 bf16* kv_c, bf16* k_pe, cudaStream_t stream);

// MlaAssembleKvCuda: the MHA keys and values of `rows` context rows from kv_b_proj's output
// kv_up [rows, heads, dn + dv] (per head k_nope then v) and the shared rotated k_pe [rows, dr]:
//   k[r, h, :dn] = kv_up[r, h, :dn],  k[r, h, dn:dn+dr] = k_pe[r, :],   ([rows, heads, dn + dr])
//   v[r, h, :]   = kv_up[r, h, dn:dn+dv]                                ([rows, heads, dv])
// (exact copies). 16-byte vectors when dn, dr, dv are multiples of 8, else element by element.
// Errors: InvalidArgument for negative sizes, dn / dr / dv < 1, null pointers (with rows);
// Internal for launch errors.
absl::Status MlaAssembleKvCuda(const bf16* kv_up, const bf16* k_pe, int64_t rows, int64_t heads,
                               int64_t dn, int64_t dr, int64_t dv, bf16* k, bf16* v,
                               cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MLA_ATTENTION_MLA_PLUMBING_CUDA_H_
