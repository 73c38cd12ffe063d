#include "engine/cuda/l2_persist.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sluice::cuda_runner {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<size_t> L2SetAsideFor(size_t bytes) {
  int device = 0, max_persist = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return CudaError(e, "cudaGetDevice");
  e = cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, device);
  if (e != cudaSuccess) return CudaError(e, "cudaDeviceGetAttribute(MaxPersistingL2CacheSize)");
  const size_t set_aside = std::min(bytes, static_cast<size_t>(std::max(max_persist, 0)));
  if (set_aside == 0) return size_t{0};
  e = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, set_aside);
  if (e != cudaSuccess) return CudaError(e, "cudaDeviceSetLimit(PersistingL2CacheSize)");
  size_t got = 0;
  e = cudaDeviceGetLimit(&got, cudaLimitPersistingL2CacheSize);
  if (e != cudaSuccess) return CudaError(e, "cudaDeviceGetLimit(PersistingL2CacheSize)");
  return got;
}

void L2ReleaseSetAside() {
  (void)cudaCtxResetPersistingL2Cache();
  (void)cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
}

absl::StatusOr<int> PersistInGraph(cudaGraph_t graph, L2Window w, size_t set_aside) {
  if (w.base == nullptr || w.bytes == 0 || set_aside == 0) return 0;
  int device = 0, max_window = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return CudaError(e, "cudaGetDevice");
  e = cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device);
  if (e != cudaSuccess) return CudaError(e, "cudaDeviceGetAttribute(MaxAccessPolicyWindowSize)");
  const size_t bytes = std::min(w.bytes, static_cast<size_t>(std::max(max_window, 0)));
  if (bytes == 0) return 0;
  cudaKernelNodeAttrValue value{};
  value.accessPolicyWindow.base_ptr = w.base;
  value.accessPolicyWindow.num_bytes = bytes;
  value.accessPolicyWindow.hitRatio =
      std::min(1.0f, static_cast<float>(static_cast<double>(set_aside) / bytes));
  value.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  value.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  size_t count = 0;
  e = cudaGraphGetNodes(graph, nullptr, &count);
  if (e != cudaSuccess) return CudaError(e, "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) {
    e = cudaGraphGetNodes(graph, nodes.data(), &count);
    if (e != cudaSuccess) return CudaError(e, "cudaGraphGetNodes");
  }
  int changed = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    e = cudaGraphNodeGetType(node, &type);
    if (e != cudaSuccess) return CudaError(e, "cudaGraphNodeGetType");
    if (type != cudaGraphNodeTypeKernel) continue;
    // A node the driver refuses the window for keeps running without it: the window only
    // changes caching. (Seen: cudaErrorInvalidValue for sluice-mini-swa's decode attention,
    // PagedAttentionKernel<64, 64, 1, 4, 16, 3, true>; the graph's other nodes took it.)
    e = cudaGraphKernelNodeSetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &value);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky; keep it from the next launch check
      continue;
    }
    ++changed;
  }
  return changed;
}

}  // namespace sluice::cuda_runner
