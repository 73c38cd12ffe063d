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
#include "kernels/attention/paged_attention.h"
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

// PagedAttentionCudaWorkspaceBytes: device scratch PagedAttentionCuda needs for split-KV
// partial results (0 when no split is used) for these bounds.
size_t PagedAttentionCudaWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                        const PagedAttentionParams& params);

// PagedAttentionCuda: out = softmax(scale · q·kᵀ) · v per sequence, query token and head.
//   q:       [num_tokens, num_heads, head_dim] bf16, row stride q_token_stride elements
//   k_cache: [num_blocks, block_size, num_kv_heads, head_dim] bf16 (one layer)
//   v_cache: [num_blocks, block_size, num_kv_heads, v_head_dim] bf16 (one layer)
//   out:     [num_tokens, num_heads, v_head_dim] bf16, contiguous
//   workspace: PagedAttentionCudaWorkspaceBytes(batch, params) bytes of device memory (may be
//              null when that is 0).
// As a programmatic dependent launch (kernels::DecodePdl or SetPagedAttentionPdl on sm_90), a
// decode launch reads the batch metadata, the block tables and the K/V of positions below each
// sequence's context_len before it waits for the kernel before it (paged_attention.cu
// "PrefetchBeforeWait"): those must not be written by that kernel, nor by one still running
// when it started (in a decode step they were written by earlier steps); q and the new tokens'
// K/V (positions ≥ context_len) may come from the kernel just before.
// Errors: InvalidArgument for sizes < 1, num_heads not a multiple of num_kv_heads, unsupported
// head dims; Internal for launch errors.
absl::Status PagedAttentionCuda(const bf16* q, int64_t q_token_stride, const bf16* k_cache,
                                const bf16* v_cache, const PagedAttentionCudaBatch& batch,
                                const PagedAttentionParams& params, void* workspace, bf16* out,
                                cudaStream_t stream);

// SetPagedAttentionDecodeFusion: how decode-only steps run RoPE, the K/V cache write and
// attention (read by callers such as the CUDA Llama runner; process-wide, set it before
// capturing graphs). 0: RopeQkWriteKvCuda, then PagedAttentionCuda; 1:
// PagedAttentionRopeDecodeCuda, one launch, where PagedAttentionDecodeFusionApplies (else the
// caller keeps the two launches) — the CUDA Llama runner for steps of ≤ 16 tokens; 2: as 1 at
// any batch size; 3 (the default): as 1 for steps of more than 16 tokens whose attention
// launch PagedAttentionDecodeFusionPays (no split). H200, Llama-3-8B at 1k context, graph ITL:
// batch 64 (CTA warp rings) 6.959 / 6.960 ms fused vs 7.010 / 7.039 in one call of stop 17
// (bench/results/cuda_ab_stop17_h200.json), ~0 in another, 6.856-6.862 vs 6.824-6.827 in
// stop 18 call 5 (bench/results/cuda_ab_stop18_h200.json): a small, machine-dependent effect;
// batch 256 (persistent decode warps, whose fused launches write each new key just before
// copying its slice, loaded a slice ahead) 15.057-15.070 vs 15.149-15.168 (call 4) and
// 15.228-15.237 vs 15.316-15.318 (call 5); batch 1 (split) 4.208 / 4.210 vs 4.180 / 4.182 in
// stop 17 (the unfused attention copies keys while the RoPE kernel runs: PrefetchBeforeWait).
// InvalidArgument for other values.
inline constexpr int kDecodeFusionOff = 0, kDecodeFusionSmall = 1, kDecodeFusionAlways = 2,
                     kDecodeFusionAuto = 3;
absl::Status SetPagedAttentionDecodeFusion(int mode);
int PagedAttentionDecodeFusion();

// PagedAttentionDecodeFusionPays: whether decode fusion mode 3 fuses a launch of this shape: a
// decode launch without a split-KV pass (not the split launches of small batches), on CTA warp
// rings or on the persistent decode warps (batch 256) where those defer the new-key writes
// (SetPagedAttentionPrefetchBeforeWait on, head dims ≤ 128); false for invalid sizes.
bool PagedAttentionDecodeFusionPays(const PagedAttentionCudaBatch& batch,
                                    const PagedAttentionParams& params);

// PagedAttentionDecodeFusionApplies: whether PagedAttentionRopeDecodeCuda serves this launch:
// valid sizes, max_query_len 1, num_heads / num_kv_heads ≤ 16, v_head_dim == head_dim, and
// rotary_dim a multiple of 4 in [4, head_dim].
bool PagedAttentionDecodeFusionApplies(const PagedAttentionCudaBatch& batch,
                                       const PagedAttentionParams& params, int64_t rotary_dim);

// PagedAttentionRopeDecodeCuda: RopeQkWriteKvCuda(qkv, ..., positions, rope, slot_mapping,
// k_cache, v_cache) followed by PagedAttentionCuda(qkv, token_stride, ...), in one launch, for
// decode steps (PagedAttentionDecodeFusionApplies). qkv: bf16 [num_tokens, token_stride] rows
// of q (num_heads × head_dim), k, v (num_kv_heads × head_dim each); it is only read (q and k
// are rotated in registers, unlike RopeQkWriteKvCuda which rotates in place). Each token's
// rotated k and its v go to cache slot slot_mapping[t] (int64, < 0: not written) — which must
// be the slot of key position context_lens[s] in the sequence's block table — and attention
// reads them like any cached key. Same results as the two launches (the same fp32 rotation,
// rounded once to bf16); same workspace (PagedAttentionCudaWorkspaceBytes). As a programmatic
// dependent launch, launches on the persistent decode warps with early copies
// (SetPagedAttentionPrefetchBeforeWait) read what PagedAttentionCuda reads before the wait
// (metadata, block tables, K/V below each context_len) plus the positions; qkv only after it.
// Errors: InvalidArgument when the launch does not qualify or for null pointers, else as
// PagedAttentionCuda.
absl::Status PagedAttentionRopeDecodeCuda(const bf16* qkv, int64_t token_stride, bf16* k_cache,
                                          bf16* v_cache, const PagedAttentionCudaBatch& batch,
                                          const PagedAttentionParams& params,
                                          const int32_t* positions, const DeviceRopeTable& rope,
                                          const int64_t* slot_mapping, void* workspace, bf16* out,
                                          cudaStream_t stream);

// SetPagedAttentionDecodeStages: depth of the cp.async K/V ring of decode-shaped launches
// (every sequence's query rows fit one 16-row tile): 2 (3 CTAs per SM), 3 (2 CTAs per SM, more
// bytes in flight per CTA) or 0 (the default: chosen per launch from the grid size, see
// paged_attention.cu Plan). Process-wide, read when a launch is planned; since the split plan
// and so PagedAttentionCudaWorkspaceBytes depend on it, set it before sizing workspaces or
// capturing graphs (benchmarks and tests compare the settings). InvalidArgument for other
// values. PagedAttentionDecodeStages returns the setting.
absl::Status SetPagedAttentionDecodeStages(int stages);
int PagedAttentionDecodeStages();

// SetPagedAttentionDecodeKernel: the kernel of decode-shaped launches (the default: 8, as 0
// unless the unsplit grid fills the resident warps). 0: automatic (warp rings: 2 warps × 3 stages when the unsplit grid is at least half a wave of
// those, else 4 warps with the depth SetPagedAttentionDecodeStages says); 1: CTA tiles
// (each 64-key K/V tile copied by the whole CTA, two barriers per tile; depth from
// SetPagedAttentionDecodeStages); warp rings (each warp streams its own 16-key slices through
// a private cp.async ring, see paged_attention.cu) of 2: 4 warps × 2 stages, 3: 4 × 3,
// 4: 4 × 6, 5: 8 warps × 3, 6: 2 warps × 3, 7: 2 × 4 (depths shrink to fit shared memory for
// wide heads); persistent decode warps (each warp owns whole (sequence, KV head, split) units
// and streams all its units' keys through one 3-stage ring that prefetches across unit
// boundaries, so a unit's start-up latency hides behind the previous unit; no CTA barrier or
// merge; see paged_attention.cu) of 8: where the unsplit (sequence, KV head) units fill the
// resident warps at least once (e.g. batch 256 × 8 KV heads on an H200), else as 0; 9: always
// (splitting keys as 0 would for small batches). Same results as the other kernels within
// bf16 rounding; the decode fusion (PagedAttentionRopeDecodeCuda) serves all of them.
// Process-wide, for benchmarks and tests; set it before sizing workspaces or capturing graphs
// (the split plan depends on it). InvalidArgument outside 0..9. PagedAttentionDecodeKernel
// returns it.
absl::Status SetPagedAttentionDecodeKernel(int kernel);
int PagedAttentionDecodeKernel();

// SetPagedAttentionDecodeWarpVariant: the shape and K/V copy of the persistent decode warps
// (kernel 8/9). 10, the default: 8 warps a CTA (1 CTA per SM at d 128), 16-key slices in a
// 3-stage ring per warp, cp.async copies with an L2 evict-first cache policy (and the
// .L2::256B prefetch-size hint unless SetPagedAttentionSliceMath's kSliceNoL2Prefetch, on by
// default, drops it); only at head dims 65..128 (other dims run 0). 0: 4 warps a CTA,
// 16-key slices, 3 stages (fewer where wide heads do not fit), plain cp.async; any head dims.
// H200, Llama-3-8B decode at 256 sequences × 1k: attention 279-287 µs a layer with 10 vs
// 283-293 with 0, step 15.57-15.60 ms vs 15.62-15.68
// (bench/results/cuda_attn_decode_variants_h200.json). Variants 1-9 and 11-24 (other copies
// and shapes, bulk copies, lock-step CTAs, L2 prefetch, dynamic units) measured slower and
// were removed (paged_attention.cu lists what they measured). Same results within bf16
// rounding; both deterministic. Process-wide, for benchmarks and tests; set it before sizing
// workspaces or capturing graphs. InvalidArgument unless 0 or 10.
// PagedAttentionDecodeWarpVariant returns it.
absl::Status SetPagedAttentionDecodeWarpVariant(int variant);
int PagedAttentionDecodeWarpVariant();

// SetPagedAttentionSliceMath(bits): instruction-count options of the per-slice softmax math
// (AttendSlice) that the decode kernels (and prefill kernels 0-2) share, and of the persistent
// decode warps' slices (copies and, with bit 16, their shared-memory layout); every setting
// gives the same bits as 0:
//   kSliceLdmatrixK (1): K's B fragments by ldmatrix.x4, two k-steps per instruction (four
//     32-bit shared loads otherwise);
//   kSliceLazyRescale (2): the running sum and output accumulators are rescaled only in slices
//     where some row of the warp's tile has a new max (a warp-uniform branch; otherwise every
//     factor is exp2(0) = 1), as FlashAttention-3's rescaling skips when the max is unchanged
//     (Shah et al. 2024, arXiv:2407.08608, §3.3 mentions it as a known trick; here exact);
//   kSliceLean (4): the swapped GQA slices of the persistent decode warps skip the per-score
//     mask where every key of the slice is visible to every row (all but a unit's edge
//     slices), and the persistent warps copy slices that lie whole in one cache block (block
//     size a multiple of 16, equal K and V head dims) with one slot shuffle and one pointer
//     per lane stepped by a constant (key k's slot is key 0's plus k);
//   kSliceNoL2Prefetch (8): decode-warp variant 10's evict-first K/V copies drop the .L2::256B
//     prefetch-size hint. The hint lets the L2 fetch whole 256-byte blocks, but at batch 256
//     the attention is bound by L2 throughput (ncu at 1.81 GHz: lts__throughput 90% of peak,
//     DRAM 82%), and without the hint the L2 moves fewer sectors between its two partitions
//     (ltcfabric 17.0 M vs 24.5 M sectors a layer, SM reads 50.5 M vs 52.6 M).
//   kSliceSwizzle (16): the swapped persistent decode warps (variant 10, head dims 65..128)
//     keep their K/V slices in unpadded rows with XOR-swizzled 16-byte chunks instead of
//     rows padded to 272 bytes, so each 128-byte line a copy fetches lands in one 128-byte
//     span of shared memory (paged_attention.cu, SliceRows). ncu of one batch-256 layer
//     (stop 20 call 1, bench/results/cuda_ab_stop20_h200.json): the copies read 33.7 M
//     sectors from L2 (the K/V bytes, 1.08 GB) vs 50.5 M padded; 262.9 vs 273.9 µs. Graph
//     ITL on the power-capped H200 (copy 4.277 TB/s): 14.96-15.02 ms vs 15.54-15.55.
// Why: at Llama-3-8B batch 256 the persistent decode warps issue ~600 instructions a 16-key
// slice and run below the copy bandwidth (ncu: DRAM 81.5% of peak with 128 KB in flight per
// SM, one instruction per 5.6 cycles a warp); fewer instructions moved them only ~0.3%.
// Only kernels at padded head dims ≤ kSliceMathMaxDim use bits 1 and 2 (bits 4 and 8 apply
// at every dim, bit 16 only to variant 10's swapped launches, at padded head dim 128): with
// bits 1 and 2 DeepSeek-V2-Lite's 192-wide MHA-form prefill (kind 0) took 28.75 ms of
// attention at 4k tokens vs 24.8 without.
// H200, Llama-3-8B decode at 256 × 1k, one process each (bench/results/cuda_ab_stop14_h200.json):
// 3: 15.086 / 15.108 ms (attention 282.5 µs a layer), 0: 15.125 / 15.163 (283.7), 1: 15.153 /
// 15.142, 2: 15.121 / 15.118; batch 1 and 64 within noise.
// kSliceLean, H200 (copy 4.251 TB/s), Llama-3-8B batch 256 × 1k, one process each, stop 18
// call 1 (bench/results/cuda_ab_stop18_h200.json): 7: 15.107 / 15.113 ms (attention 280.3 /
// 279.5 µs a layer), 3: 15.187 / 15.193 (282.7 / 282.3); batch 64 (ring kernels, which it
// does not change) 6.855-6.860 either way. With the contiguous-slice copies (from call 2) and
// fusion: 15.054 / 15.070 vs 15.385 (call 11); on the power-capped type, unfused, 15.497 /
// 15.514 vs 15.688 / 15.694 (call 2).
// kSliceNoL2Prefetch, stop 19 (bench/results/cuda_ab_stop19_h200.json), graph ITL at batch
// 256: 15.426-15.434 ms vs 15.461-15.502 with the hint on a machine running at 1.30 of its
// roofline (call 9), 14.948 / 14.955 vs 14.935 / 14.940 on a faster one (call 5).
// Default 31. Process-wide, read when a launch is enqueued (captured graphs keep theirs).
// InvalidArgument for other values. PagedAttentionSliceMath returns it.
inline constexpr int kSliceLdmatrixK = 1;
inline constexpr int kSliceLazyRescale = 2;
inline constexpr int kSliceLean = 4;
inline constexpr int kSliceNoL2Prefetch = 8;
inline constexpr int kSliceSwizzle = 16;
inline constexpr int kSliceMathMaxDim = 128;
absl::Status SetPagedAttentionSliceMath(int bits);
int PagedAttentionSliceMath();

// SetPagedAttentionDecodeSwapped(on): decode-warp variant 10 launches whose (sequence, KV head)
// units hold ≤ 8 query rows (query tokens × group), with or without decode fusion, run the
// swapped GQA math (paged_attention.cu "Swapped GQA decode math": keys on the mma's m16 side,
// query rows on n8; half the mma and accumulators of the m16-row form, which pads GQA group 4
// to 16 rows).
// Same results within bf16 rounding (another summation order). On by default: H200, Llama-3-8B
// batch 256 × ~1k keys, attention 263.3-265.8 µs a layer vs 276.2-276.7, graph ITL 14.78-14.89
// ms vs 15.11-15.22 (bench/results/cuda_ab_stop15_h200.json). Read when a launch is planned
// (captured graphs keep theirs). PagedAttentionDecodeSwappedLaunches counts the launches that
// took it (tests).
void SetPagedAttentionDecodeSwapped(bool on);
bool PagedAttentionDecodeSwapped();
int64_t PagedAttentionDecodeSwappedLaunches();

// SetPagedAttentionPrefetchBeforeWait(on): whether decode launches issue their first K/V copies
// (of keys below the context lengths) before their programmatic dependency wait
// (PagedAttentionCuda's PDL note; paged_attention.cu "PrefetchBeforeWait"). Fused launches
// (PagedAttentionRopeDecodeCuda) on the persistent decode warps then also write each unit's
// new key right before copying the slice that holds it, instead of every unit's before the
// first copy. On by default; off is for A/B runs. Read when a launch is enqueued (captured
// graphs keep theirs).
void SetPagedAttentionPrefetchBeforeWait(bool on);
bool PagedAttentionPrefetchBeforeWait();

// SetPagedAttentionPrefillKernel: the kernel of prefill-shaped launches (some sequence's query
// rows, query tokens × group, exceed one 16-row tile). 0: 64-row CTA tiles of 4 warps × 16
// rows, 64-key tiles, 2 stages. 1..2: the prefill kernels of paged_attention.cu
// (PagedPrefillKernel: Q in shared memory read with ldmatrix, ldmatrix K/V fragments, one
// barrier per key tile, the softmax scale folded into the exponent's FFMA): 1: 128-row CTA
// tiles (4 warps × 32 rows: each K/V fragment feeds twice the mmas), 32-key tiles, 3 stages;
// 2: 64-row tiles (4 warps × 16), 64-key tiles, 2 stages. Settings 1..2 apply to head dims up
// to 128 with a positive scale; other launches keep kernel 0. Same results as kernel 0 within
// bf16 rounding (the exponent's rounding differs), deterministic. Process-wide, for benchmarks
// and tests; set it before sizing workspaces or capturing graphs (the split plan depends on
// it). 3..7: the FlashAttention-2 tile shapes of paged_prefill_fa2.cu (128 rows × 64 keys;
// 3: 4 warps × 32 rows, 4: 8 warps × 16 rows with Q in registers, 5: as 4 with 3 stages,
// 6: as 3 with a lighter K/V copy path, 7: as 6 with the copies issued after Q·Kᵀ;
// paged_prefill_device.cuh), for padded head dims 64 and 128 with a positive scale; other
// prefill launches use kernel 1 (or 0 as above). 15 (the default): the Hopper wgmma kernel of
// paged_prefill_wgmma.cu (2 warpgroups × 64 rows, 64-key tiles, wgmma.mma_async for Q·Kᵀ and
// P·V) for head dims 128/128 with a positive scale and no sliding window on a compute 9.0 device
// running sm_90a code; other launches take kernel 3's path (or 1 as above); H200 Llama-3-8B
// prefill 16k: attention ≈ 200-205 ms against ≈ 237-243 ms for kernel 3. InvalidArgument
// outside 0..7 and 15.
// PagedAttentionPrefillKernel returns it. Measured on an
// H200 (Llama-3-8B shapes, one sequence, 32 layers; bench/results/cuda_llama8b_h200.json):
// attention 36.8 / 18.9 / 22.5 ms at 4k tokens and 534 / 277 / 324 ms at 16k for 0 / 1 / 2.
absl::Status SetPagedAttentionPrefillKernel(int kernel);
int PagedAttentionPrefillKernel();

// SetPagedAttentionPdl: launch the attention kernel and its split-KV combine as programmatic
// dependents of the kernel before each (cudaLaunchAttributeProgrammaticStreamSerialization;
// the kernels wait on griddepcontrol before reading their inputs), so their launch overlaps
// the predecessor's tail. Process-wide, off by default, ignored below sm_90; graph-capturable
// (CUDA ≥ 12.3 turns it into programmatic graph edges). kernels::SetDecodePdl(true) turns it on
// as well (the whole decode step as one programmatic chain).
void SetPagedAttentionPdl(bool enabled);

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
