// CUDA token sampling: SampleRowCpu's rule (sampling.h) on bf16 logits in device memory, one
// CTA per row, greedy and sampled rows mixed in one launch.
//
// Launcher conventions (kernels/cuda/cuda_common.h): device pointers, work enqueued on `stream`,
// no host synchronization, no allocation, no device value read back, so a call can be captured
// in a CUDA graph. Arguments are checked on the host from sizes and pointers only.
#ifndef SLUICE_KERNELS_SAMPLING_SAMPLING_CUDA_H_
#define SLUICE_KERNELS_SAMPLING_SAMPLING_CUDA_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/sampling/sampling.h"

namespace sluice::kernels {

// Largest vocab SampleRowsCuda accepts: probabilities are summed in uint64 fixed point
// (deterministic integer atomics) with 63 - ceil(log2(vocab)) fraction bits; 2^24 keeps >= 39.
inline constexpr int64_t kSampleRowsCudaMaxVocab = (int64_t{1} << 24) - 1;

// SampleRowsCudaWorkspaceBytes: the device scratch SampleRowsCuda needs for these sizes. The
// current kernel keeps everything in shared memory and needs 0 bytes; callers should still
// size their workspace with this so a later multi-CTA-per-row kernel can use it.
size_t SampleRowsCudaWorkspaceBytes(int64_t rows, int64_t vocab);

// SampleRowsCuda: for each row r < rows, tokens[r] and logprobs[r] as SampleRowCpu(logits[r],
// vocab, params[r]) gives them (sampling.h has the rule), with these numeric differences:
//  - scaled logits x = bf16 logit / temperature are computed exactly as on the CPU (fp32
//    division), so argmax, min_p, top_k and the rank order are the same;
//  - probabilities are exp(double(x) - max) as on the CPU, rounded to fixed point (>= 39
//    fraction bits) and summed exactly as integers (deterministic, order-free): the top_p cut
//    and the draw may differ from the float64 reference only where its
//    SampleRowResult::margin is below ~1e-10;
//  - logprobs are log_softmax of the raw logits from an fp32 sum (abs. error ~1e-5).
// Rows where every logit is -inf/NaN give token 0 and logprob NaN, as the CPU does.
// Logits are assumed to satisfy |logit / temperature| < FLT_MAX (real models' logits do).
// Deterministic: the same inputs give bit-identical outputs (fixed-order reductions).
//   logits:   [rows, vocab] bf16, device (any alignment; 16-byte aligned rows with vocab % 8 == 0
//             take vector loads)
//   params:   [rows] SamplingRow, device (uniform in [0, 1) per sampled row)
//   tokens:   [rows] int32 out, device;  logprobs: [rows] fp32 out, device
//   workspace: device scratch of at least SampleRowsCudaWorkspaceBytes(rows, vocab) (may be
//             null when that is 0)
// Cost: one CTA of 512 threads per row (64 registers, 18.5 KB shared: two CTAs per SM); every
// row reads its logits twice (argmax, log-sum-exp); a sampled row then reads them once per
// radix pass: for vocab ~150k, 3 passes for the plain draw and 5 per select with top_k / top_p
// (top_k, top_p cut, draw: up to 15). The top_k and top_p selects copy their candidates into
// shared memory once the cut's bf16 value is known (after 2 of their 5 passes), or their members
// after the select, where at most 2048 exist (the copy pass stops early once they do not fit),
// and the remaining passes read only them: a row with top_k (and top_p), or with a top_p that
// keeps few tokens, reads the logits 5 times instead of 12-17. H200, 256 rows × 151,936: top_k
// 50 0.375 ms, top_k 50 + top_p 0.9 0.38, top_p 0.9 keeping most tokens 1.45-1.54, temperature
// only 0.42 (cuda_kernel_bench --sampling-only).
// Errors: InvalidArgument for rows < 0, vocab outside [1, kSampleRowsCudaMaxVocab], a null
// pointer when rows > 0, or a too small workspace; Internal for launch errors.
absl::Status SampleRowsCuda(const bf16* logits, int64_t rows, int64_t vocab,
                            const SamplingRow* params, int32_t* tokens, float* logprobs,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream);

// SampleRowsCuda over fp32 logits [rows, vocab] (device; 16-byte aligned rows with vocab % 4 == 0
// take vector loads): the same rule and guarantees, for logits no bf16 holds (the processed
// logits of LogitsProcessingCuda, logits_processing_cuda.h). The rank order keys the scaled
// value x = logit / T (fp32 division, as the CPU) itself, so equal x rank by the lower id as on
// the CPU; a rank select then takes 32 + ceil(log2(vocab)) bits (vocab ~150k: 7 passes instead
// of 5). `logprobs` are log_softmax of these (processed) logits at the token; the engine reports
// the raw ones (LogprobRowsCuda). Logits must be finite or -inf (NaN entries are never chosen).
absl::Status SampleRowsCuda(const float* logits, int64_t rows, int64_t vocab,
                            const SamplingRow* params, int32_t* tokens, float* logprobs,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_SAMPLING_SAMPLING_CUDA_H_
