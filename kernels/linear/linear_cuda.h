// CUDA linear layer through cuBLASLt: y = x · Wᵀ (+ bias), bf16 storage with fp32 accumulation.
// Launcher conventions: kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_LINEAR_LINEAR_CUDA_H_
#define SLUICE_KERNELS_LINEAR_LINEAR_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/linear/linear_options.h"

namespace sluice::kernels {

// CublasLt owns a cuBLASLt handle, a device workspace and a cache of matmul plans (descriptors
// plus the heuristic's algorithm) keyed by shape, bias and pointer alignment. Thread-safe
// (calls are serialized by a mutex). Use one per device.
class CublasLt {
 public:
  // Default workspace: 32 MiB, as NVIDIA recommends for Hopper.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;
  // Create makes the handle and allocates the workspace on the current device; `options`
  // (linear_options.h) say what its autotuner times.
  // Errors: InvalidArgument for options out of range (tune_candidates outside 1..64,
  // algo_search not a mask of kGemmSearch* bits); Internal for cuBLAS/CUDA failures (e.g. no
  // device).
  static absl::StatusOr<std::unique_ptr<CublasLt>> Create(
      size_t workspace_bytes = kDefaultWorkspaceBytes, const LinearOptions& options = {});
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  const LinearOptions& options() const;
  // set_autotune(max_m): each new (shape, bias, alignment) plan with m <= max_m is tuned on its
  // first call made outside stream capture: up to options().tune_candidates of the
  // heuristic's algorithms and, for m <= kGemvMaxRows, GemvCuda are timed on that call's
  // operands (7 runs each; the stream is synchronized) and the fastest is kept. A plan first met
  // during capture keeps the heuristic's pick. 0 (the default) turns tuning off, so every call
  // stays asynchronous; meant for the few decode shapes, not for every prefill length.
  void set_autotune(int64_t max_m);
  // DescribePlans: one line per cached plan (shape, chosen kernel, cuBLASLt algo/tile/split-K,
  // tuned timings in microseconds), for benchmarks.
  std::string DescribePlans();
  // setup_seconds: host seconds spent so far in calls that created a plan (a shape met the
  // first time: cuBLASLt's heuristic query, tuning if on, and the first launch, which loads the
  // kernel's module): one-off costs that later calls of the shape do not pay.
  double setup_seconds();
  CublasLt& operator=(const CublasLt&) = delete;

  struct Impl;

 private:
  explicit CublasLt(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend absl::Status LinearCuda(CublasLt& lt, const bf16* x, const bf16* w, const bf16* bias,
                                 bf16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
  friend absl::Status LinearSiluMulCuda(CublasLt& lt, const bf16* x, const bf16* w,
                                        const bf16* bias, bf16* gate_up, bf16* out, int64_t m,
                                        int64_t inter, int64_t k, cudaStream_t stream);
};

// LoadGemmTuning(path): merges a GEMM tuning table (kernels/linear/gemm_tuning_table.h) into
// the process's table, which every CublasLt's autotuner (set_autotune) consults before timing:
// a plan whose (shape, bias, alignments, SiLU·mul epilogue) is there, tuned with at least the
// CublasLt's LinearOptions::algo_search bits, takes the saved choice (after cublasLtMatmulAlgoCheck / the
// GEMV variant checks; otherwise it is timed as usual) without timing or synchronizing.
// `path` is a table file, or a directory holding GemmTuningFileName(<this GPU's name>).
// Returns the entries taken: 0 for a directory without this GPU's file or a table of another
// GPU model (name, compute capability, SM count); only GEMV entries when the table's
// cuBLASLt version differs. Errors: NotFound for a missing file path; InvalidArgument for a
// malformed table (naming the file and field); Internal for CUDA or read failures.
absl::StatusOr<int> LoadGemmTuning(const std::string& path);
// SaveGemmTuning(path): writes the process's table — loaded entries plus every plan the
// autotuner timed since — for the current GPU to `path` (a file, or GemmTuningFileName in a
// directory), atomically (write + rename). Returns the file written. Errors: Internal for
// CUDA or write failures.
absl::StatusOr<std::string> SaveGemmTuning(const std::string& path);

// Largest m GemvCuda serves.
inline constexpr int64_t kGemvMaxRows = 8;

// GemvCuda: the same product as LinearCuda for few rows, y[m, n] = bf16(Σ_k x[m, k]·w[n, k] +
// bias[n]) with fp32 accumulation, as one bandwidth-oriented kernel: `split` warps per output
// column (1, 2, 4 or 8) each stream one slice of w[n, :] once with 16-byte loads, `unroll`
// (4, 8 or 16) of them in flight per lane, and the slices' fp32 sums are added in slice order.
// Served (unroll, split): (4|8|16, 1), (4|8, 2), (4|8, 4), (4, 8); LinearCuda's autotuner
// picks one per shape. Results are deterministic for a given (unroll, split); different choices
// differ only in fp32 summation order. Needs 1 <= m <= kGemvMaxRows, k % 8 == 0 and 16-byte
// aligned x and w (y and bias: element alignment). y must not overlap x or w.
// Errors: InvalidArgument when those do not hold; Internal for launch errors.
// `pdl`: a programmatic dependent launch (LinearOptions::pdl's rules).
absl::Status GemvCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                      int64_t n, int64_t k, cudaStream_t stream, int unroll = 4, int split = 1,
                      bool pdl = false);

// Largest m SkinnyGemmCuda serves.
inline constexpr int64_t kSkinnyGemmMaxRows = 64;
// The rows at which LinearCuda's autotuner times SkinnyGemmCuda (LinearOptions::skinny_tuning):
// where it won in the decode graph (bench/results/cuda_ab_stop16_h200.json); m = 1 keeps the
// GEMV, whose programmatic-launch overlap is worth more.
inline constexpr int64_t kSkinnyTuneMinRows = 2;
inline constexpr int64_t kSkinnyTuneMaxRows = 8;
// The search bit (GemmTuningChoice::search_mask) of tuning-table entries whose timing included
// SkinnyGemmCuda: for the shapes it is timed at, LinearCuda's autotuner looks entries up with
// this bit too, so a table made before the kernel existed is timed again there instead of
// applied.
inline constexpr int kGemmTunedSkinny = 8;

// SkinnyGemmCuda: the same product as LinearCuda for decode batches, y[m, n] = bf16(Σ_k
// x[m, k]·w[n, k] + bias[n]), fp32 accumulation, as one weight-streaming tensor-core kernel
// (kernels/linear/skinny_gemm.cu): each warp streams 32 rows of w over a range of k through
// a cp.async ring of `stages` (3 or 4) 64-wide k-blocks in shared memory, x goes through a ring
// per k range, and mma.m16n8k16 multiplies them (weights on the m16 side, 8 tokens on n8);
// `split` (1, 2, 4 or 8) warps of a CTA share 32 rows over consecutive k ranges and their fp32
// sums are added in k order through shared memory. Deterministic for a given (split, stages);
// different choices and LinearCuda's other kernels differ only in fp32 summation order.
// LinearCuda's autotuner times it at kSkinnyTuneMinRows..kSkinnyTuneMaxRows rows. Needs
// 1 <= m <= kSkinnyGemmMaxRows, 1 <= n < 2^30, k a positive multiple of 8 below 2^31,
// 16-byte aligned x and w (y and bias: element alignment), and a (split, stages) whose rings,
// stages · (32 KiB + split · M · 128 B) with M = m rounded up to 1, 2, 4 or 8 groups of 8,
// fit in 227 KiB (e.g. at m = 64 not split 8, nor split 4 with 4 stages); y must not overlap
// x or w. `pdl`: a programmatic dependent launch (LinearOptions::pdl's rules).
// Errors: InvalidArgument when those do not hold; Internal for launch errors.
absl::Status SkinnyGemmCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                            int64_t n, int64_t k, cudaStream_t stream, int split = 1,
                            int stages = 4, bool pdl = false);
// SkinnyGemmSiluMulCuda: SkinnyGemmCuda on a fused [gate; up] weight w [2n, k] (bias [2n] or
// null) with GemvSiluMulCuda's epilogue: y[r, j] = bf16(silu(g)·u), g and u the bf16-rounded
// products j and n + j, y [m, n]. Each warp holds 16 gate rows and the matching 16 up rows, so
// the epilogue pairs them in registers. Needs and errors as SkinnyGemmCuda (for 2n rows).
absl::Status SkinnyGemmSiluMulCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                                   int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                                   int split = 1, int stages = 4, bool pdl = false);

// LinearCuda computes y[m, n] = bf16(Σ_k x[m, k] · w[n, k] + bias[n]) (LinearCpu's layout:
// row-major, contiguous; bias [n] may be null), accumulating in fp32 (CUBLAS_COMPUTE_32F) and
// rounding once. The algorithm is chosen by cuBLASLt's heuristic per (m, n, k), so unlike
// LinearCpu a row's bits may depend on m. y must not overlap x or w.
// Errors: InvalidArgument for m, n or k < 1 or > INT32_MAX-sized leading dimensions;
// Internal for cuBLASLt failures (e.g. no algorithm for this shape).
absl::Status LinearCuda(CublasLt& lt, const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                        int64_t m, int64_t n, int64_t k, cudaStream_t stream);

// GemvSiluMulCuda: GemvCuda on a fused [gate; up] weight followed by SiluMulCuda, in one
// kernel: y[r, j] = bf16(silu(g) · u) with g = bf16(Σ_k x[r, k]·w[j, k] + bias[j]) and
// u = bf16(Σ_k x[r, k]·w[n + j, k] + bias[n + j]) for j < n (silu(g) = g / (1 + e^-g), fp32).
// w: [2n, k], bias: [2n] or null, y: [m, n]. Each sum is GemvCuda's for the same
// (unroll, split), so the result equals GemvCuda into a [m, 2n] buffer then SiluMulCuda, bit
// for bit. Served (unroll, split): (4|8|16, 1), (4|8, 2), (4|8, 4). Needs what GemvCuda needs.
// Errors: InvalidArgument when those do not hold; Internal for launch errors.
absl::Status GemvSiluMulCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                             int64_t n, int64_t k, cudaStream_t stream, int unroll = 4,
                             int split = 1, bool pdl = false);

// LinearSiluMulCuda: out = SiluMulCuda(LinearCuda(x, w, bias)) for a fused [gate; up] weight
// w [2·inter, k] (bias [2·inter] or null), out [m, inter]; gate_up [m, 2·inter] is scratch.
// When LinearCuda's plan for (m, 2·inter, k) is a GEMV variant that GemvSiluMulCuda serves,
// one fused kernel runs (same sums, bit-equal; gate_up untouched, no SiLU·mul launch);
// otherwise LinearCuda writes gate_up and SiluMulCuda follows. Tuning as LinearCuda.
// Errors: those of LinearCuda and SiluMulCuda; InvalidArgument for inter < 1 or >= 2^30 or
// null gate_up / out.
absl::Status LinearSiluMulCuda(CublasLt& lt, const bf16* x, const bf16* w, const bf16* bias,
                               bf16* gate_up, bf16* out, int64_t m, int64_t inter, int64_t k,
                               cudaStream_t stream);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LINEAR_LINEAR_CUDA_H_
