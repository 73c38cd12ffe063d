// L2 persistence for the hot activations of a captured decode graph.
//
// A decode step streams its weights and K/V cache through L2 once each, so they evict the
// activations one kernel writes and the next reads (H200, Llama-3-8B batch 256: the gate/up
// product, 14.7 MB, goes to HBM and SiLU·mul reads it back from there). An access-policy window
// with the persisting property over those activations keeps them in the L2 set-aside
// (CUDA C++ Programming Guide, "L2 Cache Access Management").
#ifndef SLUICE_ENGINE_CUDA_L2_PERSIST_H_
#define SLUICE_ENGINE_CUDA_L2_PERSIST_H_

#include <cstddef>

#include <cuda_runtime.h>

#include "absl/status/statusor.h"

namespace sluice::cuda_runner {

// A device address range [base, base + bytes).
struct L2Window {
  void* base = nullptr;
  size_t bytes = 0;
};

// L2SetAsideFor takes a share of the current device's L2 set-aside for persisting accesses
// (cudaLimitPersistingL2CacheSize) for a window of `bytes`: the limit becomes the larger of
// the current one and `bytes`, capped at the device's maximum (never shrunk under another
// runner's graphs). Returns the bytes reserved; 0 where the device has none or refuses the
// limit (MPS clients, MIG instances): PersistInGraph is then a no-op and nothing need be
// released. Every nonzero return must be matched by one L2ReleaseSetAside on the same device.
// Errors: Internal for CUDA failures other than the limit being refused.
absl::StatusOr<size_t> L2SetAsideFor(size_t bytes);

// L2ReleaseSetAside drops one share taken by L2SetAsideFor on the current device; the last one
// evicts the persisting lines (cudaCtxResetPersistingL2Cache) and returns the set-aside to
// normal use. Errors are ignored and cleared (for destructors).
void L2ReleaseSetAside();

// PersistInGraph gives every kernel node of `graph` (before instantiation) the access-policy
// window `w` with hitProp persisting, missProp streaming and hitRatio min(1, set_aside /
// w.bytes), the window clamped to the device's maximum window size. Returns the number of
// kernel nodes changed (0 when w or set_aside is empty); nodes the driver refuses the window
// for (cudaErrorInvalidValue / cudaErrorNotSupported) are left without it.
// Errors: Internal for other CUDA failures.
absl::StatusOr<int> PersistInGraph(cudaGraph_t graph, L2Window w, size_t set_aside);

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_L2_PERSIST_H_
