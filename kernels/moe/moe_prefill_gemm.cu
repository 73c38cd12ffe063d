// cuBLASLt routed experts for prefill steps; see moe_prefill_gemm_cuda.h.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/activation/activation_cuda.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/linear/linear_cuda.h"
#include "kernels/moe/moe_prefill_gemm_cuda.h"

namespace sluice::kernels {
namespace {

constexpr int kGatherThreads = 128;
constexpr int64_t kMaxExperts = 1024;  // kMoeCudaMaxExperts (moe_cuda.h)

// One block per sorted position p (grid: an upper bound on the valid rows): copies token row
// x[sorted_rows[p] / top_k] to gathered[p] as 16-byte vectors (hidden % 8 == 0, both 16-byte
// aligned). Positions at or past *valid (rows whose id was outside [0, E)) hold no row.
__global__ void __launch_bounds__(kGatherThreads)
    MoeGatherRowsKernel(const bf16* __restrict__ x, const int32_t* __restrict__ sorted_rows,
                        const int32_t* __restrict__ valid, int top_k, int hidden,
                        bf16* __restrict__ gathered) {
  const int p = blockIdx.x;
  if (p >= *valid) return;
  const int token = sorted_rows[p] / top_k;
  const uint4* src = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(token) * hidden);
  uint4* dst = reinterpret_cast<uint4*>(gathered + static_cast<int64_t>(p) * hidden);
  for (int v = threadIdx.x; v < hidden / 8; v += kGatherThreads) dst[v] = src[v];
}

}  // namespace

// A side lane: its stream, its own cuBLASLt (handle, workspace, plans) and the event that joins
// its work back into the caller's stream.
struct MoePrefillGemm::Lane {
  CudaStream stream;
  std::unique_ptr<CublasLt> lt;
  cudaEvent_t done = nullptr;
  Lane() = default;
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;
  ~Lane() {
    if (done != nullptr) cudaEventDestroy(done);
  }
};

size_t MoePrefillGemm::ScratchBytes(int64_t max_tokens, int64_t top_k, int64_t intermediate) {
  if (max_tokens <= 0 || top_k <= 0 || intermediate <= 0) return 0;
  return static_cast<size_t>(max_tokens * top_k) * static_cast<size_t>(2 * intermediate) *
         sizeof(bf16);
}

absl::StatusOr<std::unique_ptr<MoePrefillGemm>> MoePrefillGemm::Create(
    CublasLt* lt, int64_t max_tokens, int64_t top_k, int64_t num_experts, int64_t hidden,
    int64_t intermediate, const MoeOptions& options) {
  if (lt == nullptr || max_tokens < 1 || top_k < 1 || num_experts < 1 || top_k > num_experts ||
      num_experts > kMaxExperts || hidden < 8 || hidden % 8 != 0 || intermediate < 8 ||
      intermediate % 8 != 0 || max_tokens * top_k > 0x7fffffff || hidden > (int64_t{1} << 22) ||
      intermediate > (int64_t{1} << 22) || options.prefill_gemm_min_tokens < 0 ||
      options.prefill_gemm_streams < 1 ||
      options.prefill_gemm_streams > kMoePrefillGemmMaxStreams) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoePrefillGemm: bad arguments (lt ", lt != nullptr ? "set" : "null",
        ") max_tokens=", max_tokens, " top_k=", top_k, " num_experts=", num_experts,
        " hidden=", hidden, " intermediate=", intermediate,
        " prefill_gemm_min_tokens=", options.prefill_gemm_min_tokens,
        " prefill_gemm_streams=", options.prefill_gemm_streams, " (1..",
        kMoePrefillGemmMaxStreams, ")"));
  }
  std::unique_ptr<MoePrefillGemm> g(new MoePrefillGemm());
  g->lt_ = lt;
  g->max_tokens_ = max_tokens;
  g->top_k_ = top_k;
  g->num_experts_ = num_experts;
  g->hidden_ = hidden;
  g->intermediate_ = intermediate;
  g->min_tokens_ = options.prefill_gemm_min_tokens;
  auto buf =
      DeviceBuffer<bf16>::Create(ScratchBytes(max_tokens, top_k, intermediate) / sizeof(bf16));
  if (!buf.ok()) return buf.status();
  g->gate_up_ = *std::move(buf);
  void* host = nullptr;
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(&host, static_cast<size_t>(num_experts + 1) * sizeof(int32_t)),
      "cudaMallocHost");
  g->host_offsets_ = static_cast<int32_t*>(host);
  const int streams = options.prefill_gemm_streams;
  if (streams > 1) {
    SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&g->fork_, cudaEventDisableTiming),
                                "cudaEventCreate");
    for (int i = 1; i < streams; ++i) {
      auto lane = std::make_unique<Lane>();
      auto st = CudaStream::Create();
      if (!st.ok()) return st.status();
      lane->stream = *std::move(st);
      auto lane_lt = CublasLt::Create(CublasLt::kDefaultWorkspaceBytes, lt->options());
      if (!lane_lt.ok()) return lane_lt.status();
      lane->lt = *std::move(lane_lt);
      SLUICE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&lane->done, cudaEventDisableTiming),
                                  "cudaEventCreate");
      g->side_.push_back(std::move(lane));
    }
  }
  return g;
}

MoePrefillGemm::~MoePrefillGemm() {
  // The side lanes' work was joined into the callers' streams; wait for it before their
  // streams, workspaces and events go.
  for (const auto& lane : side_) (void)lane->stream.Synchronize();
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (host_offsets_ != nullptr) cudaFreeHost(host_offsets_);
}

bool MoePrefillGemm::Takes(int64_t num_tokens, int64_t top_k, int64_t num_experts, int64_t hidden,
                           int64_t intermediate, cudaStream_t stream) const {
  const int64_t min_tokens = min_tokens_;
  if (min_tokens <= 0 || num_tokens < min_tokens || num_tokens > max_tokens_ || top_k != top_k_ ||
      num_experts != num_experts_ || hidden != hidden_ || intermediate != intermediate_) {
    return false;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; the grouped path then runs as before
    return false;
  }
  return capture == cudaStreamCaptureStatusNone;
}

absl::Status MoePrefillGemm::Run(const bf16* x, const int32_t* offsets, const int32_t* sorted_rows,
                                 int64_t num_tokens, const bf16* w_gate_up, const bf16* w_down,
                                 bf16* act, bf16* expert_out, cudaStream_t stream) {
  if (num_tokens < 1 || num_tokens > max_tokens_ || x == nullptr || offsets == nullptr ||
      sorted_rows == nullptr || w_gate_up == nullptr || w_down == nullptr || act == nullptr ||
      expert_out == nullptr || !cuda_detail::Aligned16(x) || !cuda_detail::Aligned16(expert_out)) {
    return absl::InvalidArgumentError(absl::StrCat("MoePrefillGemm::Run: num_tokens=", num_tokens,
                                                   " (max ", max_tokens_,
                                                   "), or a null / misaligned pointer"));
  }
  const int64_t rows = num_tokens * top_k_;
  const int64_t E = num_experts_, H = hidden_, I = intermediate_;
  bf16* gathered = expert_out;  // free until the down GEMMs write it
  // 1. Gather (bounded on the device by offsets[E]), 2. offsets to the host.
  MoeGatherRowsKernel<<<static_cast<unsigned>(rows), kGatherThreads, 0, stream>>>(
      x, sorted_rows, offsets + E, static_cast<int>(top_k_), static_cast<int>(H), gathered);
  if (absl::Status s = CudaLaunchStatus("MoeGatherRowsKernel"); !s.ok()) return s;
  SLUICE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_offsets_, offsets, static_cast<size_t>(E + 1) * sizeof(int32_t),
                      cudaMemcpyDeviceToHost, stream),
      "MoePrefillGemm: offsets to host");
  SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "MoePrefillGemm: synchronize");
  const int32_t* off = host_offsets_;
  if (off[0] != 0 || off[E] > rows) {
    return absl::InternalError(absl::StrCat("MoePrefillGemm: expert offsets read back [0]=", off[0],
                                            " [E]=", off[E], " (rows ", rows, ")"));
  }
  for (int64_t e = 0; e < E; ++e) {
    if (off[e + 1] < off[e]) {
      return absl::InternalError(absl::StrCat("MoePrefillGemm: expert offsets decrease at ", e));
    }
  }
  const int64_t valid = off[E];
  if (valid == 0) {  // every id out of range: the combine writes zeros
    ++runs_;
    return absl::OkStatus();
  }
  // Lanes: the caller's stream (lane 0) plus the side lanes Create made; experts by descending
  // rows, each to the lane with the fewest rows so far (largest first also starts the longest
  // GEMMs first on a single stream).
  const int lanes = this->lanes();
  order_.clear();
  for (int32_t e = 0; e < E; ++e) {
    if (off[e + 1] > off[e]) order_.push_back(e);
  }
  std::stable_sort(order_.begin(), order_.end(), [off](int32_t a, int32_t b) {
    return off[a + 1] - off[a] > off[b + 1] - off[b];
  });
  lane_rows_.assign(lanes, 0);
  lane_of_.assign(E, 0);
  for (int32_t e : order_) {
    const int l = static_cast<int>(std::min_element(lane_rows_.begin(), lane_rows_.end()) -
                                   lane_rows_.begin());
    lane_of_[e] = l;
    lane_rows_[l] += off[e + 1] - off[e];
  }
  // One GEMM per expert (gemm(lt, e, stream)) over the lanes: side lanes wait for the caller's
  // stream so far, and the caller's stream waits for all of them after (also on an error, so
  // that no side work is left unjoined).
  auto per_expert = [&](auto&& gemm) -> absl::Status {
    if (lanes > 1) {
      SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, stream), "MoePrefillGemm: fork");
      for (int l = 1; l < lanes; ++l) {
        SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_[l - 1]->stream.get(), fork_, 0),
                                    "MoePrefillGemm: fork wait");
      }
    }
    absl::Status st;
    for (int32_t e : order_) {
      const int l = lane_of_[e];
      st = l == 0 ? gemm(*lt_, e, stream) : gemm(*side_[l - 1]->lt, e, side_[l - 1]->stream.get());
      if (!st.ok()) break;
    }
    for (int l = 1; l < lanes; ++l) {
      Lane& lane = *side_[l - 1];
      SLUICE_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane.done, lane.stream.get()),
                                  "MoePrefillGemm: join");
      SLUICE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, lane.done, 0),
                                  "MoePrefillGemm: join wait");
    }
    return st;
  };
  // 3. gate/up per expert, all before any down GEMM (they read `gathered` = expert_out).
  bf16* gate_up = gate_up_.data();
  if (absl::Status s = per_expert([&](CublasLt& lt, int64_t e, cudaStream_t st) {
        const int64_t begin = off[e], m = off[e + 1] - off[e];
        return LinearCuda(lt, gathered + begin * H, w_gate_up + e * 2 * I * H, nullptr,
                          gate_up + begin * 2 * I, m, 2 * I, H, st);
      });
      !s.ok()) {
    return s;
  }
  // 4. SiLU·mul over every valid row in one launch.
  if (absl::Status s = SiluMulCuda(gate_up, act, valid, I, stream); !s.ok()) return s;
  // 5. down per expert.
  if (absl::Status s = per_expert([&](CublasLt& lt, int64_t e, cudaStream_t st) {
        const int64_t begin = off[e], m = off[e + 1] - off[e];
        return LinearCuda(lt, act + begin * I, w_down + e * H * I, nullptr, expert_out + begin * H,
                          m, H, I, st);
      });
      !s.ok()) {
    return s;
  }
  ++runs_;
  return absl::OkStatus();
}

}  // namespace sluice::kernels
