// Programmatic dependent launch (PDL) for the decode chain: device-side waits and triggers, a
// launcher, and an L2 prefetch for the work a dependent kernel may do before it waits.
//
// CUDA Programming Guide, "Programmatic Dependent Launch and Synchronization"; PTX ISA
// "griddepcontrol" and "cp.async.bulk.prefetch" (both sm_90+). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start once every block of the previous
// kernel in the stream has called LaunchDependents (or exited); GridDependencyWait then blocks
// until that kernel has completed and its writes are visible. A kernel in such a chain must
// therefore call GridDependencyWait before it reads what an earlier kernel wrote and before it
// writes anything an earlier kernel may still read, and it must reach the wait on every path
// (completion is transitive only through kernels that waited). Before the wait it may read
// what no kernel of the step writes (weights) — PrefetchL2 below.
#ifndef SLUICE_KERNELS_CUDA_PDL_CUH_
#define SLUICE_KERNELS_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace sluice::kernels::cuda_detail {

// GridDependencyWait: blocks until the kernel this one programmatically depends on has
// completed and its memory is visible; a no-op for a normal launch and below sm_90.
static __device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// LaunchDependents: lets the next kernel, if it was launched as a programmatic dependent,
// start once every block of this grid has called this (or exited). No-op below sm_90.
static __device__ __forceinline__ void LaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// PrefetchL2: asks the TMA unit to bring [p, p + bytes) into L2 (cp.async.bulk.prefetch.L2;
// no registers, no completion to wait for). p must be 16-byte aligned and bytes a multiple of
// 16; the call is skipped otherwise, and below sm_90. A hint: correctness never depends on it.
static __device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bytes == 0 || ((reinterpret_cast<uintptr_t>(p) | bytes) & 15u) != 0) return;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// LaunchKernelMaybePdl launches `kernel` on `stream`, as a programmatic dependent of the
// previous kernel when `pdl` (the kernel must then follow the rules in this file's header).
template <typename... Params, typename... Args>
cudaError_t LaunchKernelMaybePdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace sluice::kernels::cuda_detail

#endif  // SLUICE_KERNELS_CUDA_PDL_CUH_
