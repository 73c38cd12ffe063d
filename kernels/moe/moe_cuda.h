// CUDA mixture-of-experts ops: router logits, top-k routing and the routed SwiGLU experts, with
// bf16 storage and fp32 accumulation. Same formulas as the CPU references beside them
// (moe_routing.h: transformers' `DeepseekV3TopkRouter` / DeepSeek-V3 report arXiv:2412.19437
// §2.1.2; moe_experts.h: transformers' `DeepseekV3MoE.moe`, modeling_deepseek_v3.py).
//
// Launcher conventions (kernels/cuda/cuda_common.h): device pointers, work enqueued on `stream`,
// no host synchronization, no allocation (scratch comes from a caller-owned workspace), so every
// call can be captured in a CUDA graph. Arguments are checked on the host from sizes, pointers
// and alignment only; device-resident values (expert ids) are never read back.
#ifndef SLUICE_KERNELS_MOE_MOE_CUDA_H_
#define SLUICE_KERNELS_MOE_MOE_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/moe/moe_routing.h"

namespace sluice::kernels {

class MoePrefillGemm;  // moe_prefill_gemm_cuda.h

// Largest num_experts the CUDA MoE kernels accept (routing keeps a per-lane bitmask of taken
// experts; the expert sort keeps per-expert counters in shared memory).
inline constexpr int64_t kMoeCudaMaxExperts = 1024;

// MoeRouterLogitsCuda: logits[t, e] = Σ_h x[t, h] · w_gate[e, h] in fp32 (bf16 operands widened
// exactly, fp32 products and sums), as transformers' DeepseekV3TopkRouter computes the router
// in fp32 (`F.linear(x.float(), weight.float())`).
//   x:      [num_tokens, hidden] bf16, 16-byte aligned
//   w_gate: [num_experts, hidden] bf16 (`mlp.gate.weight`), 16-byte aligned
//   logits: [num_tokens, num_experts] fp32 out, overwritten
// A token's logits do not depend on num_tokens (batch invariant).
// Errors: InvalidArgument for num_tokens < 0, num_experts outside [1, kMoeCudaMaxExperts],
// hidden < 8 or hidden % 8 != 0, a null or misaligned pointer (when num_tokens > 0); Internal
// for launch errors.
absl::Status MoeRouterLogitsCuda(const bf16* x, const bf16* w_gate, int64_t num_tokens,
                                 int64_t hidden, int64_t num_experts, float* logits,
                                 cudaStream_t stream);

// MoeRoutingCuda: MoeRoutingCpu on the device (moe_routing.h has the formula). One warp per
// token; the scoring, group scores, group ranking, top-k selection (descending choice score,
// ties: lower expert index first) and the weight normalization follow the CPU reference
// operation by operation (softmax and norm sums in the same sequential order), so ids equal
// MoeRoutingCpu's and weights agree to fp32 rounding (CUDA's expf may differ from the host's by
// an ulp).
//   router_logits:   [num_tokens, num_experts], fp32 (or the bf16 overload below)
//   correction_bias: [num_experts] fp32 (`e_score_correction_bias`), or null
//   topk_ids:        [num_tokens, top_k] int32 out
//   topk_weights:    [num_tokens, top_k] fp32 out
// Errors: those of ValidateMoeRoutingParams; InvalidArgument for num_tokens < 0,
// num_experts > kMoeCudaMaxExperts or null pointers (when num_tokens > 0); Internal for launch
// errors.
absl::Status MoeRoutingCuda(const float* router_logits, const float* correction_bias,
                            int64_t num_tokens, const MoeRoutingParams& params, int32_t* topk_ids,
                            float* topk_weights, cudaStream_t stream);
// Same, with bf16 router logits (widened exactly to fp32 first).
absl::Status MoeRoutingCuda(const bf16* router_logits, const float* correction_bias,
                            int64_t num_tokens, const MoeRoutingParams& params, int32_t* topk_ids,
                            float* topk_weights, cudaStream_t stream);

// MoeCudaWorkspace: caller-owned device scratch of MoeExpertsCuda (not owned here). Size it with
// MoeCudaWorkspaceBytes for the largest batch; 16-byte aligned (cudaMalloc memory is).
struct MoeCudaWorkspace {
  void* data = nullptr;
  size_t bytes = 0;
  // Optional, not owned: large steps on the grouped path then run their GEMMs per expert on
  // cuBLASLt when prefill_gemm->Takes(...) (moe_prefill_gemm_cuda.h; SetMoePrefillGemm). That
  // path synchronizes the stream once and is never taken during stream capture; its results
  // are not batch invariant (cuBLASLt's algorithm may depend on an expert's row count).
  MoePrefillGemm* prefill_gemm = nullptr;
};

// MoeCudaWorkspaceBytes: workspace bytes MoeExpertsCuda needs for up to max_tokens tokens:
// per-expert offsets and tile counts, the expert-sorted row permutation and its inverse, the
// SwiGLU activations [max_tokens·top_k, intermediate] bf16 and the per-row expert outputs
// [max_tokens·top_k, hidden] bf16 (each segment 256-byte aligned). 0 for non-positive sizes.
size_t MoeCudaWorkspaceBytes(int64_t max_tokens, int64_t top_k, int64_t num_experts, int64_t hidden,
                             int64_t intermediate);

// MoeExpertsPath picks MoeExpertsCuda's implementation. All give the same result up to fp32
// summation order (each rounds the activations and the expert outputs to bf16 once).
enum class MoeExpertsPath {
  kAuto,     // kGemv for num_tokens <= kMoeGemvMaxTokens; else kStream while the average rows
             // per expert num_tokens·top_k / num_experts <= kMoeStreamMaxRowsPerExpert (never
             // at 0); else kGrouped
  kGemv,     // decode: per touched expert, a warp per output column streams that expert's
             // weight rows once for up to 8 of its tokens per pass (only the selected experts
             // are read)
  kStream,   // medium batches: per touched expert, a warp per output column (two for down)
             // streams those weight rows once in 1024-element register chunks, applies each chunk
             // to all of the expert's rows (up to 64 per pass over the weights), 8 rows
             // register-blocked at a time; per-row sums in shared memory
  kGrouped,  // prefill: grouped tensor-core GEMMs (bf16 WMMA, fp32 accumulators) over the
             // expert-sorted rows; per-expert row counts stay on the device
};
inline constexpr int64_t kMoeGemvMaxTokens = 8;
// SetMoeGemvMaxTokens: kAuto's bound for kGemv (default kMoeGemvMaxTokens), process-wide, for
// benchmarks that compare the paths at a batch size (e.g. kGemv at 64 tokens, where kGrouped's
// 64-row tiles hold ~6 real rows per expert). InvalidArgument for n < 0.
absl::Status SetMoeGemvMaxTokens(int64_t n);
int64_t MoeGemvMaxTokens();
// kAuto's bound on num_tokens·top_k / num_experts for kStream; 0: kAuto never picks it. On the
// H200 (2026-11-29, DeepSeek-V2-Lite shapes in cuda_decode_bench, batch 64: 6 rows per expert)
// the routed experts took 27.2 ms per step through kStream against 15.3 ms through kGrouped, so
// kStream stays an explicit choice (tested) until it beats the grouped GEMM.
inline constexpr int64_t kMoeStreamMaxRowsPerExpert = 0;

// MoeExpertsCuda: the routed-expert output of MoeExpertsCpu (moe_experts.h) on the device,
//   out[t] = bf16(Σ_k w[t, k] · down_e(silu(gate_e(x[t])) ⊙ up_e(x[t]))),  e = topk_ids[t, k]
// Steps: device-side counting sort of the (token, k) rows by expert; gate/up GEMM fused with
// SiLU·mul (activations rounded to bf16); down GEMM (expert outputs rounded to bf16); combine
// per token in k order in fp32 with one final rounding. No atomics touch the outputs and each
// row is computed independently of the others, so results are deterministic and a token's
// output does not depend on the other tokens of the batch (for a fixed path).
//   x:            [num_tokens, hidden] bf16
//   topk_ids:     [num_tokens, top_k] int32 (device), experts in [0, num_experts); a row whose id
//                 is outside that range contributes nothing (ids are not read on the host)
//   topk_weights: [num_tokens, top_k] fp32 (device)
//   w_gate_up:    [num_experts, 2·intermediate, hidden] bf16: per expert gate_proj rows, then
//                 up_proj rows (the CPU MoeExpertWeights::gate_up layout, experts stacked)
//   w_down:       [num_experts, hidden, intermediate] bf16 (down_proj, experts stacked)
//   out:          [num_tokens, hidden] bf16, overwritten; may alias x (x is last read before
//                 out is written)
//   workspace:    at least MoeCudaWorkspaceBytes(num_tokens, top_k, num_experts, hidden,
//                 intermediate) bytes; must not overlap the other arguments
// num_tokens == 0 enqueues nothing.
// Errors: InvalidArgument for num_tokens < 0, num_experts outside [1, kMoeCudaMaxExperts],
// top_k outside [1, num_experts], hidden or intermediate not a multiple of 8 in [8, 2^22],
// num_tokens·top_k > 2^31 - 1, a null pointer, x / w_gate_up / w_down / out / workspace not
// 16-byte aligned (topk_ids and topk_weights need only their natural alignment), or a
// workspace that is too small; Internal for launch errors.
absl::Status MoeExpertsCuda(const bf16* x, const int32_t* topk_ids, const float* topk_weights,
                            int64_t num_tokens, int64_t hidden, int64_t intermediate, int64_t top_k,
                            int64_t num_experts, const bf16* w_gate_up, const bf16* w_down,
                            bf16* out, MoeCudaWorkspace workspace, cudaStream_t stream,
                            MoeExpertsPath path = MoeExpertsPath::kAuto);

// ---- Fused decode path. At decode batch sizes the MoE block is latency-bound: the separate
// path enqueues six kernels (router logits, routing, expert sort, gate/up GEMV, down GEMV,
// combine), most of them a few microseconds of one or a few CTAs. The fused path enqueues
// three: MoeFusedRouteCuda (logits + routing + sort in one block) and MoeFusedExpertsCuda
// (gate/up GEMV with SiLU·mul, then down GEMV + combine [+ shared-expert add] in one launch),
// with 16-byte weight loads issued a row-chunk at a time. Its results equal the separate
// path's (MoeRouterLogitsCuda → MoeRoutingCuda → MoeExpertsCuda with kGemv) bit for bit.

// Bounds of the fused path: num_tokens <= kMoeFusedMaxTokens, num_tokens·top_k <=
// kMoeFusedMaxRows.
inline constexpr int64_t kMoeFusedMaxTokens = 8;
inline constexpr int64_t kMoeFusedMaxRows = 64;

// SetMoeDecodeVariant: which MoE path model runners (engine/cuda/cuda_deepseek_runner.cc) use
// for steps the fused path supports: 0 the separate launches, 1 the fused path, 2 the fused
// path plus the runner's own fused decode plumbing (the DeepSeek runner: its MLA prologue and
// absorbed-query GEMV, engine/cuda/deepseek_kernels.h), 3 as 2 with the shared
// experts folded into the fused expert launches (MoeSharedExpert; not bit-equal to cuBLAS's
// SwiGLU), 4 as 3 with the multi-block routing (MoeFusedRouteMode::kMultiBlock), which also
// computes the shared experts' gate/up while the routing waits for its last block, and with
// MoeFusedExpertsCuda's down launch a programmatic dependent of its gate/up launch on sm_90+
// (it starts during the gate/up tail and prefetches its first weights into L2; same results
// as 3 bit for bit), 5 as 4 with pipelined, persistent weight streaming: the gate/up launch is
// one wave of about two blocks per SM whose warps walk (expert, column) tasks interleaved
// across the touched experts, the shared gate/up blocks of the multi-block routing are
// persistent likewise (the routing blocks come first in the grid), and every warp of these and
// of the down launch keeps the next chunk of weight loads in flight while it reduces the
// current one (same results as 4 bit for bit), 6 as 5 with the experts' gate/up launch a
// programmatic dependent of the routing launch on sm_90+ (launched while the routing runs; it
// waits for the routing's completion before it reads anything; same bits; the default), 7 as 6
// with the shared experts' gate/up moved from the routing launch to the head of the experts'
// gate/up launch, computed before that launch waits for the routing (it reads only x and the
// shared weights, final once the routing launch has started: see MoePipedGateUpKernel), so
// each warp streams the shared columns and then its routed columns with no launch boundary
// between them; the routing launch is then only its ⌈E/8⌉ routing blocks (same bits as 6).
// 8: the whole MoE block (router logits, routing, shared and routed experts, combine) in one
// persistent cooperative launch, MoeBlockDecodeCuda below, for steps MoeBlockDecodeSupported
// takes (else variant 6's path; same bits as 6).
// Measured on an H200, DeepSeek-V2-Lite shapes, batch-1 ITL: 0 3.115 ms, 1 3.029, 2 2.886,
// 3 2.743 (bench/results/cuda_dsv2lite_h200.json); with the MLA decode fusion 3: 4 2.461,
// 5 2.411-2.425, 6 2.396-2.408; on 2026-11-30 6 2.333-2.336 and 8 2.445-2.446 (slower; see
// MoeBlockDecodeCuda).
// Process-wide, for benchmarks and tests; read when a step is enqueued, so set it before
// capturing graphs. InvalidArgument outside 0..8. MoeDecodeVariant returns the setting.
absl::Status SetMoeDecodeVariant(int variant);
int MoeDecodeVariant();

// MoeFusedDecodeSupported: whether MoeFusedRouteCuda takes these sizes: 1 <= num_tokens <=
// kMoeFusedMaxTokens, num_tokens·top_k <= kMoeFusedMaxRows, num_experts <= kMoeCudaMaxExperts,
// and the block's shared memory (num_tokens · (3·E + n_group) floats) within 48 KiB.
bool MoeFusedDecodeSupported(int64_t num_tokens, const MoeRoutingParams& params);

// MoeSharedExpert: DeepSeekMoE's shared experts (one SwiGLU of width intermediate =
// moe_intermediate_size · n_shared_experts), folded into MoeFusedExpertsCuda's two launches.
//   w_gate_up: [2·intermediate, hidden] bf16 (gate rows, then up rows); w_down: [hidden,
//   intermediate] bf16; act: scratch [num_tokens, intermediate] bf16. All 16-byte aligned.
//   act_ready: act already holds the SwiGLU activations bf16(silu(gate(x)) ⊙ up(x)) of these
//   tokens (MoeFusedRouteCuda with this shared expert computed them), so MoeFusedExpertsCuda
//   only adds the down projection.
struct MoeSharedExpert {
  const bf16* w_gate_up = nullptr;
  const bf16* w_down = nullptr;
  int64_t intermediate = 0;
  bf16* act = nullptr;
  bool act_ready = false;
};

// MoeFusedRouteMode picks MoeFusedRouteCuda's kernel; both give the same ids, weights and sort
// bit for bit.
enum class MoeFusedRouteMode {
  kSingleBlock,  // one block reads the whole router matrix (E · hidden bf16) from one SM
  kMultiBlock,   // a warp per router row over ceil(E / 8) blocks, logits through the workspace;
                 // the last block to arrive (device-scope counter, reset by that block) routes
                 // and sorts. Optionally also the shared expert's gate/up (more blocks).
};

// MoeFusedRouteCuda: MoeRouterLogitsCuda + MoeRoutingCuda (fp32 logits) in one launch, same ids
// and weights bit for bit; also leaves the expert sort of the ids in `workspace` for
// MoeFusedExpertsCuda.
//   x:      [num_tokens, hidden] bf16, 16-byte aligned; w_gate: [E, hidden] bf16, 16-byte aligned
//   correction_bias: [E] fp32 or null
//   topk_ids / topk_weights: [num_tokens, top_k] int32 / fp32 out
//   workspace: at least MoeCudaWorkspaceBytes(num_tokens, top_k, E, hidden, intermediate) bytes
//   mode: see MoeFusedRouteMode. kMultiBlock keeps an arrival counter per workspace address
//     (process-wide table of 1024 device counters, each back at 0 after every launch; past
//     1024 distinct workspaces a counter in the workspace, zeroed by a memset node before the
//     launch), so launches on one workspace must be stream-ordered (as its sort data requires).
//   shared: kMultiBlock only (InvalidArgument with kSingleBlock): also writes shared->act =
//     bf16(silu(gate(x)) ⊙ up(x)) for the shared expert (the values MoeFusedExpertsCuda would
//     compute); pass it to MoeFusedExpertsCuda with act_ready = true. Under decode variant 7
//     (SetMoeDecodeVariant) the launch only asks L2 for the shared gate/up weights (with
//     DecodePdl, before its wait) and leaves act alone: pass act_ready = false then.
// Errors: those of ValidateMoeRoutingParams; InvalidArgument for sizes MoeFusedDecodeSupported
// rejects, hidden not a positive multiple of 8, null or misaligned pointers, a workspace that
// is too small, a shared expert with bad sizes or pointers; Internal for launch errors.
absl::Status MoeFusedRouteCuda(const bf16* x, const bf16* w_gate, const float* correction_bias,
                               int64_t num_tokens, int64_t hidden, const MoeRoutingParams& params,
                               int32_t* topk_ids, float* topk_weights, MoeCudaWorkspace workspace,
                               cudaStream_t stream,
                               MoeFusedRouteMode mode = MoeFusedRouteMode::kSingleBlock,
                               const MoeSharedExpert* shared = nullptr);

// MoeFusedExpertsCuda: MoeExpertsCuda's output (kGemv path, bit for bit) for the ids that the
// preceding MoeFusedRouteCuda call on the same `workspace` (same num_tokens, top_k, E; nothing
// else writing the workspace in between) sorted, optionally plus a shared-expert output:
//   out[t] = bf16(Σ_k w[t, k] · expert_out[t, k])                  (add == null)
//   out[t] = bf16(add[t] + bf16(Σ_k w[t, k] · expert_out[t, k]))   (AddInPlaceCuda's rounding)
// With `shared`, its output s[t] = bf16(down(bf16(silu(gate(x[t])) ⊙ up(x[t])))) (fp32 sums,
// SiLU·mul on the fp32 gate and up sums) is added first the same way: bf16(s[t] + routed),
// then `add` if given (shared->act_ready: the activations are taken from shared->act). (The separate path's cuBLAS SwiGLU rounds gate and up to bf16 before
// SiLU·mul and sums in another order: equal to bf16 rounding, not bit for bit.)
// x, w_gate_up, w_down, out: as MoeExpertsCuda (16-byte aligned); topk_weights [num_tokens,
// top_k] fp32; add [num_tokens, hidden] bf16 or null; out may alias x or add.
// Errors: InvalidArgument for num_tokens outside [1, kMoeFusedMaxTokens], num_tokens·top_k >
// kMoeFusedMaxRows, the shape errors of MoeExpertsCuda, null or misaligned pointers, a workspace
// that is too small, a shared expert with bad sizes or pointers; Internal for launch errors.
absl::Status MoeFusedExpertsCuda(const bf16* x, const float* topk_weights, int64_t num_tokens,
                                 int64_t hidden, int64_t intermediate, int64_t top_k,
                                 int64_t num_experts, const bf16* w_gate_up, const bf16* w_down,
                                 const bf16* add, bf16* out, MoeCudaWorkspace workspace,
                                 cudaStream_t stream, const MoeSharedExpert* shared = nullptr);

// ---- Decode variant 8: the MoE block in one launch. At batch 1 the three launches of
// variant 6 spend about as long in launch and drain boundaries as in streaming weights; here
// one persistent grid (every block resident at once: a cooperative launch, two 256-thread
// blocks per SM) runs the phases back to back with two grid-wide barriers instead of kernel
// boundaries:
//   1. router logits (a warp per router row) and then the shared experts' gate/up + SiLU·mul
//      (a warp per column, pipelined weight loads; the router rows finish first);
//   barrier A (router logits written), then every block routes the tokens itself from the
//      logits (RouteToken, warp t for token t) and sorts the (token, k) rows by expert in a
//      fixed order (no atomics: every block gets the same sort), so there is no second
//      round trip through memory for the ids;
//   2. the routed experts' gate/up + SiLU·mul, (expert, column) tasks interleaved across the
//      touched experts, continuing each warp's share of one task list with the shared columns;
//   barrier B (all activations written; optionally each warp asks L2 for its down rows before
//      waiting: kMoeBlockTuneNoRoutedDownPrefetch below);
//   3. down + combine: a warp per output column streams that column's row of every touched
//      expert and of the shared expert, and sums them in a fixed order (k order, then the
//      shared output added), writing out directly (no atomics on the output). Under
//      kMoeBlockTuneRingDown the rows stream through a per-warp ring in shared memory
//      (kRingStages = 4 chunks of 192 16-byte vectors, cp.async: the loads in flight hold no
//      registers, so each warp keeps up to ~11 KiB in flight instead of ~3 KiB of register
//      chunks), a column's shared row first: its first chunks are issued before the routing
//      (they depend on nothing; the memory is otherwise idle while the blocks route) and the
//      rest of the ring's first chunks (routed rows) right after the warp's phase-2 work, so
//      weights stream through barrier B's drain. Same per-lane sum order, butterfly, roundings
//      and combine order: the same bits.
// The barriers are arrival counters in device memory whose top bit flips once per barrier
// (the last block to arrive completes it; block 0 adds 2^31 - (blocks - 1), every other block
// 1), so a counter is back at its starting state after every launch: CUDA-graph replays need
// no reset node. Counters are kept per workspace address like MoeFusedRouteCuda's.
// The per-dot-product sums, roundings and combine order are those of variants 4-7, so out,
// topk_ids and topk_weights equal variant 6's (MoeFusedRouteCuda kMultiBlock with the shared
// expert + MoeFusedExpertsCuda) bit for bit, and a token's results do not depend on the
// other tokens of the step.
// Measured on an H200 (2026-11-30, DeepSeek-V2-Lite shapes, batch 1, cuda_decode_bench graph
// ITL, 3 runs each): variant 6 2.333-2.336 ms; variant 8 with the default tuning (3, no L2
// prefetches) 2.445-2.446 ms, with the prefetches (tuning 0) 2.559, route-first (32)
// 2.753-2.758: slower than 6. Eager per MoE layer: 6 19.0 (routing) + 43.8 (experts) µs, 8
// 63.4 µs. Phase trace of one launch (MoeBlockDecodeTrace, tuning 3, µs from the first block's
// start, median over 264 blocks): router rows + shared gate/up done 5.9 (the router rows wait
// ~5 µs behind the shared stream), barrier A 6.6, routing + sort 12.7 (RouteToken on one warp
// per block: ~6 µs of no streaming), routed gate/up 28.5 (69 MB in ~16 µs: ~4.3 TB/s), barrier
// B 33.3 (slowest block 32.4), down + combine 55.0 (46 MB in ~22 µs: 2.1 TB/s, latency-bound:
// a warp per column walks its 7 rows with 2 chunks of loads in flight). So what is left is
// the routing on the critical path and the down phase's concurrency, not launch boundaries.
// kMoeBlockTuneRingDown (2026-11-30, helper hE2, not yet measured when written) targets the
// down phase: A/B it as tuning 131 (= 3 | 128) against 3; the timeline probe
// (DISABLED_TimelineV2LiteShapes) traces 131 and 163 too.

// MoeBlockDecodeSupported: whether MoeBlockDecodeCuda takes a step of num_tokens tokens with
// these routing params on the current device under the current tuning: MoeFusedDecodeSupported's
// bounds, its shared memory (a few KiB, + 96 KiB under kMoeBlockTuneRingDown) within the
// device's per-block opt-in limit, and at least one of its blocks fitting an SM (occupancy API;
// the grid is then as many blocks as fit at once, at most two per SM). False on any CUDA error.
bool MoeBlockDecodeSupported(int64_t num_tokens, const MoeRoutingParams& params);

// MoeBlockDecodeCuda: the DeepSeek MoE block for a decode step in one launch:
//   ids, weights = routing(x · w_gate^T)                   (MoeFusedRouteCuda's, bit for bit)
//   routed[t]    = bf16(Σ_k w[t, k] · bf16(down_e(bf16(silu(gate_e(x[t])) ⊙ up_e(x[t])))))
//   out[t]       = shared ? bf16(bf16(down_s(bf16(silu(gate_s(x[t])) ⊙ up_s(x[t])))) + routed[t])
//                         : routed[t]
// (MoeFusedExpertsCuda's formula with add == null; see the variant-8 notes above).
//   x:           [num_tokens, hidden] bf16; w_gate: [E, hidden] bf16 (router)
//   correction_bias: [E] fp32 or null
//   w_gate_up:   [E, 2·intermediate, hidden] bf16; w_down: [E, hidden, intermediate] bf16
//   shared:      optional shared experts (MoeSharedExpert; act is scratch [num_tokens,
//                shared->intermediate] bf16, overwritten; act_ready is ignored)
//   topk_ids / topk_weights: [num_tokens, top_k] int32 / fp32 out (written by block 0)
//   out:         [num_tokens, hidden] bf16, overwritten; may alias x (x is last read before
//                barrier B, out first written after it)
//   workspace:   MoeCudaWorkspaceBytes(num_tokens, top_k, E, hidden, intermediate) bytes at
//                least (router logits, activations, fallback barrier counters); launches on
//                one workspace must be stream-ordered
// All pointers 16-byte aligned except topk_ids, topk_weights and correction_bias (natural
// alignment). Past 1024 distinct workspaces the barrier counters live in the workspace and a
// memset node zeroes them before each launch.
// Errors: those of ValidateMoeRoutingParams; InvalidArgument for steps MoeFusedDecodeSupported
// rejects, hidden or intermediate not a multiple of 8 in [8, 2^22], null or misaligned
// pointers, a workspace that is too small, a shared expert with bad sizes or pointers;
// FailedPrecondition when MoeBlockDecodeSupported is false for the step (the grid cannot be
// made resident at once); Internal for launch errors.
absl::Status MoeBlockDecodeCuda(const bf16* x, const bf16* w_gate, const float* correction_bias,
                                int64_t num_tokens, int64_t hidden, int64_t intermediate,
                                const MoeRoutingParams& params, const bf16* w_gate_up,
                                const bf16* w_down, const MoeSharedExpert* shared,
                                int32_t* topk_ids, float* topk_weights, bf16* out,
                                MoeCudaWorkspace workspace, cudaStream_t stream);

// SetMoeBlockDecodeTuning: A/B flags of MoeBlockDecodeCuda (process-wide, read when a launch is
// enqueued; the default kMoeBlockTuneDefault was the fastest setting measured, see above;
// results are the same bits under every setting). InvalidArgument outside 0..kMoeBlockTuneAll.
inline constexpr int kMoeBlockTuneNoSharedDownPrefetch = 1;  // no L2 prefetch of the shared
                                                             // down rows before the routing
inline constexpr int kMoeBlockTuneNoRoutedDownPrefetch = 2;  // no L2 prefetch of the routed
                                                             // down rows before barrier B
inline constexpr int kMoeBlockTuneOneBlockPerSm = 4;         // grid of one block per SM, not two
inline constexpr int kMoeBlockTuneSpinBackoff = 8;           // __nanosleep between barrier polls
inline constexpr int kMoeBlockTuneTrace = 16;  // thread 0 of each block records %globaltimer at
                                               // the phase boundaries (MoeBlockDecodeTrace)
inline constexpr int kMoeBlockTuneRouteFirst = 32;  // route first (the blocks ask L2 for their
                                                    // shared gate/up rows meanwhile), then the
                                                    // shared and routed gate/up as one stream
inline constexpr int kMoeBlockTuneNoCooperative = 64;  // a plain launch of the same grid (only
                                                       // for A/B: co-residency then rests on
                                                       // nothing else running beside it)
inline constexpr int kMoeBlockTuneRingDown = 128;  // phase 3 streams its weight rows through a
                                                   // per-warp cp.async ring in shared memory
                                                   // (96 KiB per block), its first chunks
                                                   // issued before barrier B (see above);
                                                   // flags 1 and 2 are then no-ops
inline constexpr int kMoeBlockTuneAll = 255;
inline constexpr int kMoeBlockTuneDefault =
    kMoeBlockTuneNoSharedDownPrefetch | kMoeBlockTuneNoRoutedDownPrefetch;
absl::Status SetMoeBlockDecodeTuning(int flags);
int MoeBlockDecodeTuning();
// MoeBlockDecodeBlocks: the grid MoeBlockDecodeCuda launches for such a step under the current
// tuning (0: not supported).
int64_t MoeBlockDecodeBlocks(int64_t num_tokens, const MoeRoutingParams& params);
// MoeBlockDecodeTrace: after a launch under kMoeBlockTuneTrace (synchronize first), the
// timestamps (ns) of its first `blocks` blocks, [block][8]: start, router rows done (arrival at
// barrier A), shared gate/up done, barrier A passed, routing + sort done, routed gate/up done
// (arrival at B), barrier B passed, down + combine done. InvalidArgument for blocks outside
// [1, 1024]; Internal on a copy error.
absl::StatusOr<std::vector<uint64_t>> MoeBlockDecodeTrace(int64_t blocks);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MOE_MOE_CUDA_H_
