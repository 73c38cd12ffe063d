// Small CUDA kernels of the model runner that are not model ops of their own: step plumbing
// (resolving fed-back token ids, gathering the rows whose logits are wanted), greedy sampling,
// and dummy-weight generation. Launcher conventions: kernels/cuda/cuda_common.h (device
// pointers, enqueued on `stream`, no synchronization, graph-capturable; `pdl`: a programmatic
// dependent launch that reads nothing before its wait).
#ifndef SLUICE_ENGINE_CUDA_RUNNER_KERNELS_H_
#define SLUICE_ENGINE_CUDA_RUNNER_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/dummy_weights.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::cuda_runner {

using kernels::bf16;

// ResolveTokenIdsCuda: for t < n, a negative ids[t] = -(r + 1) is replaced by sampled[r] (the
// token the previous step sampled for its logits row r), so decode steps can feed tokens back
// without a host round trip. Non-negative ids are left alone. ids: [n] int32, in place.
absl::Status ResolveTokenIdsCuda(int32_t* ids, int64_t n, const int32_t* sampled,
                                 cudaStream_t stream);

// GatherRowsCuda: out[r, :] = in[idx[r], :] for r < rows; in/out [*, dim] bf16 contiguous,
// idx [rows] int32 (device; must be valid rows of `in`).
absl::Status GatherRowsCuda(const bf16* in, const int32_t* idx, int64_t rows, int64_t dim,
                            bf16* out, cudaStream_t stream, bool pdl = false);

// ArgmaxRowsCuda: out[r] = argmax_j logits[r, j] (lowest index on ties; NaN never wins) for
// r < rows; logits [rows, vocab] bf16, out [rows] int32. One thread block per row.
absl::Status ArgmaxRowsCuda(const bf16* logits, int64_t rows, int64_t vocab, int32_t* out,
                            cudaStream_t stream, bool pdl = false);

// GreedyLogprobRowsCuda: out[r] = log_softmax(logits[r, :])[ids[r]] for r < rows, where ids[r]
// must be the row's argmax (ArgmaxRowsCuda's output): computed as -log(sum_j exp(x_j - x_id))
// in fp32 over the non-NaN, non -inf entries (the host sampler's LogSumExp skips the same);
// NaN for a row whose chosen logit is -inf or NaN. logits [rows, vocab] bf16, ids [rows] int32
// (valid ids), out [rows] float32, all device. One thread block per row.
// Errors: InvalidArgument for rows < 0, vocab < 1 or null pointers (rows > 0).
absl::Status GreedyLogprobRowsCuda(const bf16* logits, const int32_t* ids, int64_t rows,
                                   int64_t vocab, float* out, cudaStream_t stream);

// FillDummyCuda: out[i] = bf16(value of element `first + i` of a dummy tensor) for i < n, with
// DummyNormal(tensor_seed, first + i) for kNormal, 1 for kOnes, 0 for kZeros
// (engine/model/dummy_weights.h: the same values as the CPU loader before bf16 rounding).
absl::Status FillDummyCuda(bf16* out, int64_t n, uint64_t tensor_seed, DummyInit init,
                           cudaStream_t stream);

// QkHeadRmsNormCuda: Qwen3's per-head q/k RMSNorm (transformers' Qwen3Attention: q_norm and
// k_norm over each head's head_dim channels, before RoPE), in place on fused QKV rows.
//   qkv: bf16 [num_tokens, token_stride]; a row holds num_heads q heads at 0, then num_kv_heads
//        k heads, head_dim channels each (v follows and is untouched)
//   q_weight / k_weight: bf16 [head_dim]
// Each head x (of the first num_tokens rows) becomes x · rsqrt(mean(x²) + eps) · weight,
// computed in fp32 (sum of squares, then per element x · inv · weight), rounded once to bf16
// — the formula of kernels/rms_norm's RmsNormCpu on one head. One warp per (token, head).
// Errors: InvalidArgument for sizes < 1 (num_tokens may be 0: no launch), token_stride
// shorter than the q+k heads, or null pointers; Internal for launch errors.
absl::Status QkHeadRmsNormCuda(bf16* qkv, int64_t num_tokens, int64_t token_stride,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               const bf16* q_weight, const bf16* k_weight, float eps,
                               cudaStream_t stream, bool pdl = false);

// SpinCuda: one thread busy-waits for `ns` nanoseconds of the GPU's global timer (holds the
// stream, e.g. so a profiled step's kernels queue up behind it).
absl::Status SpinCuda(int64_t ns, cudaStream_t stream);

// HoldSmsCuda: `ctas` CTAs that each take an SM's whole shared memory and busy-wait for `ns`
// nanoseconds: kernels launched on other streams meanwhile that use shared memory (the GEMM,
// attention, norm and reduction kernels) run on the remaining SMs only (tests of SM-count
// independence; kernels without shared memory may still fill the held SMs' spare threads). ctas must not exceed the
// SM count (else some wait for a free SM). Errors: InvalidArgument for ctas < 1 or ns < 0;
// Internal for CUDA errors.
absl::Status HoldSmsCuda(int64_t ctas, int64_t ns, cudaStream_t stream);

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_RUNNER_KERNELS_H_
