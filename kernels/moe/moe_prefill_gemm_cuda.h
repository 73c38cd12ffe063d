// Large-batch (prefill) routed experts on cuBLASLt: MoeExpertsCuda's grouped path with its two
// grouped WMMA GEMMs replaced by one cuBLASLt GEMM per touched expert and GEMM (LinearCuda,
// kernels/linear/linear_cuda.h). The expert row counts must be known on the host for that, so
// this path reads them back: it synchronizes the stream once per call and is never taken while
// the stream is being captured into a CUDA graph (decode steps are; prefill steps are not).
//
// Steps inside MoeExpertsCuda (moe_experts.cu) after its expert sort (MoeSortKernel):
//   1. gather the token rows x[sorted_rows[p] / top_k] into a contiguous [valid_rows, hidden]
//      buffer (the workspace's expert-output segment, free until the down GEMMs);
//   2. copy the per-expert row offsets [E + 1] to pinned host memory; synchronize the stream;
//   3. per expert with rows: gate_up[rows_e, 2·I] = bf16(x_e · W_gate_upᵀ) (LinearCuda);
//   4. act = SiluMulCuda(gate_up) over all valid rows at once (bf16 g and u, fp32 math);
//   5. per expert with rows: expert_out[rows_e, H] = bf16(act_e · W_downᵀ) (LinearCuda);
//   6. MoeExpertsCuda's own combine, unchanged.
// Against the grouped WMMA path the gate/up sums are rounded to bf16 before SiLU·mul (as the
// dense LinearSiluMulCuda does) and cuBLASLt's algorithm (so summation order) may depend on an
// expert's row count: equal within bf16 rounding, not bit for bit, and a token's output may
// depend on the other tokens of the batch.
#ifndef SLUICE_KERNELS_MOE_MOE_PREFILL_GEMM_CUDA_H_
#define SLUICE_KERNELS_MOE_MOE_PREFILL_GEMM_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/moe/moe_options.h"

namespace sluice::kernels {

class CublasLt;

// Most streams MoeOptions::prefill_gemm_streams may ask for.
inline constexpr int kMoePrefillGemmMaxStreams = 4;

// MoePrefillGemm owns the scratch of the cuBLASLt path for one expert shape: the gate/up
// output [max_tokens·top_k, 2·intermediate] bf16 on the device and the expert offsets
// [num_experts + 1] int32 in pinned host memory; it borrows `lt` (which must outlive it).
// Calls are serialized by the caller (one per stream; not thread-safe).
class MoePrefillGemm {
 public:
  // Create: scratch for steps of up to max_tokens tokens (no allocation per step), taking
  // steps of at least options.prefill_gemm_min_tokens tokens. With options.prefill_gemm_streams
  // = n > 1 also n - 1 side lanes (stream, CublasLt with its default 32 MiB workspace and lt's
  // LinearOptions, event).
  // Errors: InvalidArgument for a null lt, non-positive sizes, top_k > num_experts,
  // num_experts > 1024, hidden or intermediate not a positive multiple of 8,
  // max_tokens·top_k >= 2^31, prefill_gemm_min_tokens < 0 or prefill_gemm_streams outside
  // [1, kMoePrefillGemmMaxStreams]; Internal for allocation failures.
  static absl::StatusOr<std::unique_ptr<MoePrefillGemm>> Create(
      CublasLt* lt, int64_t max_tokens, int64_t top_k, int64_t num_experts, int64_t hidden,
      int64_t intermediate, const MoeOptions& options = {});
  ~MoePrefillGemm();
  MoePrefillGemm(const MoePrefillGemm&) = delete;
  MoePrefillGemm& operator=(const MoePrefillGemm&) = delete;

  // Takes: whether a MoeExpertsCuda call of these sizes on `stream` goes here: the options'
  // prefill_gemm_min_tokens is on and num_tokens >= it, the shape is the one this was created for, num_tokens <=
  // max_tokens, and the stream is not capturing (cudaStreamIsCapturing; an error there: false).
  bool Takes(int64_t num_tokens, int64_t top_k, int64_t num_experts, int64_t hidden,
             int64_t intermediate, cudaStream_t stream) const;

  // Run: steps 1-5 of the header comment for a sort MoeSortKernel left on `stream`.
  //   x:           [num_tokens, hidden] bf16, 16-byte aligned
  //   offsets:     [num_experts + 1] int32 (device): expert e's sorted rows are
  //                [offsets[e], offsets[e + 1]); offsets[E] = valid rows <= num_tokens·top_k
  //   sorted_rows: [num_tokens·top_k] int32 (device): sorted position -> row t·top_k + k
  //   w_gate_up:   [E, 2·I, H] bf16; w_down: [E, H, I] bf16 (MoeExpertsCuda's layout)
  //   act:         [num_tokens·top_k, I] bf16 out (sorted order)
  //   expert_out:  [num_tokens·top_k, H] bf16 out (sorted order); also the gather buffer
  // All device pointers 16-byte aligned, no overlaps. Synchronizes `stream` once. With side
  // lanes, their work is forked from and joined back into `stream` (events), so to the caller
  // everything is still ordered on `stream`.
  // Errors: InvalidArgument when Takes would be false for the sizes (capture aside) or a
  // pointer is null; Internal for CUDA/cuBLASLt failures, or offsets read back that are not a
  // non-decreasing sequence from 0 to at most num_tokens·top_k.
  absl::Status Run(const bf16* x, const int32_t* offsets, const int32_t* sorted_rows,
                   int64_t num_tokens, const bf16* w_gate_up, const bf16* w_down, bf16* act,
                   bf16* expert_out, cudaStream_t stream);

  // Number of Run calls that succeeded (tests check that the path was taken).
  int64_t runs() const { return runs_; }
  // Streams (lanes) Create made available: 1 + side streams.
  int lanes() const { return 1 + static_cast<int>(side_.size()); }

  // Device bytes Create allocates for these sizes (0 for non-positive ones).
  static size_t ScratchBytes(int64_t max_tokens, int64_t top_k, int64_t intermediate);

 private:
  MoePrefillGemm() = default;
  CublasLt* lt_ = nullptr;
  int64_t max_tokens_ = 0, top_k_ = 0, num_experts_ = 0, hidden_ = 0, intermediate_ = 0;
  int64_t min_tokens_ = 0;
  DeviceBuffer<bf16> gate_up_;       // [max_tokens·top_k, 2·I]
  int32_t* host_offsets_ = nullptr;  // pinned [E + 1]
  int64_t runs_ = 0;
  // Side lanes (prefill_gemm_streams > 1): stream, own cuBLASLt, join event.
  struct Lane;
  std::vector<std::unique_ptr<Lane>> side_;
  cudaEvent_t fork_ = nullptr;
  std::vector<int64_t> lane_rows_;  // Run's per-lane row totals (scratch)
  std::vector<int> lane_of_;        // Run's expert -> lane (scratch)
  std::vector<int32_t> order_;      // Run's experts by descending rows (scratch)
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MOE_MOE_PREFILL_GEMM_CUDA_H_
