// Hopper (sm_90a) wgmma paged prefill attention (PagedPrefillKernel::kWgmma, the
// default), launched by PagedAttentionCuda: host entry points. The kernel and its
// design notes are in paged_prefill_wgmma.cu.
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_PREFILL_WGMMA_H_
#define SLUICE_KERNELS_ATTENTION_PAGED_PREFILL_WGMMA_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace sluice::kernels::paged_detail {

// paged_prefill_device.cuh (device code: not included here, so host .cc files may include this).
struct Fa2Args;

// Query rows (token · group + head) per CTA: two warpgroups of 64.
constexpr int kWgmmaRowsPerCta = 128;

// WgmmaPrefillSupports: whether the wgmma kernel serves a launch with these
// parameters on the current device: head_dim == v_head_dim == 128, scale > 0
// (finite), no sliding window, and a compute capability 9.0 device running this
// binary's sm_90a code (wgmma exists only there; code built for other
// architectures holds a __trap() guard in its place). Other launches must use another prefill
// kernel (PagedAttentionCuda falls back to the FA2 kernel).
bool WgmmaPrefillSupports(int64_t head_dim, int64_t v_head_dim, float scale,
                          int64_t sliding_window);

// CTAs of the kernel resident per SM (≥ 1; 1 on errors).
int WgmmaPrefillOccupancy();

// LaunchWgmmaPrefill: the kernel over `grid` = (m tiles · KV heads · splits, 1,
// sequences), linear x with the longest query tiles first (as
// LaunchFa2Prefill); args.num_m_tiles counts kWgmmaRowsPerCta-row tiles,
// partitions (args.partition_tokens) are multiples of 64 keys. Writes bf16 rows
// to args.out, or fp32 partials (args.partial_out / partial_ml) when
// args.num_splits > 1 (the split-KV combine format). InvalidArgument where
// WgmmaPrefillSupports is false for args' dims; Internal for launch errors.
// `pdl`: launch as a programmatic dependent.
absl::Status LaunchWgmmaPrefill(const Fa2Args& args, dim3 grid, cudaStream_t stream, bool pdl);

}  // namespace sluice::kernels::paged_detail

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_PREFILL_WGMMA_H_
