// Token sampling over rows of logits: greedy argmax or temperature → min_p → top_k → top_p →
// one categorical draw with a caller-supplied uniform, plus the chosen token's logprob. The CPU
// reference (sampling_cpu.cc) and the CUDA kernel (sampling.cu, sampling_cuda.h) implement the
// same rule; engine/sample/sampler.cc's SampleToken is its source (vLLM v1 semantics) for rows
// without penalties, min_tokens suppression or top logprobs.
#ifndef SLUICE_KERNELS_SAMPLING_SAMPLING_H_
#define SLUICE_KERNELS_SAMPLING_SAMPLING_H_

#include <cstdint>

namespace sluice::kernels {

// Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;

// SamplingRow: how one logits row is sampled. Plain data (copied to the device as is).
struct SamplingRow {
  // < 1e-5 (vLLM's _SAMPLING_EPS): greedy argmax (lowest id on ties); the other fields are
  // ignored. Otherwise the logits are divided by it.
  float temperature = 0.0f;
  int32_t top_k = 0;     // <= 0 or >= vocab: off
  float top_p = 1.0f;    // >= 1: off; in (0, 1)
  float min_p = 0.0f;    // <= 0: off; drop p_i < min_p · p_max
  int32_t pad = 0;
  // The row's draw in [0, 1): the categorical draw picks the first candidate whose cumulative
  // mass exceeds uniform · (kept mass). The engine computes it on the host exactly as
  // SampleToken would (the token's counter-based draw, engine/sample/philox.h).
  double uniform = 0.0;
};

// SampleRowResult is one row's outcome from the CPU reference.
struct SampleRowResult {
  int32_t token = 0;
  // log_softmax of the raw (unscaled) logits at `token` (float64 math, rounded): NaN for a row
  // of only -inf/NaN (raw[0] - (-inf)), as SampleToken reports it.
  float logprob = 0.0f;
  // How far the row's outcome is from flipping under tiny changes of the probabilities: the
  // smallest of |cumulative mass - target| / (mass it is relative to) over the decisions that
  // compare sums (the top_p cut and the draw's boundaries on both sides of the chosen token).
  // +inf for greedy rows. A device kernel that sums in another order / precision may pick a
  // neighbouring token only where this is tiny (tests skip such rows).
  double margin = 0.0;
};

// SampleRowCpu samples one row. `logits` is [vocab] float32 (not modified); vocab >= 1.
// Rule (engine/sample/sampler.cc SampleToken without penalties, min_tokens or top logprobs):
//  - temperature < 1e-5: argmax, lowest id on ties; NaN never wins; all -inf/NaN → 0.
//  - else x = logit / temperature (float32 division; skipped when temperature == 1), m = max x
//    (NaN ignored; if m is -inf: argmax of x, i.e. 0); candidates: x > -inf and, if min_p > 0,
//    not (double(x) - m < log(min_p)). Weights w = exp(double(x) - m).
//  - no top_k (<= 0 or >= vocab) and top_p >= 1: draw in ascending id order: the first
//    candidate whose cumulative w exceeds uniform · Σw (the last candidate if rounding says none).
//  - otherwise rank order (x descending, lower id first): keep the top_k best (if top_k < number
//    of candidates); if top_p < 1 keep the shortest rank prefix whose mass reaches
//    top_p · (kept mass), at least one; draw the first in rank order whose cumulative mass
//    exceeds uniform · (kept mass).
// The sums are float64 in SampleToken's order, so the token equals SampleToken's for the same
// uniform (its DrawUniform(key, kTokenDraw), engine/sample/philox.h).
SampleRowResult SampleRowCpu(const float* logits, int64_t vocab, const SamplingRow& params);

// SampleRowsCpu samples `rows` rows: logits [rows, vocab] float32 row-major, params [rows],
// tokens [rows] int32 and logprobs [rows] float32 out (SampleRowCpu per row).
void SampleRowsCpu(const float* logits, int64_t rows, int64_t vocab, const SamplingRow* params,
                   int32_t* tokens, float* logprobs);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_SAMPLING_SAMPLING_H_
