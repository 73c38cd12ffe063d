// L2 persistence windows on captured graphs (engine/cuda/l2_persist.h). Needs a GPU: part of
// cuda_model_test, which the device script runs.
#include "engine/cuda/l2_persist.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/rms_norm/rms_norm_cuda.h"

namespace sluice::cuda_runner {
namespace {

using kernels::DeviceBuffer;

// The access-policy window of every kernel node of `graph`.
std::vector<cudaAccessPolicyWindow> Windows(cudaGraph_t graph) {
  size_t count = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &count), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(count);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &count), cudaSuccess);
  std::vector<cudaAccessPolicyWindow> out;
  for (cudaGraphNode_t n : nodes) {
    cudaGraphNodeType type;
    EXPECT_EQ(cudaGraphNodeGetType(n, &type), cudaSuccess);
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeAttrValue v{};
    EXPECT_EQ(cudaGraphKernelNodeGetAttribute(n, cudaKernelNodeAttributeAccessPolicyWindow, &v),
              cudaSuccess);
    out.push_back(v.accessPolicyWindow);
  }
  return out;
}

TEST(L2PersistTest, WindowOnEveryKernelNode) {
  SLUICE_SKIP_WITHOUT_CUDA();
  int device = 0, max_persist = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, device),
            cudaSuccess);
  if (max_persist == 0) GTEST_SKIP() << "no persisting L2 on this device";
  constexpr int64_t kRows = 4, kDim = 256;
  auto x = DeviceBuffer<kernels::bf16>::Create(kRows * kDim);
  auto w = DeviceBuffer<kernels::bf16>::Create(kDim);
  auto y = DeviceBuffer<kernels::bf16>::Create(kRows * kDim);
  auto stream = kernels::CudaStream::Create();
  ASSERT_TRUE(x.ok() && w.ok() && y.ok() && stream.ok());
  ASSERT_EQ(cudaMemsetAsync(x->data(), 0, x->bytes(), stream->get()), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(w->data(), 0, w->bytes(), stream->get()), cudaSuccess);
  ASSERT_TRUE(stream->Synchronize().ok());
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream->get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (int i = 0; i < 2; ++i) {  // two kernel nodes
    ASSERT_TRUE(kernels::RmsNormCuda(x->data(), kDim, w->data(), y->data(), kDim, kRows, kDim,
                                     1e-6f, stream->get())
                    .ok());
  }
  ASSERT_EQ(cudaStreamEndCapture(stream->get(), &graph), cudaSuccess);

  // Nothing to do: no window, or no set-aside.
  auto none = PersistInGraph(graph, L2Window{}, 1 << 20);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
  auto no_set_aside = PersistInGraph(graph, L2Window{y->data(), y->bytes()}, 0);
  ASSERT_TRUE(no_set_aside.ok());
  EXPECT_EQ(*no_set_aside, 0);

  // Released whatever happens below: the shares taken, the graph.
  int shares = 0;
  cudaGraphExec_t exec = nullptr;
  struct Cleanup {
    int* shares;
    cudaGraph_t* graph;
    cudaGraphExec_t* exec;
    ~Cleanup() {
      for (; *shares > 0; --*shares) L2ReleaseSetAside();
      if (*exec != nullptr) cudaGraphExecDestroy(*exec);
      if (*graph != nullptr) cudaGraphDestroy(*graph);
    }
  } cleanup{&shares, &graph, &exec};

  // The set-aside: 4 KB (the driver may round up), then capped at the device's maximum, then
  // never shrunk by a smaller request.
  auto set_aside = L2SetAsideFor(4096);
  ASSERT_TRUE(set_aside.ok()) << set_aside.status();
  ++shares;
  ASSERT_GE(*set_aside, 4096u);
  auto huge = L2SetAsideFor(size_t{1} << 40);
  ASSERT_TRUE(huge.ok()) << huge.status();
  ++shares;
  EXPECT_GT(*huge, *set_aside);
  EXPECT_LE(*huge, static_cast<size_t>(max_persist));
  auto again = L2SetAsideFor(4096);
  ASSERT_TRUE(again.ok()) << again.status();
  ++shares;
  EXPECT_EQ(*again, *huge);
  // Releasing one share of three keeps the limit.
  L2ReleaseSetAside();
  --shares;
  size_t limit = 0;
  ASSERT_EQ(cudaDeviceGetLimit(&limit, cudaLimitPersistingL2CacheSize), cudaSuccess);
  EXPECT_EQ(limit, *huge);

  // A window twice the set-aside persists half its lines.
  const size_t bytes = 2 * *huge;
  auto big = DeviceBuffer<uint8_t>::Create(bytes);
  ASSERT_TRUE(big.ok());
  auto changed = PersistInGraph(graph, L2Window{big->data(), bytes}, *huge);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(*changed, 2);
  const std::vector<cudaAccessPolicyWindow> windows = Windows(graph);
  ASSERT_EQ(windows.size(), 2u);
  for (const cudaAccessPolicyWindow& win : windows) {
    EXPECT_EQ(win.base_ptr, big->data());
    EXPECT_EQ(win.num_bytes, bytes);
    EXPECT_FLOAT_EQ(win.hitRatio, 0.5f);
    EXPECT_EQ(win.hitProp, cudaAccessPropertyPersisting);
    EXPECT_EQ(win.missProp, cudaAccessPropertyStreaming);
  }
  // The graph still runs.
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream->get()), cudaSuccess);
  EXPECT_TRUE(stream->Synchronize().ok());
  // The last share returns the set-aside.
  for (; shares > 0; --shares) L2ReleaseSetAside();
  ASSERT_EQ(cudaDeviceGetLimit(&limit, cudaLimitPersistingL2CacheSize), cudaSuccess);
  EXPECT_EQ(limit, 0u);
}

}  // namespace
}  // namespace sluice::cuda_runner
