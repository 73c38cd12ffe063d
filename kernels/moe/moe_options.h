// MoeOptions: the choices a CUDA model runner makes about its routed experts when it is created
// (cuda_runner::CudaRunnerOptions::moe; kernels::MoePrefillGemm::Create takes them). Plain
// data; no CUDA needed to include it.
#ifndef SLUICE_KERNELS_MOE_MOE_OPTIONS_H_
#define SLUICE_KERNELS_MOE_MOE_OPTIONS_H_

#include <cstdint>

namespace sluice::kernels {

struct MoeOptions {
  // Smallest step (tokens) whose routed experts, on MoeExpertsCuda's grouped path, run as one
  // cuBLASLt GEMM per touched expert (moe_prefill_gemm_cuda.h) instead of the grouped WMMA
  // GEMM; 0: never (the runner then allocates no MoePrefillGemm). The path synchronizes the
  // stream once per MoE layer (~10-30 µs, noise against a multi-millisecond prefill layer).
  int64_t prefill_gemm_min_tokens = 256;
  // Streams those per-expert GEMMs are spread over (1: the caller's stream only), at most
  // kMoePrefillGemmMaxStreams: a few experts in flight at once fill the GPU where one expert's
  // GEMM covers only part of the SMs.
  int prefill_gemm_streams = 4;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MOE_MOE_OPTIONS_H_
