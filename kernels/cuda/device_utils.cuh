// Device-side helpers shared by the .cu kernels: 16-byte bf16 vectors and a block-wide sum.
#ifndef SLUICE_KERNELS_CUDA_DEVICE_UTILS_CUH_
#define SLUICE_KERNELS_CUDA_DEVICE_UTILS_CUH_

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace sluice::kernels::cuda_detail {

// Bf16x8: eight bfloat16 values in one 16-byte aligned load/store.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

// LoadVec / StoreVec move a Bf16x8 at 16-byte aligned `p` in one 16-byte access. Dereferencing
// a Bf16x8* instead copies its four __nv_bfloat162 members one by one (nvcc 13 emits four
// 4-byte loads or stores): four times the memory instructions, and in a latency-bound loop
// ptxas then keeps fewer loads in flight.
__device__ __forceinline__ Bf16x8 LoadVec(const void* p) {
  const uint4 r = *reinterpret_cast<const uint4*>(p);
  Bf16x8 v;
  static_assert(sizeof(v) == sizeof(r));
  memcpy(&v, &r, sizeof(v));
  return v;
}
__device__ __forceinline__ void StoreVec(void* p, const Bf16x8& v) {
  uint4 r;
  memcpy(&r, &v, sizeof(r));
  *reinterpret_cast<uint4*>(p) = r;
}

// Widens the 8 values of `v` to fp32.
__device__ __forceinline__ void ToFloat8(const Bf16x8& v, float (&out)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(v.h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Rounds 8 fp32 values to bf16 (nearest even).
__device__ __forceinline__ Bf16x8 ToBf16x8(const float (&in)[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return v;
}

// Loads 8 bf16 from 16-byte aligned `p` and widens them to fp32.
__device__ __forceinline__ void LoadBf16x8(const __nv_bfloat16* p, float (&out)[8]) {
  ToFloat8(LoadVec(p), out);
}

// Rounds 8 fp32 values to bf16 (nearest even) and stores them at 16-byte aligned `p`.
__device__ __forceinline__ void StoreBf16x8(__nv_bfloat16* p, const float (&in)[8]) {
  StoreVec(p, ToBf16x8(in));
}

// True when every pointer is 16-byte aligned (so rows of a multiple of 8 bf16 can be moved
// as Bf16x8).
__host__ __device__ inline bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// BlockSum returns the sum of `v` over the block to every thread, combined in a fixed order
// (deterministic). blockDim.x must be a multiple of 32, at most 1024. `scratch` is 32 floats
// of shared memory; the call contains __syncthreads() and must be reached by all threads.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < num_warps ? scratch[lane] : 0.0f;
  total = WarpSum(total);
  __syncthreads();  // scratch may be reused by the caller afterwards.
  return total;
}

static __device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global→shared copy (cp.async, sm_80+); src_bytes 0 writes zeros (padding, masked
// rows). CpAsyncCommit closes a group of copies; CpAsyncWait<n> waits until at most n groups
// are in flight.
static __device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(src_bytes));
}
static __device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
static __device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// D(16×8, fp32) += A(16×16, bf16, row) · B(16×8, bf16, col) on the tensor cores (sm_80+).
// Fragment layouts: PTX ISA, "Matrix Fragments for mma.m16n8k16" (g = lane/4, t = lane%4):
//   A: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B: b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C: c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace sluice::kernels::cuda_detail

#endif  // SLUICE_KERNELS_CUDA_DEVICE_UTILS_CUH_
