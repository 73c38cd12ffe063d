// Batch-invariant paged attention: the kernel PagedAttentionCuda runs for every launch when
// PagedAttentionOptions::batch_invariant is set (paged_attention_plan.cu dispatches here).
//
// Why a query row's bits depend on its own sequence only: the reduction over its visible keys
// [lo, pos] (pos its position, lo = pos - window + 1 with a sliding window, else 0) is cut at
// absolute key positions that are multiples of kBatchInvariantSplitKeys (a constant: not a
// split count derived from the batch, the token count or the SM count). One CTA reduces one
// (query row, split) for a tile of 1-8 query heads of one KV head (the tile, chosen from the
// head dims and GQA group alone, only shares K/V loads: each head's operations are those of a
// one-head CTA): warp w takes the 4-key groups starting at split_begin + 4·(w + 4j),
// so which warp sees which key, and in what order, is a function of the positions alone; each
// warp keeps an online softmax (running max, sum, V accumulator; dot products reduced with a
// butterfly whose every lane ends with the same sum), and the 4 warps' states are merged in
// warp order. A second kernel merges a row's splits in split order. Decode rows, prefill rows
// and chunked-prefill rows all go through the same two kernels with the same cut points, and
// the grid (head tiles × tokens × up to 16 CTAs that take every 16th split of a row) only
// decides which CTA computes a split, never what it computes; rows beyond
// query_start_loc[num_sequences] (graph padding) get zeros.
// Internal to kernels/attention.
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_INVARIANT_H_
#define SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_INVARIANT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/paged_attention_cuda.h"

namespace sluice::kernels {

// Key positions per split: the cut points of every row's reduction.
inline constexpr int64_t kBatchInvariantSplitKeys = 256;

namespace attention_detail {

// Splits a launch of these bounds may touch (ceil(max_seq_len / kBatchInvariantSplitKeys)).
int64_t BatchInvariantSplits(const PagedAttentionCudaBatch& batch);

// The general layout (MLA's latent attention uses it with one shared KV head whose key is the
// whole latent row and whose value is its first v_head_dim channels): query head h of token t
// at q + t·q_token_stride + h·q_head_stride, key of cache slot s for KV head g at
// k_cache + s·k_token_stride + g·head_dim, its value at v_cache + s·v_token_stride +
// g·v_head_dim; out [tokens, num_heads, v_head_dim] contiguous. Head dims up to 1024.
struct BatchInvariantLayout {
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, v_head_dim = 0, block_size = 0;
  int64_t sliding_window = 0;
  float scale = 1.0f;
  int64_t q_token_stride = 0, q_head_stride = 0, k_token_stride = 0, v_token_stride = 0;
};
size_t BatchInvariantWorkspaceBytes(const PagedAttentionCudaBatch& batch, int64_t num_heads,
                                    int64_t v_head_dim);
// The layout's launch; the caller validated the batch and pointers. Errors: InvalidArgument for
// head dims above 1024, too many splits or a null workspace; Internal for launch errors.
absl::Status LaunchBatchInvariantAttention(const bf16* q, const bf16* k_cache,
                                           const bf16* v_cache,
                                           const PagedAttentionCudaBatch& batch,
                                           const BatchInvariantLayout& layout, void* workspace,
                                           bf16* out, cudaStream_t stream);
// Workspace of the batch-invariant launch: fp32 (max, sum) and V partials for each (token,
// head, split) of up to BatchInvariantTokensPerPass tokens.
size_t BatchInvariantWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                    const PagedAttentionParams& params);
// Launches the split and merge kernels over the batch (validated by the caller: params and
// batch valid, pointers non-null, workspace of BatchInvariantWorkspaceBytes). Passes of
// BatchInvariantTokensPerPass tokens keep the workspace bounded on long prefills.
absl::Status LaunchBatchInvariantAttention(const bf16* q, int64_t q_token_stride,
                                           const bf16* k_cache, const bf16* v_cache,
                                           const PagedAttentionCudaBatch& batch,
                                           const PagedAttentionParams& params, void* workspace,
                                           bf16* out, cudaStream_t stream);

}  // namespace attention_detail
}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_INVARIANT_H_
