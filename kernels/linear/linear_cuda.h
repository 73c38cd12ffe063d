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

namespace sluice::kernels {

// CublasLt owns a cuBLASLt handle, a device workspace and a cache of matmul plans (descriptors
// plus the heuristic's algorithm) keyed by shape, bias and pointer alignment. Thread-safe
// (calls are serialized by a mutex). Use one per device.
class CublasLt {
 public:
  // Default workspace: 32 MiB, as NVIDIA recommends for Hopper.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;
  // Create makes the handle and allocates the workspace on the current device.
  // Errors: Internal for cuBLAS/CUDA failures (e.g. no device).
  static absl::StatusOr<std::unique_ptr<CublasLt>> Create(
      size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  // set_autotune(max_m): each new (shape, bias, alignment) plan with m <= max_m is tuned on its
  // first call made outside stream capture: up to GemmTuneCandidates() (default 8) of the
  // heuristic's algorithms and, for m <= kGemvMaxRows, GemvCuda are timed on that call's
  // operands (7 runs each; the stream is synchronized) and the fastest is kept. A plan first met
  // during capture keeps the heuristic's pick. 0 (the default) turns tuning off, so every call
  // stays asynchronous; meant for the few decode shapes, not for every prefill length.
  void set_autotune(int64_t max_m);
  // DescribePlans: one line per cached plan (shape, chosen kernel, cuBLASLt algo/tile/split-K,
  // tuned timings in microseconds), for benchmarks.
  std::string DescribePlans();
  CublasLt& operator=(const CublasLt&) = delete;

  struct Impl;

 private:
  explicit CublasLt(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend absl::Status LinearCuda(CublasLt& lt, const bf16* x, const bf16* w, const bf16* bias,
                                 bf16* y, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
  friend absl::Status AddRmsNormLinearCuda(CublasLt& lt, const bf16* delta, bf16* residual,
                                           bf16* residual_out, const bf16* gamma, float eps,
                                           bf16* normed, const bf16* w, const bf16* bias, bf16* y,
                                           int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                                           bool* residual_moved);
  friend absl::Status AddRmsNormLinearSiluMulCuda(
      CublasLt& lt, const bf16* delta, bf16* residual, bf16* residual_out, const bf16* gamma,
      float eps, bf16* normed, const bf16* w, const bf16* bias, bf16* gate_up, bf16* out,
      int64_t m, int64_t inter, int64_t k, cudaStream_t stream, bool* residual_moved);
  friend absl::Status LinearSiluMulCuda(CublasLt& lt, const bf16* x, const bf16* w,
                                        const bf16* bias, bf16* gate_up, bf16* out, int64_t m,
                                        int64_t inter, int64_t k, cudaStream_t stream);
};

// AddRmsNormLinearCuda: the pre-norm sublayer input and its projection, y = LinearCuda(
// RmsNorm(residual + delta) · gamma), as AddRmsNormCuda(delta, residual, gamma, normed) followed
// by LinearCuda(normed, w, bias, y). When GEMV/norm fusion is on (SetGemvNormFusion != 0) and the
// shape's tuned plan is a GEMV (decode rows, m <= 2, m·k <= 24576), one kernel does both: each
// CTA normalizes the rows itself, the new residual bf16(residual + delta) goes to residual_out
// (residual is left unchanged, normed unwritten) and *residual_moved is set; otherwise the
// residual is updated in place and *residual_moved is false. Callers keep two residual buffers
// and continue from residual_out when it moved. The fused kernel reproduces AddRmsNormCuda's
// rounding and (k = 4096) its summation order, so y is the same either way.
// All bf16 [m, k] contiguous (gamma [k]); residual_out must differ from residual and delta.
// Errors: InvalidArgument for null or aliased buffers and LinearCuda's shape errors.
absl::Status AddRmsNormLinearCuda(CublasLt& lt, const bf16* delta, bf16* residual,
                                  bf16* residual_out, const bf16* gamma, float eps, bf16* normed,
                                  const bf16* w, const bf16* bias, bf16* y, int64_t m, int64_t n,
                                  int64_t k, cudaStream_t stream, bool* residual_moved);
// AddRmsNormLinearSiluMulCuda: the same in front of LinearSiluMulCuda (w: fused [gate; up],
// out [m, inter] = SiLU(gate)·up).
absl::Status AddRmsNormLinearSiluMulCuda(CublasLt& lt, const bf16* delta, bf16* residual,
                                         bf16* residual_out, const bf16* gamma, float eps,
                                         bf16* normed, const bf16* w, const bf16* bias,
                                         bf16* gate_up, bf16* out, int64_t m, int64_t inter,
                                         int64_t k, cudaStream_t stream, bool* residual_moved);
// SetGemvNormFusion(sites): where a model runner lets AddRmsNormLinear* fuse, a mask of
// kGemvNormBeforeAttention (the pre-attention norm + qkv projection) and kGemvNormBeforeMlp (the
// post-attention norm + gate/up); 0 (the default) turns the fusion off everywhere.
// Errors: InvalidArgument for other values.
inline constexpr int kGemvNormBeforeAttention = 1;
inline constexpr int kGemvNormBeforeMlp = 2;
absl::Status SetGemvNormFusion(int sites);
int GemvNormFusion();

// SetGemvPdlPrefetch(mode): what a GEMV (GemvCuda, GemvSiluMulCuda and the GEMV plans of
// LinearCuda / LinearSiluMulCuda) reads of its weights before its dependency wait when launched
// as a programmatic dependent (kernels::DecodePdl; no effect otherwise), so the weight stream
// overlaps the previous kernel's tail: kGemvPdlPrefetchOff nothing; kGemvPdlPrefetchFirst each
// warp's first round of loads (unroll 16-byte vectors per lane) into registers;
// kGemvPdlPrefetchSlice that plus an L2 prefetch (cp.async.bulk.prefetch.L2) of the rest of the
// warp's slice of its weight row. Default kGemvPdlPrefetchFirst (fastest on an H200, Llama-3-8B
// decode at batch 1). Results are bit-identical in every mode.
// Errors: InvalidArgument for other values.
inline constexpr int kGemvPdlPrefetchOff = 0;
inline constexpr int kGemvPdlPrefetchFirst = 1;
inline constexpr int kGemvPdlPrefetchSlice = 2;
absl::Status SetGemvPdlPrefetch(int mode);
int GemvPdlPrefetch();

// SetGemmTuneCandidates(n): how many of cuBLASLt's heuristic algorithms the autotuner
// (CublasLt::set_autotune) times per new plan, 1..64 (default 8). Plans made before the call
// keep their choice. Errors: InvalidArgument outside 1..64.
absl::Status SetGemmTuneCandidates(int n);
int GemmTuneCandidates();

// LoadGemmTuning(path): merges a GEMM tuning table (kernels/linear/gemm_tuning_table.h) into
// the process's table, which every CublasLt's autotuner (set_autotune) consults before timing:
// a plan whose (shape, bias, alignments, SiLU·mul epilogue) is there, tuned with at least the
// current SetGemmAlgoSearch bits, takes the saved choice (after cublasLtMatmulAlgoCheck / the
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
absl::Status GemvCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                      int64_t n, int64_t k, cudaStream_t stream, int unroll = 4, int split = 1);

// Largest m SkinnyGemmCuda serves.
inline constexpr int64_t kSkinnyGemmMaxRows = 64;
// The rows at which LinearCuda's autotuner times SkinnyGemmCuda (when SetGemmSkinnyTuning is
// on). H200, Llama-3-8B shapes (bench/results/cuda_ab_stop16_h200.json): tuned alone it is
// ahead of cuBLASLt's tuned pick at m = 2..16 on o_proj (12.7-13.2 vs 14.2-14.9 µs) and
// gate/up + SiLU·mul (61-63 vs 61-67), 5-20% behind at m = 32 and 1.4-2.6× at m = 64 (mma.sync
// issue rate: m = 64 needs ~270 TFLOP/s at the copy bandwidth). In the decode graph it gains
// at batch 8 (ITL 4.973-4.976 vs 5.039 ms without it) but loses at 16 (5.784-5.788 vs 5.418),
// so it is timed at 2..8 rows only. m = 1 keeps the GEMV (its programmatic-launch overlap
// in the graph is worth more than the skinny kernel's 1.1 µs on o_proj alone).
inline constexpr int64_t kSkinnyTuneMinRows = 2;
inline constexpr int64_t kSkinnyTuneMaxRows = 8;
// The search bit (GemmTuningChoice::search_mask) of tuning-table entries whose timing included
// SkinnyGemmCuda: for the shapes it is timed at, LinearCuda's autotuner looks entries up with
// this bit too, so a table made before the kernel existed is timed again there instead of
// applied.
inline constexpr int kGemmTunedSkinny = 8;
// SetGemmSkinnyTuning(on): whether LinearCuda's autotuner times SkinnyGemmCuda (and applies
// tuning-table choices of it) for kSkinnyTuneMinRows <= m <= kSkinnyTuneMaxRows; default on.
// Process-wide, for A/B runs (cuda_decode_bench --gemm-skinny 0|1); plans made before the call
// keep their choice.
void SetGemmSkinnyTuning(bool on);
bool GemmSkinnyTuning();

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
// x or w.
// Errors: InvalidArgument when those do not hold; Internal for launch errors.
absl::Status SkinnyGemmCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t m,
                            int64_t n, int64_t k, cudaStream_t stream, int split = 1,
                            int stages = 4);
// SkinnyGemmSiluMulCuda: SkinnyGemmCuda on a fused [gate; up] weight w [2n, k] (bias [2n] or
// null) with GemvSiluMulCuda's epilogue: y[r, j] = bf16(silu(g)·u), g and u the bf16-rounded
// products j and n + j, y [m, n]. Each warp holds 16 gate rows and the matching 16 up rows, so
// the epilogue pairs them in registers. Needs and errors as SkinnyGemmCuda (for 2n rows).
absl::Status SkinnyGemmSiluMulCuda(const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                                   int64_t m, int64_t n, int64_t k, cudaStream_t stream,
                                   int split = 1, int stages = 4);

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
                             int split = 1);

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
