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

// L2SetAsideFor reserves the L2 set-aside for persisting accesses (cudaLimitPersistingL2CacheSize)
// for a window of `bytes`, capped at the device's maximum; returns the bytes reserved, 0 where the
// device has none (then PersistInGraph is a no-op). Device-wide: the current device.
// Errors: Internal for CUDA failures.
absl::StatusOr<size_t> L2SetAsideFor(size_t bytes);

// L2ReleaseSetAside evicts the persisting lines (cudaCtxResetPersistingL2Cache) and returns
// the set-aside to normal use; errors are ignored (for destructors). The limit is per device:
// a second runner on the device (e.g. a draft model) loses its set-aside with the first.
void L2ReleaseSetAside();

// PersistInGraph gives every kernel node of `graph` (before instantiation) the access-policy
// window `w` with hitProp persisting, missProp streaming and hitRatio min(1, set_aside /
// w.bytes), the window clamped to the device's maximum window size. Returns the number of
// kernel nodes changed (0 when w or set_aside is empty); nodes the driver refuses the window
// for are left without it.
// Errors: Internal for CUDA failures.
absl::StatusOr<int> PersistInGraph(cudaGraph_t graph, L2Window w, size_t set_aside);

}  // namespace sluice::cuda_runner

#endif  // SLUICE_ENGINE_CUDA_L2_PERSIST_H_
