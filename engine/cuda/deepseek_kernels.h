// Small CUDA kernels of the DeepSeek runner (cuda_deepseek_runner.cc) that are layout plumbing
// rather than model ops. Launcher conventions: kernels/cuda/cuda_common.h (device pointers,
// enqueued on `stream`, no synchronization, graph-capturable).
#ifndef SLUICE_ENGINE_CUDA_DEEPSEEK_KERNELS_H_
#define SLUICE_ENGINE_CUDA_DEEPSEEK_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::cuda_runner {

using kernels::bf16;

// StridedCopy describes [num_tokens, num_heads, width] bf16 spans of a wider buffer:
// element (t, h, i) is at ptr[t · token_stride + h · head_stride + i].
struct HeadSpans {
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// CopyHeadsCuda: dst(t, h, i) = src(t, h, i) for t < num_tokens, h < num_heads, i < width
// (e.g. the q_pe channels of every head into the absorbed query, the k_pe channels into the
// latent cache row). Spans of dst must not overlap src.
// Errors: InvalidArgument for negative sizes; Internal for launch errors.
absl::Status CopyHeadsCuda(const bf16* src, HeadSpans src_spans, bf16* dst, HeadSpans dst_spans,
                           int64_t num_tokens, int64_t num_heads, int64_t width,
                           cudaStream_t stream);

// AddInPlaceCuda: y[i] = bf16(float(y[i]) + float(x[i])) for i < n (x, y bf16, contiguous).
// Errors: InvalidArgument for n < 0; Internal for launch errors.
absl::Status AddInPlaceCuda(bf16* y, const bf16* x, int64_t n, cudaStream_t stream);

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_DEEPSEEK_KERNELS_H_
