// Wider cuBLASLt algorithm search for the tuned decode GEMMs (LinearCuda's autotuner,
// CublasLt::set_autotune), when LinearOptions::algo_search (linear_options.h) asks for it.
//
// cuBLASLt's heuristic (cublasLtMatmulAlgoGetHeuristic) returns a handful of configurations;
// at decode batch m = 256 on Llama-3-8B shapes those leave the H200 well below its GEMM rate
// (e.g. n = 6144, k = 4096: 48 tiles of 256x128 on 132 SMs, a third of a wave). Two tools here:
//  - EnumerateAlgos: every algorithm id (cublasLtMatmulAlgoGetIds) configured over its tiles,
//    split-K and CTA swizzling (capabilities from cublasLtMatmulAlgoCapGetAttribute), validated
//    with cublasLtMatmulAlgoCheck, for the tuner to time next to the heuristic's picks.
//  - SplitGemm: the product as two cuBLASLt calls over row ranges [0, n1) and [n1, n) of the
//    weight, each with its own algorithm, so the first part can fill whole waves; optionally the
//    two parts run on two streams (event fork/join, capturable in a CUDA graph).
// Host-only code (cuBLASLt API); compiled as .cu so it lives in the CUDA library.
#ifndef SLUICE_KERNELS_LINEAR_GEMM_ALGO_SEARCH_H_
#define SLUICE_KERNELS_LINEAR_GEMM_ALGO_SEARCH_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/linear/linear_options.h"

namespace sluice::kernels {

// ParseGemmAlgoSearchMask: the LinearOptions::algo_search mask in `text` (decimal, 0..7).
// InvalidArgument otherwise.
absl::StatusOr<int> ParseGemmAlgoSearchMask(absl::string_view text);

namespace gemm_search {

// Upper bound of the configurations EnumerateAlgos adds per shape (tuning time: each is timed
// 7 times after an L2 flush, ~1 ms each at these sizes).
inline constexpr int kMaxEnumerated = 192;

// EnumerateAlgos appends to *out up to max_new configurations of every bf16/fp32-compute
// algorithm that cublasLtMatmulAlgoCheck accepts for (op, a, b, c) with a workspace of at most
// workspace_bytes, skipping ones equal to an entry already in *out. Swept per algorithm id: its
// tiles (CUBLASLT_ALGO_CAP_TILE_IDS; those with both sides in 64..256, multiples of 32) ×
// split-K {1, 2, 3, 4} (when CUBLASLT_ALGO_CAP_SPLITK_SUPPORT and the fp32 COMPUTE_TYPE
// reduction is offered, so the output is still rounded once) × CTA swizzle {0, 1} (when
// supported) × custom option 0..min(CUSTOM_OPTION_MAX, 2), with automatic stages and cluster
// shape (falling back to cluster 1x1x1, then to the two deepest listed stage counts, when
// rejected). Order (what a cap keeps): round r takes each (id, tile) group's r-th best, best
// first, where best = fullest last wave (cublasLtMatmulAlgoCheck's wavesCount / its ceiling),
// then larger tile. Errors: Internal when cublasLtMatmulAlgoGetIds fails.
absl::Status EnumerateAlgos(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                            cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                            cublasLtMatrixLayout_t c, size_t workspace_bytes, int max_new,
                            std::vector<cublasLtMatmulAlgo_t>* out);

// DescribeAlgo: "algo ID tile RxC stages S splitK K swizzle W cluster C custom O" for plans'
// descriptions.
std::string DescribeAlgo(const cublasLtMatmulAlgo_t& algo);

// Shared resources for split GEMMs on two streams: a non-blocking side stream, fork/join events
// (timing off) and a second workspace so the parts never share scratch. Made on first use.
struct SplitResources {
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  DeviceBuffer<uint8_t> workspace;  // the side stream's part
  ~SplitResources();
};

// Times `run` (returns false on failure): mean microseconds, or < 0 when it failed.
using TimeFn = std::function<float(const std::function<bool()>&)>;

// SplitGemm: y[m, n] = x·Wᵀ (+ bias) as two cuBLASLt products over W's rows [0, n1) and
// [n1, n), writing y's columns in place (leading dimension n). Same layout and arithmetic as
// LinearCuda's single call (fp32 accumulation, one rounding), only the algorithm per part
// differs.
class SplitGemm {
 public:
  // Make builds the descriptors for the split at n1 (0 < n1 < n, n1 % 8 == 0).
  // Errors: InvalidArgument for a bad n1; Internal for cuBLASLt failures.
  static absl::StatusOr<std::unique_ptr<SplitGemm>> Make(int64_t m, int64_t n, int64_t k,
                                                         int64_t n1, bool has_bias);
  ~SplitGemm();
  SplitGemm(const SplitGemm&) = delete;
  SplitGemm& operator=(const SplitGemm&) = delete;

  // Tune picks each part's algorithm (the heuristic's top `heuristic` plus up to
  // `enumerated` from EnumerateAlgos, timed alone by `time`), then times the whole split
  // serially and, when res != nullptr, on two streams; keeps the faster mode. Returns the
  // split's best microseconds (< 0 when no part algorithm ran). `finish` (may be empty) runs
  // after the product in each timing (LinearSiluMulCuda's SiLU·mul).
  float Tune(cublasLtHandle_t handle, const bf16* x, const bf16* w, const bf16* bias, bf16* y,
             void* workspace, size_t workspace_bytes, SplitResources* res, cudaStream_t stream,
             int heuristic, int enumerated, const TimeFn& time,
             const std::function<bool()>& finish);
  // Restore sets the parts' algorithms and mode from a saved choice (GemmTuningTable) instead
  // of Tune: each algorithm must pass cublasLtMatmulAlgoCheck for its part with a workspace of
  // at most workspace_bytes. Errors: FailedPrecondition when one does not (e.g. another
  // cuBLASLt build).
  absl::Status Restore(cublasLtHandle_t handle, const cublasLtMatmulAlgo_t& part0,
                       const cublasLtMatmulAlgo_t& part1, bool two_streams,
                       size_t workspace_bytes);
  const cublasLtMatmulAlgo_t& part_algo(int i) const;
  // Run launches both parts (on `stream`, or forked onto res->side when tuned so); capturable.
  cublasStatus_t Run(cublasLtHandle_t handle, const bf16* x, const bf16* w, const bf16* bias,
                     bf16* y, void* workspace, size_t workspace_bytes, SplitResources* res,
                     cudaStream_t stream);
  std::string Describe() const;
  int64_t n1() const { return n1_; }
  bool two_streams() const { return two_streams_; }
  float serial_us() const { return serial_us_; }
  float streams_us() const { return streams_us_; }

 private:
  struct Part;
  SplitGemm() = default;
  cublasStatus_t RunPart(cublasLtHandle_t handle, Part& p, const cublasLtMatmulAlgo_t& algo,
                         const bf16* x, const bf16* w, const bf16* bias, bf16* y, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream);
  int64_t m_ = 0, n_ = 0, k_ = 0, n1_ = 0;
  bool has_bias_ = false;
  bool two_streams_ = false;
  float serial_us_ = -1.0f, streams_us_ = -1.0f;
  std::unique_ptr<Part> parts_[2];
};

// SplitPoints: candidate n1 for an (m, n) product on `sms` SMs: the first part is 1..3 whole
// waves of a (tile_n × tile_m) output tiling (tile_n in {64, 96, ..., 256} along n, tile_m in
// {64, 128, 256} along m), with n/8 <= n1 <= n - n/8 and n1 % 16 == 0; fewest waves first, then
// larger tiles, at most `max_points` distinct, returned ascending.
std::vector<int64_t> SplitPoints(int64_t m, int64_t n, int sms, int max_points);

// EnsureSplitResources makes *res (side stream, fork/join events, a workspace of
// workspace_bytes) when it is null; returns it, or nullptr when CUDA refused (then two-stream
// splits are not timed or run).
SplitResources* EnsureSplitResources(std::unique_ptr<SplitResources>* res, size_t workspace_bytes);

// CheckAlgo: whether cuBLASLt accepts `algo` for (op, a, b, c) with a workspace of at most
// workspace_bytes (cublasLtMatmulAlgoCheck), for restored choices.
bool CheckAlgo(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
               cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, const cublasLtMatmulAlgo_t& algo,
               size_t workspace_bytes);

// Bounds of TuneBestSplit's search: split points per shape, enumerated algorithms per part.
inline constexpr int kMaxSplitPoints = 6;
inline constexpr int kMaxEnumeratedPerPart = 48;

// TuneBestSplit: when `mask` (LinearOptions::algo_search) has kGemmSearchSplitN and
// m >= kGemmSearchMinRows,
// tunes a SplitGemm at each SplitPoints(m, n, SM count, kMaxSplitPoints) (parts: the heuristic's
// top `heuristic` plus, with kGemmSearchAlgos, kMaxEnumeratedPerPart enumerated ones; with
// kGemmSearchStreams, also timed on two streams, *res made on first use) and returns the fastest
// when it beats *best_us (then updated), else nullptr. y is overwritten; synchronizes `stream`.
std::unique_ptr<SplitGemm> TuneBestSplit(cublasLtHandle_t handle, int64_t m, int64_t n,
                                         int64_t k, const bf16* x, const bf16* w,
                                         const bf16* bias, bf16* y, void* workspace,
                                         size_t workspace_bytes,
                                         std::unique_ptr<SplitResources>* res,
                                         cudaStream_t stream, int mask, int heuristic,
                                         const TimeFn& time, const std::function<bool()>& finish,
                                         float* best_us);

}  // namespace gemm_search
}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_LINEAR_GEMM_ALGO_SEARCH_H_
