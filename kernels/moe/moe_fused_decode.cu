// CUDA MoE fused decode path (moe_cuda.h: MoeFusedRouteCuda, MoeFusedExpertsCuda): the routing
// over many blocks, the last of which routes and sorts; the routed (and shared) experts' gate/up
// over a persistent grid; down + combine. The warps of these kernels walk task lists with the
// next weight loads in flight while they reduce the current ones.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/moe/moe_cuda.h"
#include "kernels/moe/moe_cuda_detail.cuh"
#include "kernels/moe/moe_experts_device.cuh"

namespace sluice::kernels {
namespace {

using namespace moe_detail;  // NOLINT(build/namespaces): the shared workspace and sort
using attention_detail::CpAsync16;
using attention_detail::CpAsyncCommit;
using attention_detail::CpAsyncWait;
using cuda_detail::Aligned16;
using cuda_detail::LoadBf16x8;
using cuda_detail::StoreBf16x8;
using moe_detail::kWarpDotRows;
using moe_detail::RouteArgs;
using moe_detail::WarpDotChunked;
using moe_detail::WarpDotRows;


// ---- Pipelined warp dot products. The GEMV path's kernels (moe_experts.cu) give each warp
// one output column and one round trip to memory (issue every weight load, wait, reduce,
// exit), so all warps of a wave wait at once and the memory pipe drains between waves. Here a
// warp walks a list of tasks (kMats weight rows times a few activation rows each) in chunks of
// kVecs lane-strided 16-byte vectors per row, with the loads of the next chunk (of the same or
// the next task) issued before the current chunk is used: a warp always has a chunk in flight,
// and persistent warps stream from launch to exit.

// PipeTask: weight rows w0 + m·w_stride (m < kMats) of length a.k, applied to activation rows
// [begin, end) of `a` (sorted positions or tokens).
struct PipeTask {
  const bf16* w0;
  int64_t w_stride;
  ARows a;
  int begin, end;
};

// Where a warp is: task q (q >= count: done), row pass p0, first vector v0 of the chunk.
struct PipeStep {
  int q, p0, v0;
};

// PipelinedWarpDots: for q = first, first + stride, ... < count, for which task_at(q, &task)
// returns true (false: nothing to do), and each pass of up to kRows activation rows p0, p0 + 1,
// ... of [begin, end): sink(q, p0, rows, acc) with acc[m][j] = Σ_i w_m[i] · a[p0 + j][i] on
// every lane. Each lane adds its products in the order of WarpDotChunked / WarpDotRows (vectors
// lane, lane + 32, ... ascending; FmaVec's q order) from 0, then the same butterfly: sums bit
// for bit equal to GemvColumn's (moe_experts.cu). Warp-uniform arguments; every lane calls it.
// a.k % 8 == 0, rows 16-byte aligned.
template <int kMats, int kRows, int kVecs, typename TaskAt, typename Sink>
__device__ __forceinline__ void PipelinedWarpDots(int first, int stride, int count,
                                                  TaskAt task_at, Sink sink) {
  static_assert(kRows >= 1 && kRows <= kWarpDotRows && kMats >= 1);
  const int lane = threadIdx.x & 31;
  constexpr int kChunk = 32 * kVecs;  // vectors per row per chunk
  // The step after s (task t is s's; both updated): next chunk, next pass, or next task.
  auto advance = [&](PipeStep& s, PipeTask& t) {
    if (s.q < count) {
      s.v0 += kChunk;
      if (s.v0 < t.a.k / 8) return;
      s.v0 = 0;
      s.p0 += kRows;
      if (s.p0 < t.end) return;
      s.q += stride;
    }
    for (; s.q < count; s.q += stride) {
      if (task_at(s.q, &t) && t.begin < t.end) {
        s.p0 = t.begin;
        return;
      }
    }
  };
  auto issue = [&](const PipeStep& s, const PipeTask& t, cuda_detail::Bf16x8(&buf)[kMats][kVecs]) {
    if (s.q >= count) return;
    const int vecs = t.a.k / 8;
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int i = s.v0 + u * 32 + lane;
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        if (i < vecs) buf[m][u] = moe_detail::LoadWeightVec(t.w0 + m * t.w_stride + i * 8);
      }
    }
  };
  float acc[kMats][kRows];
  moe_detail::ZeroAcc(acc);
  auto consume = [&](const PipeStep& s, const PipeTask& t,
                     const cuda_detail::Bf16x8(&buf)[kMats][kVecs]) {
    const int vecs = t.a.k / 8;
    const int rows = min(kRows, t.end - s.p0);
    const bf16* a[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) a[j] = t.a.Row(s.p0 + (j < rows ? j : 0));
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int i = s.v0 + u * 32 + lane;
      if (i >= vecs) break;  // lane-local: no warp-wide operation before the sums
      float wf[kMats][8];
#pragma unroll
      for (int m = 0; m < kMats; ++m) cuda_detail::ToFloat8(buf[m][u], wf[m]);
      moe_detail::FmaVec(wf, a, i, rows, acc);
    }
    if (s.v0 + kChunk >= vecs) {  // the pass's last chunk (warp-uniform)
      moe_detail::WarpSumAcc(acc);
      sink(s.q, s.p0, rows, acc);
      moe_detail::ZeroAcc(acc);
    }
  };
  PipeStep s0{first, 0, 0};
  PipeTask t0{};
  for (; s0.q < count; s0.q += stride) {
    if (task_at(s0.q, &t0) && t0.begin < t0.end) break;
  }
  s0.p0 = t0.begin;
  if (s0.q >= count) return;
  // Two register buffers, named (not indexed) so that they stay in registers.
  cuda_detail::Bf16x8 b0[kMats][kVecs], b1[kMats][kVecs];
  issue(s0, t0, b0);
  while (true) {
    PipeStep s1 = s0;
    PipeTask t1 = t0;
    advance(s1, t1);
    issue(s1, t1, b1);
    consume(s0, t0, b0);
    if (s1.q >= count) break;
    s0 = s1;
    t0 = t1;
    advance(s0, t0);
    issue(s0, t0, b0);
    consume(s1, t1, b1);
    if (s0.q >= count) break;
  }
}

// Vectors per lane per weight row and chunk of the pipelined kernels: two chunks in flight per
// warp within the 128 registers of two 256-thread blocks per SM.
template <int kRows>
inline constexpr int kPipeVecs = kRows <= 2 ? 4 : 2;

// ---- Fused decode path: three launches instead of six (moe_cuda.h).

constexpr int kFusedVecs = 8;   // weight vectors per lane in flight per weight row
constexpr int kDownCols = 8;    // output columns per block of the down + combine kernel
constexpr int kDownWarps = 8;

// Dynamic shared floats of the routing block (MoeFusedRouteMultiKernel's last block): logits
// [T, E], then the routing scratch of T warps, which the sort's counters [2E] (int32) reuse
// afterwards.
size_t FusedRouteSmemFloats(int64_t num_tokens, const MoeRoutingParams& p) {
  const int64_t route = num_tokens * (2 * p.num_experts + p.n_group);
  return static_cast<size_t>(num_tokens * p.num_experts + std::max(route, 2 * p.num_experts));
}

// RouteAndSort: the tail of the fused routing kernel, by its last block (at least
// num_tokens warps; every thread calls it after a barrier that made the logits visible):
// warp t routes token t from smem[t·E ...] (RouteToken, scratch after the T·E logits), then
// the counting sort of the ids (SortRows, its counters reusing the scratch).
__device__ __forceinline__ void RouteAndSort(float* smem, const RouteArgs& args,
                                             const SortOut& so) {
  const int warp = threadIdx.x >> 5;
  const int e_count = args.num_experts;
  float* scratch = smem + args.num_tokens * e_count;
  if (warp < args.num_tokens) {
    moe_detail::RouteToken(smem + warp * e_count,
                           scratch + warp * moe_detail::RouteScratchFloats(args), args, warp);
  }
  __syncthreads();  // ids in global memory, visible to the block; the scratch is free
  int32_t* counters = reinterpret_cast<int32_t*>(scratch);
  SortRows(args.topk_ids, args.num_tokens * args.top_k, e_count, so, counters,
           counters + e_count);
}

// Shared experts folded into the fused launches (MoeSharedExpert on the device side): gate/up
// [2n, k], down [k_out = hidden, n], activations act [num_tokens, n] (scratch).
struct SharedArgs {
  const bf16* w_gate_up;  // null: no shared expert
  const bf16* w_down;
  bf16* act;
  int n;
};

// Gate/up + SiLU·mul of the touched experts and (shared_cols > 0) of the shared expert's
// columns: a persistent grid (about two blocks per SM) of warps walking the tasks with
// PipelinedWarpDots. With `slots` touched experts (*num_active), task q < slots·n is
// column q / slots of the expert in slot q % slots (consecutive warps take different experts,
// so every SM streams all of them at once, and no warp idles on an empty slot); task
// slots·n + c is the shared expert's column c (c < shared_cols) for tokens 0..num_tokens-1.
// Each column's sums are GemvColumn's (the GEMV path's) bit for bit. PipedGateUp: the warp's
// part, tasks first, first + stride, ...; slots == 0: shared columns only (the routing kernel).
template <int kRows>
__device__ __forceinline__ void PipedGateUp(const ARows& x_rows, const bf16* w,
                                            const int32_t* offsets, const int32_t* active,
                                            int slots, int n, bf16* c, const SharedArgs& sh,
                                            int num_tokens, int shared_cols, int first,
                                            int stride) {
  const int lane = threadIdx.x & 31;
  const int routed = slots * n;
  const int k = x_rows.k;
  // The task list: routed tasks [0, routed), then the shared columns.
  const int shared_begin = routed;
  const int routed_begin = 0;
  auto is_shared = [&](int q) { return q >= shared_begin && q < shared_begin + shared_cols; };
  auto task_at = [&](int q, PipeTask* t) {
    if (is_shared(q)) {
      const int col = q - shared_begin;
      t->w0 = sh.w_gate_up + static_cast<int64_t>(col) * k;
      t->w_stride = static_cast<int64_t>(sh.n) * k;
      t->a = ARows{x_rows.base, nullptr, 1, k};
      t->begin = 0;
      t->end = num_tokens;
      return true;
    }
    q -= routed_begin;
    const int e = active[q % slots];
    t->w0 = w + (static_cast<int64_t>(e) * 2 * n + q / slots) * k;
    t->w_stride = static_cast<int64_t>(n) * k;
    t->a = x_rows;
    t->begin = offsets[e];
    t->end = offsets[e + 1];
    return true;
  };
  auto sink = [&](int q, int p0, int rows, const float(&acc)[2][kRows]) {
    const bool shared = is_shared(q);
    bf16* out = shared ? sh.act : c;
    const int width = shared ? sh.n : n;
    const int col = shared ? q - shared_begin : (q - routed_begin) / slots;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < rows && lane == j) {
        out[static_cast<int64_t>(p0 + j) * width + col] =
            __float2bfloat16_rn(SiluMul(acc[0][j], acc[1][j]));
      }
    }
  };
  PipelinedWarpDots<2, kRows, kPipeVecs<kRows>>(first, stride, routed + shared_cols, task_at,
                                                  sink);
}

// The routed experts' gate/up + SiLU·mul (and the shared expert's columns, when the routing
// launch did not compute them), launched as a programmatic dependent of the routing kernel on
// sm_90+: it waits for the routing's sort (and shared activations) first (a no-op for a normal
// launch). Only then may the down launch (a programmatic dependent of this one) get resident:
// it reads the sort before its own wait, so the routing kernel must be complete by then.
template <int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32, 2)
    MoePipedGateUpKernel(ARows x_rows, const bf16* __restrict__ w,
                         const int32_t* __restrict__ offsets, const int32_t* __restrict__ active,
                         const int32_t* __restrict__ num_active, int n, bf16* __restrict__ c,
                         SharedArgs sh, int num_tokens, int shared_cols) {
  const int first = static_cast<int>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  const int stride = static_cast<int>(gridDim.x) * kGemvWarps;
  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();
  PipedGateUp<kRows>(x_rows, w, offsets, active, *num_active, n, c, sh, num_tokens, shared_cols,
                     first, stride);
}

// ---- Fused routing: a warp per router row spreads the router matrix over ceil(E / 8)
// blocks, each warp one round trip of 8 16-byte loads per lane for hidden <= 2048, instead of
// streaming it through one SM.

constexpr int kRouteMultiWarps = 8;  // router rows per block; warps route tokens 0..7
static_assert(kRouteMultiWarps >= kMoeFusedMaxTokens, "a warp per token in the last block");
constexpr int kRouteCounterSlots = 1024;

// Arrival counters of the multi-block routing, one per workspace address (RouteCounterSlot).
// Zero at module load; the last block of each launch puts its counter back to 0, so every
// launch (CUDA-graph replays included) starts from 0.
__device__ unsigned int g_route_arrivals[kRouteCounterSlots];

// RouteCounterSlot: this workspace's slot in g_route_arrivals (fixed for the process), or -1
// when all slots are taken (the caller then zeroes a counter in the workspace). One slot per
// address: launches on one workspace are stream-ordered (its sort data already requires it),
// so no two launches share a counter at the same time; slot indices are the same on every
// device, each device has its own counters.
int RouteCounterSlot(const void* workspace) {
  static std::mutex* const mu = new std::mutex;
  static auto* const slots = new std::unordered_map<const void*, int>;
  std::lock_guard<std::mutex> lock(*mu);
  const auto it = slots->find(workspace);
  if (it != slots->end()) return it->second;
  if (slots->size() >= static_cast<size_t>(kRouteCounterSlots)) return -1;
  const int slot = static_cast<int>(slots->size());
  slots->emplace(workspace, slot);
  return slot;
}

// Blocks [0, RouteMultiBlocks) compute the router logits: warp w of block b takes expert
// 8·b + w (MoeRouterLogitsCuda's sums bit for bit: WarpDotChunked's per-column sums do not
// depend on how many columns a warp takes) and writes its T logits to `logits_g` [T, E] in
// global memory. Each block then counts itself in at the device-scope counter; the last one
// to arrive (all logits written and fenced before every arrival) copies the logits into shared
// memory, resets the counter and runs the routing (RouteToken, warp t for token t) and sort
// (SortRows), so ids and weights equal MoeRoutingCuda's over MoeRouterLogitsCuda's logits.
// Blocks from RouteMultiBlocks on (only with a shared expert) are persistent (the host sizes
// them to the SMs left over) and compute the shared expert's gate/up + SiLU·mul, walking its
// columns with PipedGateUp; they overlap the routing's latency. Dynamic shared memory:
// FusedRouteSmemFloats floats.
__host__ __device__ __forceinline__ int RouteMultiBlocks(int num_experts) {
  return (num_experts + kRouteMultiWarps - 1) / kRouteMultiWarps;
}

// pdl (MoeFusedRouteCuda's `pdl`): the launch is itself a programmatic dependent of the kernel
// before it (the post-attention norm that writes x): every read of x and every write comes
// after GridDependencyWait.
template <int kRows>
__global__ void __launch_bounds__(kRouteMultiWarps * 32, 2)
    MoeFusedRouteMultiKernel(const bf16* __restrict__ x, const bf16* __restrict__ w_gate,
                             int hidden, RouteArgs args, SortOut so, float* logits_g,
                             unsigned int* ws_counter, int slot, SharedArgs sh, bool pdl) {
  extern __shared__ float fused_smem[];
  // MoePipedGateUpKernel, a programmatic dependent, may launch now; it waits for this grid's
  // completion before it reads anything (a no-op otherwise). Its blocks only take SM slots that
  // this grid's blocks leave (they are all resident by the time every block has passed here).
  // Under pdl only once past GridDependencyWait below.
  if (!pdl) attention_detail::LaunchDependents();
  const int num_tokens = args.num_tokens;
  const int e_count = args.num_experts;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int route_blocks = RouteMultiBlocks(e_count);
  if (pdl) {
    attention_detail::GridDependencyWait();
    attention_detail::LaunchDependents();
  }
  if (static_cast<int>(blockIdx.x) >= route_blocks) {  // block-uniform: no barrier below
    const int first = (static_cast<int>(blockIdx.x) - route_blocks) * kRouteMultiWarps + warp;
    const int stride = (static_cast<int>(gridDim.x) - route_blocks) * kRouteMultiWarps;
    PipedGateUp<kRows>(ARows{x, nullptr, 1, hidden}, nullptr, nullptr, nullptr, /*slots=*/0, 0,
                       nullptr, sh, num_tokens, sh.n, first, stride);
    return;
  }
  const int e = static_cast<int>(blockIdx.x) * kRouteMultiWarps + warp;
  if (e < e_count) {  // warp-uniform
    const bf16* a[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      a[j] = x + static_cast<int64_t>(j < num_tokens ? j : 0) * hidden;
    }
    const bf16* w[1] = {w_gate + static_cast<int64_t>(e) * hidden};
    float acc[1][kRows];
    WarpDotChunked<1, kRows, kFusedVecs>(w, a, num_tokens, hidden, acc);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j < num_tokens && lane == j) logits_g[j * e_count + e] = acc[0][j];
    }
  }
  // Release: each writer fences its logits before the block's arrival is counted.
  __threadfence();
  __syncthreads();
  bool last = false;
  if (threadIdx.x == 0) {
    unsigned int* counter = slot >= 0 ? &g_route_arrivals[slot] : ws_counter;
    const unsigned int arrived = atomicAdd(counter, 1u) + 1u;
    last = arrived == static_cast<unsigned int>(route_blocks);
    // Every block of this launch has counted itself in: back to 0 for the next launch.
    if (last) atomicExch(counter, 0u);
  }
  // Barrier and broadcast in one (no static shared memory next to the dynamic 48 KiB).
  if (!__syncthreads_or(last)) return;  // block-uniform
  __threadfence();  // acquire side of the pattern, before reading other blocks' logits
  // L2 loads (ld.global.cg): this SM's L1 may hold stale lines of logits_g from an earlier call.
  for (int q = threadIdx.x; q < num_tokens * e_count; q += blockDim.x) {
    fused_smem[q] = __ldcg(logits_g + q);
  }
  __syncthreads();
  RouteAndSort(fused_smem, args, so);
}

// Down projection and combine in one launch: a block owns kDownCols output columns of every
// token. Its warps walk (touched expert, column pair) tasks with PipelinedWarpDots (the next
// task's weights in flight while the current one is reduced): the two adjacent weight rows of
// that expert are streamed once for the expert's activation rows, and each result is rounded
// to bf16 into shared memory by sorted row. Then thread (t, c) sums token t's top_k rows in k order exactly as
// MoeCombineKernel does (fp32 fmaf from 0, one bf16 rounding), then adds the shared expert's
// bf16 output when `sh` has one (one more task per column pair, over its token rows), and
// `add` [T, n] when given, each as bf16(a + routed) (AddInPlaceCuda's rounding). So without a
// shared expert the output equals the GEMV path's MoeCombineKernel (+ AddInPlaceCuda) bit for
// bit. Rows total <= kMoeFusedMaxRows.
// pdl (sm_90+): launched as a programmatic dependent of MoePipedGateUpKernel, so the grid may
// start while that kernel still runs: before GridDependencyWait it reads only the route
// kernel's sort (complete before the gate/up kernel started) and asks L2 for the weight rows of
// each warp's first task; act and everything it writes come after the wait.
template <int kRows>
__global__ void __launch_bounds__(kDownWarps * 32, 2)
    MoeDownCombineKernel(const bf16* __restrict__ act, const bf16* __restrict__ w,
                         const int32_t* __restrict__ offsets, const int32_t* __restrict__ active,
                         const int32_t* __restrict__ num_active,
                         const int32_t* __restrict__ row_to_sorted,
                         const float* __restrict__ topk_weights, int num_tokens, int top_k, int n,
                         int k, SharedArgs sh, const bf16* add, bf16* out, bool pdl,
                         bool trigger) {
  __shared__ float val[kDownCols][kMoeFusedMaxRows];
  __shared__ float shared_val[kDownCols][kMoeFusedMaxTokens];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int c0 = blockIdx.x * kDownCols;  // n % 8 == 0: every column of the block exists
  constexpr int kPairs = kDownCols / 2;
  const int routed_slots = *num_active;
  const int tasks = (routed_slots + (sh.w_gate_up != nullptr ? 1 : 0)) * kPairs;
  // Task → its two adjacent weight rows (first row) and their length; slot routed_slots is the
  // shared expert.
  auto task_rows = [&](int task, int* len) {
    const int slot = task / kPairs;
    const int c = (task % kPairs) * 2;
    if (slot == routed_slots) {
      *len = sh.n;
      return sh.w_down + static_cast<int64_t>(c0 + c) * sh.n;
    }
    *len = k;
    return w + (static_cast<int64_t>(active[slot]) * n + c0 + c) * k;
  };
  if (pdl) {
    if (warp < tasks) {
      int len = 0;
      const char* rows = reinterpret_cast<const char*>(task_rows(warp, &len));
      const int bytes = 2 * len * static_cast<int>(sizeof(bf16));
      for (int off = lane * 128; off < bytes; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(rows + off));
      }
    }
    attention_detail::GridDependencyWait();
    // trigger (MoeFusedExpertsCuda's `pdl`): the next layer's first kernel may launch now; it waits
    // for this grid before it reads `out`.
    if (trigger) attention_detail::LaunchDependents();
  }
  {
    // Task → the column pair's two weight rows over the expert's sorted rows of act, or over
    // the token rows of sh.act for the shared expert.
    auto task_at = [&](int task, PipeTask* t) {
      int len = 0;
      t->w0 = task_rows(task, &len);
      t->w_stride = len;
      if (task / kPairs == routed_slots) {
        t->a = ARows{sh.act, nullptr, 1, len};
        t->begin = 0;
        t->end = num_tokens;
      } else {
        const int e = active[task / kPairs];
        t->a = ARows{act, nullptr, 1, len};
        t->begin = offsets[e];
        t->end = offsets[e + 1];
      }
      return true;
    };
    // Each sum rounded to bf16, by sorted row (the shared expert's: by token).
    auto sink = [&](int task, int p0, int rows, const float(&acc)[2][kRows]) {
      const int c = (task % kPairs) * 2;
      float* v0 = task / kPairs == routed_slots ? shared_val[c] : val[c];
      float* v1 = task / kPairs == routed_slots ? shared_val[c + 1] : val[c + 1];
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        if (j < rows && lane == j) {
          v0[p0 + j] = __bfloat162float(__float2bfloat16_rn(acc[0][j]));
          v1[p0 + j] = __bfloat162float(__float2bfloat16_rn(acc[1][j]));
        }
      }
    };
    PipelinedWarpDots<2, kRows, kPipeVecs<kRows>>(warp, kDownWarps, tasks, task_at, sink);
  }
  __syncthreads();
  for (int q = threadIdx.x; q < num_tokens * kDownCols; q += blockDim.x) {
    const int t = q / kDownCols;
    const int c = q % kDownCols;
    float acc = 0.0f;
    for (int kk = 0; kk < top_k; ++kk) {
      const int pos = row_to_sorted[t * top_k + kk];
      if (pos < 0) continue;
      acc = fmaf(topk_weights[t * top_k + kk], val[c][pos], acc);
    }
    const int64_t o = static_cast<int64_t>(t) * n + c0 + c;
    bf16 r = __float2bfloat16_rn(acc);
    if (sh.w_gate_up != nullptr) r = __float2bfloat16_rn(shared_val[c][t] + __bfloat162float(r));
    if (add != nullptr) r = __float2bfloat16_rn(__bfloat162float(add[o]) + __bfloat162float(r));
    out[o] = r;
  }
}

// The device-side view of an optional shared expert; InvalidArgument (naming `who`) for bad
// sizes or pointers.
absl::Status ToSharedArgs(const MoeSharedExpert* shared, const char* who, SharedArgs* sh) {
  *sh = SharedArgs{nullptr, nullptr, nullptr, 0};
  if (shared == nullptr) return absl::OkStatus();
  if (shared->intermediate < 8 || shared->intermediate % 8 != 0 ||
      shared->intermediate > kMaxDim || shared->w_gate_up == nullptr ||
      shared->w_down == nullptr || shared->act == nullptr || !Aligned16(shared->w_gate_up) ||
      !Aligned16(shared->w_down) || !Aligned16(shared->act)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": shared expert needs intermediate a multiple of 8 in [8, 2^22] (got ",
        shared->intermediate, ") and non-null 16-byte aligned weights and act"));
  }
  *sh = SharedArgs{shared->w_gate_up, shared->w_down, shared->act,
                   static_cast<int>(shared->intermediate)};
  return absl::OkStatus();
}


// Blocks of a persistent fused-decode launch: two 256-thread blocks per SM (the kernels'
// launch bounds allow two), the SM count cached per device. No synchronizing call (fine during
// graph capture).
int PipedBlocks() {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cached[kCachedDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 2;
  if (device >= 0 && device < kCachedDevices) {
    if (const int blocks = cached[device].load(std::memory_order_relaxed); blocks > 0) {
      return blocks;
    }
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms < 1) {
    return 2;
  }
  if (device >= 0 && device < kCachedDevices) {
    cached[device].store(2 * sms, std::memory_order_relaxed);
  }
  return 2 * sms;
}

}  // namespace

bool MoeFusedDecodeSupported(int64_t num_tokens, const MoeRoutingParams& params) {
  return num_tokens >= 1 && num_tokens <= kMoeFusedMaxTokens && params.top_k >= 1 &&
         num_tokens * params.top_k <= kMoeFusedMaxRows && params.num_experts >= 1 &&
         params.num_experts <= kMoeCudaMaxExperts && params.n_group >= 1 &&
         FusedRouteSmemFloats(num_tokens, params) * sizeof(float) <= 48 * 1024;
}

absl::Status MoeFusedRouteCuda(const bf16* x, const bf16* w_gate, const float* correction_bias,
                               int64_t num_tokens, int64_t hidden, const MoeRoutingParams& params,
                               int32_t* topk_ids, float* topk_weights, MoeCudaWorkspace workspace,
                               cudaStream_t stream, const MoeSharedExpert* shared, bool pdl) {
  if (absl::Status s = ValidateMoeRoutingParams(params); !s.ok()) return s;
  if (!MoeFusedDecodeSupported(num_tokens, params) || hidden < 8 || hidden % 8 != 0 ||
      hidden > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeFusedRouteCuda: num_tokens=", num_tokens, " top_k=", params.top_k,
        " num_experts=", params.num_experts, " hidden=", hidden,
        " outside the fused decode path (MoeFusedDecodeSupported; hidden a multiple of 8)"));
  }
  if (x == nullptr || w_gate == nullptr || !Aligned16(x) || !Aligned16(w_gate) ||
      topk_ids == nullptr || topk_weights == nullptr || workspace.data == nullptr ||
      !Aligned16(workspace.data)) {
    return absl::InvalidArgumentError(
        "MoeFusedRouteCuda: x, w_gate and workspace must be non-null and 16-byte aligned, "
        "topk_ids and topk_weights non-null");
  }
  // Only the sort segments are written; they come first and depend on rows and E alone.
  const Layout l = MakeLayout(num_tokens * params.top_k, params.num_experts, 8, 8);
  if (workspace.bytes < l.act) {
    return absl::InvalidArgumentError(absl::StrCat("MoeFusedRouteCuda: workspace of ",
                                                   workspace.bytes, " bytes, need ", l.act));
  }
  SharedArgs sh;
  if (absl::Status s = ToSharedArgs(shared, "MoeFusedRouteCuda", &sh); !s.ok()) return s;
  const RouteArgs args =
      moe_detail::MakeRouteArgs(params, correction_bias, num_tokens, topk_ids, topk_weights);
  const SortOut so = SortPointers(workspace.data, l);
  const size_t smem = FusedRouteSmemFloats(num_tokens, params) * sizeof(float);
  const int h = static_cast<int>(hidden);
  unsigned char* ws = static_cast<unsigned char*>(workspace.data);
  float* logits = reinterpret_cast<float*>(ws + l.route_logits);
  unsigned int* ws_counter = reinterpret_cast<unsigned int*>(ws + l.route_counter);
  const int slot = RouteCounterSlot(workspace.data);
  if (slot < 0) {
    if (const cudaError_t err = cudaMemsetAsync(ws_counter, 0, sizeof(unsigned int), stream);
        err != cudaSuccess) {
      return absl::InternalError(
          absl::StrCat("MoeFusedRouteCuda counter memset: ", cudaGetErrorString(err)));
    }
  }
  // Persistent shared-expert blocks on the SMs the routing blocks leave.
  const int route_blocks = RouteMultiBlocks(static_cast<int>(params.num_experts));
  int shared_blocks = (sh.n + kRouteMultiWarps - 1) / kRouteMultiWarps;
  if (shared_blocks > 0) {
    shared_blocks = std::max(1, std::min(shared_blocks, PipedBlocks() - route_blocks));
  }
  const dim3 grid(static_cast<unsigned>(route_blocks + shared_blocks));
  constexpr int kThreads = kRouteMultiWarps * 32;
  auto* const kernel = num_tokens == 1   ? &MoeFusedRouteMultiKernel<1>
                       : num_tokens == 2 ? &MoeFusedRouteMultiKernel<2>
                       : num_tokens <= 4 ? &MoeFusedRouteMultiKernel<4>
                                         : &MoeFusedRouteMultiKernel<kWarpDotRows>;
  // A memset node before the launch (no counter slot left) breaks the programmatic chain.
  const bool chained = pdl && slot >= 0;
  (void)attention_detail::LaunchKernelMaybePdl(kernel, grid, dim3(kThreads), smem, stream, chained,
                                               x, w_gate, h, args, so, logits, ws_counter, slot,
                                               sh, chained);
  return CudaLaunchStatus("MoeFusedRouteCuda launch");
}

namespace {

// Both launches of MoeFusedExpertsCuda with kRows rows per pass over an expert's weights:
// MoePipedGateUpKernel, then MoeDownCombineKernel; pdl: each a programmatic dependent of the
// launch before it (sm_90+); trigger: the down kernel lets the next kernel launch early.
template <int kRows>
void LaunchFusedExperts(const ARows& x_rows, const bf16* w_gate_up, const bf16* w_down,
                        const SortOut& so, const float* topk_weights, unsigned max_active,
                        int num_tokens, int top_k, int h, int i, bf16* act, const SharedArgs& sh,
                        bool shared_gate_up, const bf16* add, bf16* out, bool pdl,
                        bool trigger, cudaStream_t stream) {
  // One persistent wave: at most PipedBlocks() blocks, fewer when there are fewer tasks.
  const int shared_cols = shared_gate_up ? sh.n : 0;
  const int64_t tasks = static_cast<int64_t>(max_active) * i + shared_cols;
  const unsigned blocks = static_cast<unsigned>(
      std::min<int64_t>((tasks + kGemvWarps - 1) / kGemvWarps, PipedBlocks()));
  (void)attention_detail::LaunchKernelMaybePdl(
      MoePipedGateUpKernel<kRows>, dim3(blocks), dim3(kGemvWarps * 32), 0, stream, pdl, x_rows,
      w_gate_up, so.offsets, so.active, so.num_active, i, act, sh, num_tokens, shared_cols);
  // A launch error is reported by the caller's CudaLaunchStatus.
  (void)attention_detail::LaunchKernelMaybePdl(
      MoeDownCombineKernel<kRows>, dim3(static_cast<unsigned>(h / kDownCols)),
      dim3(kDownWarps * 32), 0, stream, pdl, act, w_down, so.offsets, so.active, so.num_active,
      so.row_to_sorted, topk_weights, num_tokens, top_k, h, i, sh, add, out, pdl, pdl && trigger);
}

}  // namespace

absl::Status MoeFusedExpertsCuda(const bf16* x, const float* topk_weights, int64_t num_tokens,
                                 int64_t hidden, int64_t intermediate, int64_t top_k,
                                 int64_t num_experts, const bf16* w_gate_up, const bf16* w_down,
                                 const bf16* add, bf16* out, MoeCudaWorkspace workspace,
                                 cudaStream_t stream, const MoeSharedExpert* shared,
                                 bool pdl) {
  if (num_tokens < 1 || num_tokens > kMoeFusedMaxTokens || top_k < 1 || top_k > num_experts ||
      num_tokens * top_k > kMoeFusedMaxRows || num_experts > kMoeCudaMaxExperts || hidden < 8 ||
      hidden % 8 != 0 || intermediate < 8 || intermediate % 8 != 0 || hidden > kMaxDim ||
      intermediate > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeFusedExpertsCuda: bad shape num_tokens=", num_tokens, " hidden=", hidden,
        " intermediate=", intermediate, " top_k=", top_k, " num_experts=", num_experts,
        " (1 <= num_tokens <= ", kMoeFusedMaxTokens, ", num_tokens·top_k <= ", kMoeFusedMaxRows,
        ", hidden and intermediate multiples of 8)"));
  }
  for (const void* p : {static_cast<const void*>(x), static_cast<const void*>(w_gate_up),
                        static_cast<const void*>(w_down), static_cast<const void*>(out),
                        static_cast<const void*>(workspace.data)}) {
    if (p == nullptr || !Aligned16(p)) {
      return absl::InvalidArgumentError(
          "MoeFusedExpertsCuda: x, w_gate_up, w_down, out and workspace must be non-null and "
          "16-byte aligned");
    }
  }
  if (topk_weights == nullptr) {
    return absl::InvalidArgumentError("MoeFusedExpertsCuda: null topk_weights");
  }
  SharedArgs sh;
  if (absl::Status s = ToSharedArgs(shared, "MoeFusedExpertsCuda", &sh); !s.ok()) return s;
  const bool shared_gate_up = shared != nullptr && !shared->act_ready;
  // sm_90+: the gate/up launch overlaps the routing's tail and the down launch the gate/up's.
  const bool chain = PdlSupported();
  const Layout l = MakeLayout(num_tokens * top_k, num_experts, hidden, intermediate);
  if (workspace.bytes < l.total) {
    return absl::InvalidArgumentError(absl::StrCat("MoeFusedExpertsCuda: workspace of ",
                                                   workspace.bytes, " bytes, need ", l.total));
  }
  const SortOut so = SortPointers(workspace.data, l);
  bf16* act = reinterpret_cast<bf16*>(static_cast<unsigned char*>(workspace.data) + l.act);
  const ARows x_rows{x, so.sorted_rows, static_cast<int>(top_k), static_cast<int>(hidden)};
  const unsigned max_active = static_cast<unsigned>(std::min(num_experts, num_tokens * top_k));
  const int t = static_cast<int>(num_tokens), k = static_cast<int>(top_k);
  const int h = static_cast<int>(hidden), i = static_cast<int>(intermediate);
  if (num_tokens == 1) {
    LaunchFusedExperts<1>(x_rows, w_gate_up, w_down, so, topk_weights, max_active, t, k, h, i,
                          act, sh, shared_gate_up, add, out, chain, pdl, stream);
  } else if (num_tokens == 2) {
    LaunchFusedExperts<2>(x_rows, w_gate_up, w_down, so, topk_weights, max_active, t, k, h, i,
                          act, sh, shared_gate_up, add, out, chain, pdl, stream);
  } else if (num_tokens <= 4) {
    LaunchFusedExperts<4>(x_rows, w_gate_up, w_down, so, topk_weights, max_active, t, k, h, i,
                          act, sh, shared_gate_up, add, out, chain, pdl, stream);
  } else {
    LaunchFusedExperts<kWarpDotRows>(x_rows, w_gate_up, w_down, so, topk_weights, max_active, t,
                                     k, h, i, act, sh, shared_gate_up, add, out, chain, pdl,
                                     stream);
  }
  return CudaLaunchStatus("MoeFusedExpertsCuda launch");
}

}  // namespace sluice::kernels
