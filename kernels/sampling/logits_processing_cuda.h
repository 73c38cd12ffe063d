// CUDA logits processing (min_tokens suppression, repetition / frequency / presence penalties)
// and raw logprobs with top-N alternatives, on the bf16 logits of a step in device memory.
// Reference: logits_processing.h (LogitsProcessingCpu, LogSumExpCpu, TopLogprobsCpu), the
// semantics of engine/sample/sampler.cc's SampleToken.
//
// Launcher conventions (kernels/cuda/cuda_common.h): device pointers, work enqueued on `stream`,
// no host synchronization, no allocation, no device value read back (CUDA-graph capturable).
#ifndef SLUICE_KERNELS_SAMPLING_LOGITS_PROCESSING_CUDA_H_
#define SLUICE_KERNELS_SAMPLING_LOGITS_PROCESSING_CUDA_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/sampling/logits_processing.h"

namespace sluice::kernels {

// LogitsProcessingCudaWorkspaceBytes: the uint32 per-token marks LogitsProcessingCuda needs,
// rows * vocab * 4 bytes. The workspace must be all zero on the first call (cudaMemset once);
// every call leaves it all zero again (each mark is cleared by the thread that consumes it).
size_t LogitsProcessingCudaWorkspaceBytes(int64_t rows, int64_t vocab);

// LogitsProcessingCuda: out[r] = LogitsProcessingCpu's row r for every r < rows, bit for bit —
// the penalties use the CPU's fp32 operations, separately rounded (no FMA contraction):
//   repetition (distinct ids of prompt ∪ output, when p != 1): v > 0 ? v / p : v * p
//   then, for ids with output count c > 0 (when frequency or presence != 0):
//     v = (v - frequency * float(c)) - presence
//   then -inf at every suppress-list id; -inf at every token a row's grammar mask clears
//   (LogitsProcessingRow::mask_begin, applied while the row is widened).
// out holds fp32 values (a penalized logit is generally no bf16 value); feed it to the fp32
// SampleRowsCuda. Ids t < 0 read prev_sampled[-t - 1] (device memory: the previous step's
// sampled tokens, written earlier on `stream`); a reference >= num_prev, null prev_sampled, or a
// resolved id outside [0, vocab) is ignored. Duplicate ids are fine (counted for frequency).
//   logits:       [rows, vocab] bf16, device (raw, not modified)
//   params:       [rows] LogitsProcessingRow, device
//   ids:          the lists' id array, device (may be null when every list is empty)
//   masks:        the rows' token bitmasks, device (may be null when no row has a mask)
//   prev_sampled: [num_prev] int32, device, or null
//   out:          [rows, vocab] fp32, device
//   workspace:    >= LogitsProcessingCudaWorkspaceBytes(rows, vocab), device, zero on entry
// Cost: one CTA of 256 threads per row: one bf16 read + fp32 write of the row, then
// O(list lengths) atomics and gathers (lists are read twice).
// Errors: InvalidArgument for rows < 0, vocab < 1 or >= 2^31, a null logits / params / out /
// workspace pointer when rows > 0, a too small workspace; Internal for launch errors.
absl::Status LogitsProcessingCuda(const bf16* logits, int64_t rows, int64_t vocab,
                                  const LogitsProcessingRow* params, const int32_t* ids,
                                  const uint32_t* masks, const int32_t* prev_sampled,
                                  int64_t num_prev, float* out,
                                  void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Most top logprobs per row LogprobRowsCuda returns (OpenAI's top_logprobs limit, vLLM's
// default max_logprobs; engine/sample/sampling_params.cc kMaxLogprobs).
inline constexpr int32_t kMaxTopLogprobs = 20;

// LogprobRowsCuda: log_softmax of the raw logits of each row r < rows at tokens[r] (a row with
// a grammar mask, mask_rows[r].mask_begin >= 0: of its masked logits, -inf where the mask
// clears a token, as the host samples a structured-output row from), and the
// row's top_counts[r] best tokens with their log_softmax values:
//   logprobs[r] = (raw[tokens[r]] - max) - log(Σ exp(raw - max))   (fp32 sum over entries
//                 > -inf; NaN for a row with nothing finite or a token outside [0, vocab));
//   top_ids[r, j], top_logprobs[r, j] for j < min(top_counts[r], vocab): TopLogprobsCpu's
//                 entries (descending raw value, the lower id first on ties, NaN skipped); the
//                 remaining slots j < max_top get id -1 and logprob NaN.
// Logprobs agree with the float64 reference to ~1e-5 absolute for real vocabularies.
//   logits:     [rows, vocab] bf16, device (the raw logits)
//   mask_rows:  [rows] LogitsProcessingRow, device, whose mask_begin is read; null: no masks
//   masks:      the rows' token bitmasks, device (null when no row has one)
//   tokens:     [rows] int32, device (e.g. the sampled tokens of the same stream)
//   top_counts: [rows] int32, device, each clamped to [0, max_top]; null: no top entries
//   max_top:    in [0, kMaxTopLogprobs]; top_ids / top_logprobs are [rows, max_top] (may be null
//               when max_top is 0)
//   logprobs:   [rows] fp32 out, device
// Cost: one CTA of 256 threads per row, two reads of the row (max and sum; the top-N pass
// shares the second), then min(count, vocab) block reductions.
// Errors: InvalidArgument for rows < 0, vocab outside [1, 2^31), max_top outside
// [0, kMaxTopLogprobs], null pointers that are needed; Internal for launch errors.
absl::Status LogprobRowsCuda(const bf16* logits, int64_t rows, int64_t vocab,
                             const LogitsProcessingRow* mask_rows, const uint32_t* masks,
                             const int32_t* tokens, const int32_t* top_counts, int32_t max_top,
                             float* logprobs, int32_t* top_ids, float* top_logprobs,
                             cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_SAMPLING_LOGITS_PROCESSING_CUDA_H_
