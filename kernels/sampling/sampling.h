// Token sampling over rows of logits: greedy argmax or temperature → min_p → top_k → top_p →
// one categorical draw with a caller-supplied uniform, plus the chosen token's logprob. The CPU
// reference (sampling_cpu.cc) and the CUDA kernel (sampling.cu, sampling_cuda.h) implement the
// same rule; engine/sample/sampler.cc's SampleToken is its source (vLLM v1 semantics) for rows
// without penalties, min_tokens suppression or top logprobs.
#ifndef SLUICE_KERNELS_SAMPLING_SAMPLING_H_
#define SLUICE_KERNELS_SAMPLING_SAMPLING_H_

#include <cstdint>

namespace sluice::kernels {

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
  // mass exceeds uniform · (kept mass). The engine takes it from the request's generator
  // exactly as SampleToken would (one draw per sampled token).
  double uniform = 0.0;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_SAMPLING_SAMPLING_H_
