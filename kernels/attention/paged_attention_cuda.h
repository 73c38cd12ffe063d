// CUDA paged attention (bf16 storage, fp32 math) over a block-structured KV cache: the same
// semantics as PagedAttentionCpu (paged_attention.h) — causal attention of each sequence's query
// tokens over its cached context plus its own new tokens, GQA, optional sliding window — with
// all step metadata in device memory so a decode step can be captured in a CUDA graph.
// Launcher conventions: kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_CUDA_H_
#define SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_CUDA_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention/paged_attention.h"
#include "kernels/attention/paged_attention_options.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/rope/rope_cuda.h"

namespace sluice::kernels {

// PagedAttentionCudaBatch: one step's layout. Pointers are device memory.
//   query_start_loc: [num_sequences + 1] int32, prefix sums of query tokens per sequence
//                    (sequence s owns q/out rows [query_start_loc[s], query_start_loc[s+1])).
//   context_lens:    [num_sequences] int32, tokens already cached before this step's queries
//                    (PagedSequence::num_context_tokens); the cache must also hold the new
//                    tokens' K/V (WriteKvCacheCuda first).
//   block_tables:    [num_sequences, max_blocks_per_seq] int32, row-major; entries past a
//                    sequence's last block are ignored.
// Host-side bounds size the grid: max_query_len ≥ every sequence's query count and
// max_seq_len ≥ every context_len + query count. Launch shape depends only on
// (num_sequences, num_tokens, max_query_len, max_seq_len), so a graph captured with fixed
// bounds stays valid while the device metadata changes between replays.
struct PagedAttentionCudaBatch {
  const int32_t* query_start_loc = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks_per_seq = 0;
  int64_t num_sequences = 0;
  int64_t num_tokens = 0;
  int64_t max_query_len = 0;
  int64_t max_seq_len = 0;
};

// PagedAttentionPlanInfo: what a launch of these bounds runs (tests and benchmark labels).
enum class PagedAttentionKernel {
  kWarpRings,
  kPersistentWarps,
  kCtaTiles,
  kMmaTiles,
  kFa2,
  kWgmma,
  kBatchInvariant,  // PagedAttentionOptions::batch_invariant (paged_attention_invariant.h)
};
struct PagedAttentionPlanInfo {
  PagedAttentionKernel kernel = PagedAttentionKernel::kCtaTiles;
  int64_t num_splits = 1;  // split-KV partitions (> 1: a combine pass follows)
  // Persistent decode warps at head dims 65..128 with ≤ 8 query rows a (sequence, KV head):
  // keys on the mma's m16 side, query rows on n8 (paged_decode_persistent.cu).
  bool swapped = false;
};
// DescribePagedAttentionPlan: the plan PagedAttentionCuda makes for a launch of these bounds;
// InvalidArgument as PagedAttentionCuda for bad sizes.
absl::StatusOr<PagedAttentionPlanInfo> DescribePagedAttentionPlan(
    const PagedAttentionCudaBatch& batch, const PagedAttentionParams& params,
    const PagedAttentionOptions& options = {});

// PagedAttentionCudaWorkspaceBytes: device scratch PagedAttentionCuda needs for split-KV
// partial results (0 when no split is used) for these bounds and options.
size_t PagedAttentionCudaWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                        const PagedAttentionParams& params,
                                        const PagedAttentionOptions& options = {});

// PagedAttentionCuda: out = softmax(scale · q·kᵀ) · v per sequence, query token and head.
//   q:       [num_tokens, num_heads, head_dim] bf16, row stride q_token_stride elements
//   k_cache: [num_blocks, block_size, num_kv_heads, head_dim] bf16 (one layer)
//   v_cache: [num_blocks, block_size, num_kv_heads, v_head_dim] bf16 (one layer)
//   out:     [num_tokens, num_heads, v_head_dim] bf16, contiguous
//   workspace: PagedAttentionCudaWorkspaceBytes(batch, params, options) bytes of device memory
//              (may be null when that is 0).
// With options.pdl the launch is a programmatic dependent of the kernel before it. A decode launch then reads the batch metadata, the block tables and the K/V of
// positions below each sequence's context_len before it waits for that kernel
// ("PrefetchBeforeWait" in paged_decode_device.cuh): those must not be written by that kernel,
// nor by one still running when it started (in a decode step they were written by earlier
// steps); q and the new tokens' K/V (positions ≥ context_len) may come from the kernel just
// before.
// Errors: InvalidArgument for sizes < 1, num_heads not a multiple of num_kv_heads, unsupported
// head dims; Internal for launch errors.
absl::Status PagedAttentionCuda(const bf16* q, int64_t q_token_stride, const bf16* k_cache,
                                const bf16* v_cache, const PagedAttentionCudaBatch& batch,
                                const PagedAttentionParams& params, void* workspace, bf16* out,
                                cudaStream_t stream, const PagedAttentionOptions& options = {});

// PagedAttentionDecodeFusionPays: whether a decode step of this shape should run RoPE, the
// K/V cache write and attention as one launch (PagedAttentionRopeDecodeCuda) rather than
// RopeQkWriteKvCuda then PagedAttentionCuda: decode launches without a split-KV pass, on warp
// rings, or on the persistent decode warps at head dims ≤ 128 (where the warps write each new
// key just before copying its slice). Split launches lose: every split would rotate q, and
// the unfused attention copies keys while the RoPE kernel runs. False for invalid sizes.
bool PagedAttentionDecodeFusionPays(const PagedAttentionCudaBatch& batch,
                                    const PagedAttentionParams& params,
                                    const PagedAttentionOptions& options = {});

// PagedAttentionDecodeFusionApplies: whether PagedAttentionRopeDecodeCuda serves this launch:
// valid sizes, max_query_len 1, num_heads / num_kv_heads ≤ 16, v_head_dim == head_dim, and
// rotary_dim a multiple of 4 in [4, head_dim].
bool PagedAttentionDecodeFusionApplies(const PagedAttentionCudaBatch& batch,
                                       const PagedAttentionParams& params, int64_t rotary_dim,
                                       const PagedAttentionOptions& options = {});

// PagedAttentionRopeDecodeCuda: RopeQkWriteKvCuda(qkv, ..., positions, rope, slot_mapping,
// k_cache, v_cache) followed by PagedAttentionCuda(qkv, token_stride, ...), in one launch, for
// decode steps (PagedAttentionDecodeFusionApplies). qkv: bf16 [num_tokens, token_stride] rows
// of q (num_heads × head_dim), k, v (num_kv_heads × head_dim each); it is only read (q and k
// are rotated in registers, unlike RopeQkWriteKvCuda which rotates in place). Each token's
// rotated k and its v go to cache slot slot_mapping[t] (int64, < 0: not written) — which must
// be the slot of key position context_lens[s] in the sequence's block table — and attention
// reads them like any cached key. Same results as the two launches (the same fp32 rotation,
// rounded once to bf16); same workspace (PagedAttentionCudaWorkspaceBytes). As a programmatic
// dependent launch, launches on the persistent decode warps read what PagedAttentionCuda
// reads before the wait (metadata, block tables, K/V below each context_len) plus the
// positions; qkv only after it.
// Errors: InvalidArgument when the launch does not qualify or for null pointers, else as
// PagedAttentionCuda.
absl::Status PagedAttentionRopeDecodeCuda(const bf16* qkv, int64_t token_stride, bf16* k_cache,
                                          bf16* v_cache, const PagedAttentionCudaBatch& batch,
                                          const PagedAttentionParams& params,
                                          const int32_t* positions, const DeviceRopeTable& rope,
                                          const int64_t* slot_mapping, void* workspace, bf16* out,
                                          cudaStream_t stream,
                                          const PagedAttentionOptions& options = {});

// WriteKvCacheCuda: token t's K (k_elems_per_token at k + t·k_token_stride) and V
// (v_elems_per_token at v + t·v_token_stride) go to slot slot_mapping[t] of the cache
// (k_cache + slot·k_elems_per_token, likewise v); slots < 0 are skipped. slot_mapping is a
// device array [num_tokens] int64. v/v_cache may be null when v_elems_per_token is 0.
absl::Status WriteKvCacheCuda(const bf16* k, int64_t k_token_stride, const bf16* v,
                              int64_t v_token_stride, const int64_t* slot_mapping,
                              int64_t num_tokens, int64_t k_elems_per_token,
                              int64_t v_elems_per_token, bf16* k_cache, bf16* v_cache,
                              cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_ATTENTION_CUDA_H_
