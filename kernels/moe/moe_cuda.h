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

#include "absl/status/status.h"
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
  // cuBLASLt when prefill_gemm->Takes(...) (moe_prefill_gemm_cuda.h; MoeOptions). That
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

// MoeExpertsPath picks MoeExpertsCuda's implementation. Both give the same result up to fp32
// summation order (each rounds the activations and the expert outputs to bf16 once).
enum class MoeExpertsPath {
  kAuto,     // kGemv for num_tokens <= kMoeGemvMaxTokens, else kGrouped
  kGemv,     // decode: per touched expert, a warp per output column streams that expert's
             // weight rows once for up to 8 of its tokens per pass (only the selected experts
             // are read)
  kGrouped,  // prefill: grouped tensor-core GEMMs (bf16 WMMA, fp32 accumulators) over the
             // expert-sorted rows; per-expert row counts stay on the device
};
inline constexpr int64_t kMoeGemvMaxTokens = 8;

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
// three: MoeFusedRouteCuda (logits over many blocks, the last of which routes and sorts; also
// the shared experts' gate/up) and MoeFusedExpertsCuda (gate/up GEMV with SiLU·mul over a
// persistent grid, then down GEMV + combine [+ shared-expert output] in one launch), each a
// programmatic dependent of the launch before it on sm_90+, with each warp's next weight
// loads in flight while it reduces the current ones. Its routed results equal the separate
// path's (MoeRouterLogitsCuda → MoeRoutingCuda → MoeExpertsCuda with kGemv) bit for bit.
// Model runners take it for every step MoeFusedDecodeSupported accepts.

// Bounds of the fused path: num_tokens <= kMoeFusedMaxTokens, num_tokens·top_k <=
// kMoeFusedMaxRows.
inline constexpr int64_t kMoeFusedMaxTokens = 8;
inline constexpr int64_t kMoeFusedMaxRows = 64;

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

// MoeFusedRouteCuda: MoeRouterLogitsCuda + MoeRoutingCuda (fp32 logits) in one launch, same ids
// and weights bit for bit; also leaves the expert sort of the ids in `workspace` for
// MoeFusedExpertsCuda.
//   x:      [num_tokens, hidden] bf16, 16-byte aligned; w_gate: [E, hidden] bf16, 16-byte aligned
//   correction_bias: [E] fp32 or null
//   topk_ids / topk_weights: [num_tokens, top_k] int32 / fp32 out
//   workspace: at least MoeCudaWorkspaceBytes(num_tokens, top_k, E, hidden, intermediate) bytes
//   shared: null, or the shared expert: the launch also writes shared->act =
//     bf16(silu(gate(x)) ⊙ up(x)) (the values MoeFusedExpertsCuda would compute); pass it to
//     MoeFusedExpertsCuda with act_ready = true.
// The routing blocks meet at an arrival counter per workspace address (a process-wide table
// of 1024 device counters, each back at 0 after every launch; past 1024 distinct workspaces a
// counter in the workspace, zeroed by a memset node before the launch), so launches on one
// workspace must be stream-ordered (as its sort data requires). pdl: the launch is a
// programmatic dependent of the kernel before it (kernels/cuda/pdl.cuh; the DeepSeek runner's
// decode PDL level 3), reading x and writing only after its wait (dropped when the counter
// memset node would break the chain).
// Errors: those of ValidateMoeRoutingParams; InvalidArgument for sizes MoeFusedDecodeSupported
// rejects, hidden not a positive multiple of 8, null or misaligned pointers, a workspace that
// is too small, a shared expert with bad sizes or pointers; Internal for launch errors.
absl::Status MoeFusedRouteCuda(const bf16* x, const bf16* w_gate, const float* correction_bias,
                               int64_t num_tokens, int64_t hidden, const MoeRoutingParams& params,
                               int32_t* topk_ids, float* topk_weights, MoeCudaWorkspace workspace,
                               cudaStream_t stream, const MoeSharedExpert* shared = nullptr,
                               bool pdl = false);

// MoeFusedExpertsCuda: MoeExpertsCuda's output (kGemv path, bit for bit) for the ids that the
// preceding MoeFusedRouteCuda call on the same `workspace` (same num_tokens, top_k, E; nothing
// else writing the workspace in between) sorted, optionally plus a shared-expert output:
//   out[t] = bf16(Σ_k w[t, k] · expert_out[t, k])                  (add == null)
//   out[t] = bf16(add[t] + bf16(Σ_k w[t, k] · expert_out[t, k]))   (AddInPlaceCuda's rounding)
// With `shared`, its output s[t] = bf16(down(bf16(silu(gate(x[t])) ⊙ up(x[t])))) (fp32 sums,
// SiLU·mul on the fp32 gate and up sums) is added first the same way: bf16(s[t] + routed),
// then `add` if given (shared->act_ready: the activations are taken from shared->act). (The
// separate path's cuBLAS SwiGLU rounds gate and up to bf16 before
// SiLU·mul and sums in another order: equal to bf16 rounding, not bit for bit.)
// x, w_gate_up, w_down, out: as MoeExpertsCuda (16-byte aligned); topk_weights [num_tokens,
// top_k] fp32; add [num_tokens, hidden] bf16 or null; out may alias x or add.
// On sm_90+ the two launches are programmatic dependents of the launch before each; with `pdl`
// (decode PDL level 3) the down launch also lets the kernel after it launch early (that kernel
// must wait before it reads `out`).
// Errors: InvalidArgument for num_tokens outside [1, kMoeFusedMaxTokens], num_tokens·top_k >
// kMoeFusedMaxRows, the shape errors of MoeExpertsCuda, null or misaligned pointers, a workspace
// that is too small, a shared expert with bad sizes or pointers; Internal for launch errors.
absl::Status MoeFusedExpertsCuda(const bf16* x, const float* topk_weights, int64_t num_tokens,
                                 int64_t hidden, int64_t intermediate, int64_t top_k,
                                 int64_t num_experts, const bf16* w_gate_up, const bf16* w_down,
                                 const bf16* add, bf16* out, MoeCudaWorkspace workspace,
                                 cudaStream_t stream, const MoeSharedExpert* shared = nullptr,
                                 bool pdl = false);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MOE_MOE_CUDA_H_
