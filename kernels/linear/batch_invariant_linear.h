// Batch-invariant linear layer: y = x · Wᵀ (+ bias) whose every output element is summed over
// k in an order fixed by (n, k) alone, so a row's bits do not depend on how many rows share
// the call (the number of tokens in a step). LinearCuda runs it for a CublasLt created with
// LinearOptions::batch_invariant.
//
// Why the order does not depend on m: the rows go through SkinnyGemmCuda's kernel
// (skinny_gemm.cu) in consecutive chunks of at most kBatchInvariantChunkRows(split) rows, each
// an independent launch of the same (split) variant. Inside it an output element (row r,
// column c) is one fp32 accumulator that receives the mma.m16n8k16 products of its k-blocks in
// increasing k order within each of `split` contiguous k slices, and the slices' sums are added
// in slice order; the other rows of its chunk only occupy other accumulator columns of the same
// mma (a tensor-core dot product of one A row and one B column does not read the others).
// `split` is chosen from (n, k) only (BatchInvariantGemmSplit), the chunk length and the ring
// depth (stages) only change which rows share a launch and how far copies run ahead, never an
// element's additions. Nothing depends on the GPU's SM count either: the grid is a function of
// n and split.
#ifndef SLUICE_KERNELS_LINEAR_BATCH_INVARIANT_LINEAR_H_
#define SLUICE_KERNELS_LINEAR_BATCH_INVARIANT_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels {

// The k-split of the batch-invariant GEMM for n output columns (glu: of the SiLU·mul output,
// whose weight has 2n rows): the smallest of 1, 2, 4, 8 that gives at least target_ctas CTAs
// (a fixed count, LinearOptions::batch_invariant_target_ctas, not the device's SM count, so
// the choice and the bits are the same on every GPU).
inline constexpr int64_t kBatchInvariantTargetCtas = 128;
int BatchInvariantGemmSplit(int64_t n, bool glu, int64_t target_ctas = kBatchInvariantTargetCtas);
// Rows per launch for a split: 64 (the kernel's largest token tile), 32 at split 8 (whose
// x rings at 64 rows exceed shared memory).
int64_t BatchInvariantChunkRows(int split);

// BatchInvariantLinearCuda: y[m, n] = bf16(Σ_k x[m, k]·w[n, k] + bias[n]), fp32 accumulation,
// per-element order as described above; any m >= 1. With glu, w is a fused [gate; up] weight
// [2n, k] (bias [2n] or null) and y [m, n] gets bf16(silu(g)·u) of the bf16-rounded products
// (LinearSiluMulCuda's values). Needs k a positive multiple of 8 and 16-byte aligned x and w
// (y and bias: element alignment); y must not overlap x or w.
// Errors: InvalidArgument when those do not hold (the message names the shape); Internal for
// launch errors.
absl::Status BatchInvariantLinearCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                                      int64_t m, int64_t n, int64_t k, bool glu,
                                      cudaStream_t stream,
                                      int64_t target_ctas = kBatchInvariantTargetCtas);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LINEAR_BATCH_INVARIANT_LINEAR_H_
