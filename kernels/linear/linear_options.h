// LinearOptions: the choices of a CublasLt (linear_cuda.h): what its autotuner times for a new
// decode GEMM shape, and how its own kernels launch (CublasLt::Create takes them;
// cuda_runner::CudaRunnerOptions::linear carries them for model runners). Plain data; no CUDA
// needed to include it.
#ifndef SLUICE_KERNELS_LINEAR_LINEAR_OPTIONS_H_
#define SLUICE_KERNELS_LINEAR_LINEAR_OPTIONS_H_

#include <cstdint>

namespace sluice::kernels {

// Bits of LinearOptions::algo_search (gemm_algo_search.h), for plans with
// kGemmSearchMinRows <= m <= the autotune limit:
//   kGemmSearchAlgos   (1): every cuBLASLt algorithm configuration (EnumerateAlgos) is timed
//                           next to the heuristic's picks;
//   kGemmSearchSplitN  (2): wave-aligned two-part N splits (SplitGemm), kept only when faster;
//   kGemmSearchStreams (4): with 2, the split's parts also timed on two streams (fork/join).
inline constexpr int kGemmSearchAlgos = 1;
inline constexpr int kGemmSearchSplitN = 2;
inline constexpr int kGemmSearchStreams = 4;
inline constexpr int64_t kGemmSearchMinRows = 64;

struct LinearOptions {
  // How many of cuBLASLt's heuristic algorithms the autotuner times per new plan, 1..64.
  int tune_candidates = 8;
  // Whether the autotuner also times SkinnyGemmCuda (and applies tuning-table choices of it)
  // for kSkinnyTuneMinRows <= m <= kSkinnyTuneMaxRows (linear_cuda.h).
  bool skinny_tuning = true;
  // The wider search (mask of the bits above; 0: the heuristic's candidates only). It adds
  // ~30 s of tuning at Llama-3-8B shapes, once per process; a GEMM tuning table made with it
  // (scripts/make_gemm_tuning.sh) gives its choices to processes that run without it.
  int algo_search = 0;
  // Launch the GEMV and skinny GEMM kernels LinearCuda / LinearSiluMulCuda pick (and time) as
  // programmatic dependents of the kernel before them (kernels/cuda/pdl.cuh; only where
  // PdlSupported()). As such they load their first weight vectors before the dependency wait,
  // so nothing that may still run may write the weights. cuBLASLt's own kernels launch plainly.
  // CUDA model runners set it from CudaRunnerOptions::decode_pdl_level (>= 1).
  bool pdl = false;
  // Batch-invariant mode (kernels/linear/batch_invariant_linear.h): every LinearCuda /
  // LinearSiluMulCuda call of this CublasLt runs BatchInvariantLinearCuda, whose per-element
  // k order depends on (n, k) only, never on m; no cuBLASLt, tuning or tuning table.
  bool batch_invariant = false;
  // The CTA count that mode's k-split aims for (BatchInvariantGemmSplit; a constant, never the
  // SM count, so the bits are the same on every GPU): 128 covers an H100/H200 once at split 8
  // for 4,096-column projections (two 32-row passes at batch 64); 64 keeps them at split 4 and
  // one 64-row pass. For A/B runs (cuda_decode_bench --batch-invariant-gemm-ctas).
  int batch_invariant_target_ctas = 128;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LINEAR_LINEAR_OPTIONS_H_
