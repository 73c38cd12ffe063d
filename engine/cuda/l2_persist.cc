#include "engine/cuda/l2_persist.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sluice::cuda_runner {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// Shares of each device's set-aside taken by L2SetAsideFor and not yet released.
std::mutex g_mu;
std::map<int, int> g_shares;

}  // namespace

absl::StatusOr<size_t> L2SetAsideFor(size_t bytes) {
  int device = 0, max_persist = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return CudaError(e, "cudaGetDevice");
  e = cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, device);
  if (e != cudaSuccess) return CudaError(e, "cudaDeviceGetAttribute(MaxPersistingL2CacheSize)");
  std::lock_guard<std::mutex> lock(g_mu);
  size_t current = 0;
  e = cudaDeviceGetLimit(&current, cudaLimitPersistingL2CacheSize);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return size_t{0};
  }
  const size_t want =
      std::max(current, std::min(bytes, static_cast<size_t>(std::max(max_persist, 0))));
  if (want == 0) return size_t{0};
  if (want != current) {
    e = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, want);
    if (e != cudaSuccess) {  // e.g. an MPS client: run without persistence
      (void)cudaGetLastError();
      return size_t{0};
    }
  }
  size_t got = 0;
  e = cudaDeviceGetLimit(&got, cudaLimitPersistingL2CacheSize);
  if (e != cudaSuccess) return CudaError(e, "cudaDeviceGetLimit(PersistingL2CacheSize)");
  if (got > 0) ++g_shares[device];
  return got;
}

void L2ReleaseSetAside() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_shares.find(device);
  if (it == g_shares.end() || --it->second > 0) return;
  g_shares.erase(it);
  (void)cudaCtxResetPersistingL2Cache();
  (void)cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
  (void)cudaGetLastError();
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
    if (e == cudaErrorInvalidValue || e == cudaErrorNotSupported) {
      (void)cudaGetLastError();  // not sticky; keep it from the next launch check
      continue;
    }
    if (e != cudaSuccess) return CudaError(e, "cudaGraphKernelNodeSetAttribute(AccessPolicyWindow)");
    ++changed;
  }
  return changed;
}

}  // namespace sluice::cuda_runner
