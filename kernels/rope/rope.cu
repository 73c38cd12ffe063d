// CUDA RoPE: one block per token; each thread owns one rotation pair (i, i + half) of one head
// and a block sweeps `heads_per_pass` heads at a time (RopeQkWriteKvCuda on many tokens instead
// moves 16-byte chunks, see RopeQkWriteKvVecKernel). In the interleaved layout a pair's
// outputs land where other threads' inputs were, so every thread reads its pair before a
// barrier and writes after it.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/rope/rope_cuda.h"

namespace sluice::kernels {
namespace {

constexpr int kTargetThreads = 256;

// PdlEnter starts every kernel here: as a programmatic dependent (the launchers' `pdl`,
// pdl.cuh) the next kernel may launch once every block has started, and nothing is read (the
// positions and qkv come from earlier work) or written (an earlier kernel may still read the
// cache or qkv) before the previous kernel has completed. No-ops in a normal launch.
__device__ __forceinline__ void PdlEnter() {
  cuda_detail::LaunchDependents();
  cuda_detail::GridDependencyWait();
}

// The rotation pair i = threadIdx.x % half of token blockIdx.x and its cos / sin (fp32 angle
// pos · inv_freq[i]), both times `scaling`.
struct PairRotation {
  int i;
  float c, s;
};
__device__ __forceinline__ PairRotation ThreadPairRotation(const int32_t* __restrict__ positions,
                                                         const float* __restrict__ inv_freq,
                                                         int half, float scaling) {
  PairRotation r;
  r.i = threadIdx.x % half;
  const float angle = static_cast<float>(positions[blockIdx.x]) * inv_freq[r.i];
  sincosf(angle, &r.s, &r.c);
  r.c *= scaling;
  r.s *= scaling;
  return r;
}

template <bool kInterleave>
__global__ void __launch_bounds__(1024)
    RopeKernel(bf16* x, int64_t num_heads, int64_t token_stride, int64_t head_stride,
               int64_t offset, const int32_t* __restrict__ positions,
               const float* __restrict__ inv_freq, int half, int heads_per_pass, float scaling) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const PairRotation rot = ThreadPairRotation(positions, inv_freq, half, scaling);
  const int i = rot.i;
  const float c = rot.c, s = rot.s;
  const int head_in_pass = threadIdx.x / half;
  bf16* token = x + t * token_stride + offset;
  for (int64_t h0 = 0; h0 < num_heads; h0 += heads_per_pass) {
    const int64_t h = h0 + head_in_pass;
    const bool active = h < num_heads;
    bf16* v = token + h * head_stride;
    float x1 = 0.0f, x2 = 0.0f;
    if (active) {
      x1 = __bfloat162float(kInterleave ? v[2 * i] : v[i]);
      x2 = __bfloat162float(kInterleave ? v[2 * i + 1] : v[i + half]);
    }
    if constexpr (kInterleave) __syncthreads();
    if (active) {
      v[i] = __float2bfloat16_rn(x1 * c - x2 * s);
      v[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
    }
    if constexpr (kInterleave) __syncthreads();
  }
}

// Fused QKV row of one token (blockIdx.x): q heads, then k heads, then v (each head head_dim
// wide). Rotates q and k (rotate-half, pair i of a head per thread) in place and, when the
// token has a cache slot, writes the rotated k and the v row to it. A token's heads are spread
// over gridDim.y blocks of heads_per_pass heads each (a decode step has one token: one block
// sweeping all 40 heads of Llama-3-8B took 10 dependent rounds of loads), and the v / tail
// copies over all of them. Each k element is stored to the cache by the thread that produced
// it, so no barrier is needed.
__global__ void __launch_bounds__(1024)
    RopeQkWriteKvKernel(bf16* qkv, int64_t token_stride, int num_heads, int num_kv_heads,
                        int head_dim, const int32_t* __restrict__ positions,
                        const float* __restrict__ inv_freq, int half, int heads_per_pass,
                        float scaling, const int64_t* __restrict__ slot_mapping, bf16* k_cache,
                        bf16* v_cache) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const PairRotation rot = ThreadPairRotation(positions, inv_freq, half, scaling);
  const int i = rot.i;
  const float c = rot.c, s = rot.s;
  const int head_in_pass = threadIdx.x / half;
  const int64_t slot = slot_mapping[t];
  const int64_t kv_dim = int64_t{num_kv_heads} * head_dim;
  bf16* token = qkv + t * token_stride;
  bf16* k_dst = slot >= 0 ? k_cache + slot * kv_dim : nullptr;
  const int heads = num_heads + num_kv_heads;
  for (int h = static_cast<int>(blockIdx.y) * heads_per_pass + head_in_pass; h < heads;
       h += heads_per_pass * static_cast<int>(gridDim.y)) {
    bf16* v = token + int64_t{h} * head_dim;
    const float x1 = __bfloat162float(v[i]);
    const float x2 = __bfloat162float(v[i + half]);
    const bf16 o1 = __float2bfloat16_rn(x1 * c - x2 * s);
    const bf16 o2 = __float2bfloat16_rn(x2 * c + x1 * s);
    v[i] = o1;
    v[i + half] = o2;
    if (h >= num_heads && k_dst != nullptr) {
      bf16* kh = k_dst + int64_t{h - num_heads} * head_dim;
      kh[i] = o1;
      kh[i + half] = o2;
    }
  }
  if (k_dst == nullptr) return;
  // This thread's share of the copies below, over all the token's blocks.
  const int64_t first = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.y} * blockDim.x;
  // Channels past the rotary span (partial rotary) go to the cache unchanged.
  const int tail = head_dim - 2 * half;
  if (tail > 0) {
    const bf16* k_src = token + int64_t{num_heads} * head_dim;
    for (int64_t e = first; e < int64_t{num_kv_heads} * tail; e += stride) {
      const int64_t at = (e / tail) * head_dim + 2 * half + e % tail;
      k_dst[at] = k_src[at];
    }
  }
  const bf16* v_src = token + int64_t{num_heads + num_kv_heads} * head_dim;
  bf16* v_dst = v_cache + slot * kv_dim;
  if (kv_dim % 8 == 0 && cuda_detail::Aligned16(v_src) && cuda_detail::Aligned16(v_dst)) {
    for (int64_t e = first; e < kv_dim / 8; e += stride) {
      cuda_detail::StoreVec(v_dst + e * 8, cuda_detail::LoadVec(v_src + e * 8));
    }
  } else {
    for (int64_t e = first; e < kv_dim; e += stride) v_dst[e] = v_src[e];
  }
}

// RopeQkWriteKvKernel for many tokens (prefill and batched decode steps), bandwidth-shaped:
// every access is 16 bytes and a token's work is spread over several blocks (grid.x) × tokens
// (grid.y, striding past 65535). A token row has three kinds of 16-byte items, numbered in
// this order:
//   rotation: (group of kVecHeads heads, chunk c of 8 rotation pairs) — the thread rotates
//             chunk c of x1 = v[8c..] and x2 = v[half + 8c..] in each head of its group,
//             storing k heads to the cache as well;
//   k tail:   (kv head, chunk) of the unrotated channels past 2·half, copied to the cache;
//   v:        chunk of the v row, copied to the cache.
// The token's `half` (cos, sin) pairs are computed once per block into shared memory (blocks
// holding rotation items only; dynamic shared memory of half float2) rather than by every
// rotation item: an fp32 sincosf is ~40 instructions, and with kVecHeads 4 a Llama-3-8B token
// (40 heads) would compute each pair 10 times.
// Needs half, head_dim and token_stride multiples of 8 and 16-byte aligned qkv and caches.
// The same fp32 formula as RopeQkWriteKvKernel; each cached k chunk is the bits of the rotated
// chunk written back to qkv.
constexpr int kVecHeads = 4;
constexpr int kVecThreads = 128;

__global__ void __launch_bounds__(kVecThreads)
    RopeQkWriteKvVecKernel(bf16* qkv, int64_t num_tokens, int64_t token_stride, int num_heads,
                           int num_kv_heads, int head_dim, const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq, int half, float scaling,
                           const int64_t* __restrict__ slot_mapping, bf16* k_cache,
                           bf16* v_cache) {
  extern __shared__ float2 rope_cs[];  // [half]: (cos, sin) · scaling of the current token
  PdlEnter();
  const int heads = num_heads + num_kv_heads;
  const int pair_chunks = half / 8;
  const int rot_items = (heads + kVecHeads - 1) / kVecHeads * pair_chunks;
  const int tail_chunks = (head_dim - 2 * half) / 8;
  const int tail_items = num_kv_heads * tail_chunks;
  const int v_items = num_kv_heads * head_dim / 8;
  const int item = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  // Block-uniform: whether any thread of this block rotates (and so needs the table).
  const bool block_rotates = static_cast<int>(blockIdx.x * blockDim.x) < rot_items;
  if (!block_rotates && item >= rot_items + tail_items + v_items) return;
  const int64_t kv_dim = int64_t{num_kv_heads} * head_dim;
  for (int64_t t = blockIdx.y; t < num_tokens; t += gridDim.y) {
    bf16* token = qkv + t * token_stride;
    const int64_t slot = slot_mapping[t];
    if (block_rotates) {
      __syncthreads();  // the previous token's table is no longer read
      const float pos = static_cast<float>(positions[t]);
      for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float sn, cs;
        sincosf(pos * inv_freq[i], &sn, &cs);
        rope_cs[i] = make_float2(cs * scaling, sn * scaling);
      }
      __syncthreads();
    }
    if (item < rot_items) {
      const int c = item % pair_chunks;
      const int h0 = item / pair_chunks * kVecHeads;
      float cs[8], sn[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 r = rope_cs[8 * c + j];
        cs[j] = r.x;
        sn[j] = r.y;
      }
#pragma unroll
      for (int k = 0; k < kVecHeads; ++k) {
        const int h = h0 + k;
        if (h >= heads) break;
        bf16* x = token + int64_t{h} * head_dim + 8 * c;
        float x1[8], x2[8], o1[8], o2[8];
        cuda_detail::LoadBf16x8(x, x1);
        cuda_detail::LoadBf16x8(x + half, x2);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          o1[j] = x1[j] * cs[j] - x2[j] * sn[j];
          o2[j] = x2[j] * cs[j] + x1[j] * sn[j];
        }
        const cuda_detail::Bf16x8 r1 = cuda_detail::ToBf16x8(o1);
        const cuda_detail::Bf16x8 r2 = cuda_detail::ToBf16x8(o2);
        cuda_detail::StoreVec(x, r1);
        cuda_detail::StoreVec(x + half, r2);
        if (h >= num_heads && slot >= 0) {
          bf16* kd = k_cache + slot * kv_dim + int64_t{h - num_heads} * head_dim + 8 * c;
          cuda_detail::StoreVec(kd, r1);
          cuda_detail::StoreVec(kd + half, r2);
        }
      }
    } else if (slot >= 0 && item < rot_items + tail_items) {
      const int e = item - rot_items;
      const int64_t at = int64_t{e / tail_chunks} * head_dim + 2 * half + 8 * (e % tail_chunks);
      cuda_detail::StoreVec(k_cache + slot * kv_dim + at,
                            cuda_detail::LoadVec(token + int64_t{num_heads} * head_dim + at));
    } else if (slot >= 0 && item < rot_items + tail_items + v_items) {
      const int64_t at = int64_t{item - rot_items - tail_items} * 8;
      cuda_detail::StoreVec(v_cache + slot * kv_dim + at,
                            cuda_detail::LoadVec(token + int64_t{heads} * head_dim + at));
    }
  }
}

// Tokens at which a launch takes RopeQkWriteKvVecKernel: decode steps keep the per-token
// kernel (one block sweeping few heads of one token; launch-bound either way).
constexpr int64_t kVecMinTokens = 16;

}  // namespace

absl::Status RopeQkWriteKvCuda(bf16* qkv, int64_t num_tokens, int64_t token_stride,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               const int32_t* positions, const DeviceRopeTable& table,
                               const int64_t* slot_mapping, bf16* k_cache, bf16* v_cache,
                               cudaStream_t stream, bool pdl) {
  const int64_t half = table.rotary_dim / 2;
  if (num_tokens < 0 || num_tokens > 0x7fffffff || num_heads < 1 || num_kv_heads < 1 ||
      head_dim < 1 || half < 1 || half > 1024 || 2 * half > head_dim ||
      table.inv_freq.size() != static_cast<size_t>(half) ||
      token_stride < (num_heads + 2 * num_kv_heads) * head_dim ||
      num_heads + num_kv_heads > 0x7fffffff / head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RopeQkWriteKvCuda: bad arguments num_tokens=", num_tokens, " token_stride=",
        token_stride, " num_heads=", num_heads, " num_kv_heads=", num_kv_heads, " head_dim=",
        head_dim, " rotary_dim=", table.rotary_dim));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (qkv == nullptr || positions == nullptr || slot_mapping == nullptr || k_cache == nullptr ||
      v_cache == nullptr) {
    return absl::InvalidArgumentError("RopeQkWriteKvCuda: null pointer");
  }
  const int64_t heads = num_heads + num_kv_heads;
  if (num_tokens >= kVecMinTokens && half % 8 == 0 && head_dim % 8 == 0 &&
      token_stride % 8 == 0 && cuda_detail::Aligned16(qkv) && cuda_detail::Aligned16(k_cache) &&
      cuda_detail::Aligned16(v_cache)) {
    const int64_t items = (heads + kVecHeads - 1) / kVecHeads * (half / 8) +
                          num_kv_heads * ((head_dim - 2 * half) / 8) + num_kv_heads * head_dim / 8;
    const dim3 grid(static_cast<unsigned>((items + kVecThreads - 1) / kVecThreads),
                    static_cast<unsigned>(std::min<int64_t>(num_tokens, 65535)));
    (void)cuda_detail::LaunchKernelMaybePdl(
        &RopeQkWriteKvVecKernel, grid, dim3(kVecThreads), half * sizeof(float2), stream,
        pdl, qkv, num_tokens, token_stride, static_cast<int>(num_heads),
        static_cast<int>(num_kv_heads), static_cast<int>(head_dim), positions,
        table.inv_freq.data(), static_cast<int>(half), table.attention_scaling, slot_mapping,
        k_cache, v_cache);
    return CudaLaunchStatus("RopeQkWriteKvCuda launch");
  }
  const int64_t heads_per_pass = std::clamp<int64_t>(kTargetThreads / half, 1, heads);
  // One pass per block: every head group gets its own block (grid.y is at most 65535).
  const int64_t groups = std::min<int64_t>((heads + heads_per_pass - 1) / heads_per_pass, 65535);
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(groups));
  (void)cuda_detail::LaunchKernelMaybePdl(
      &RopeQkWriteKvKernel, grid, dim3(static_cast<unsigned>(heads_per_pass * half)), 0, stream,
      pdl, qkv, token_stride, static_cast<int>(num_heads),
      static_cast<int>(num_kv_heads), static_cast<int>(head_dim), positions,
      table.inv_freq.data(), static_cast<int>(half), static_cast<int>(heads_per_pass),
      table.attention_scaling, slot_mapping, k_cache, v_cache);
  return CudaLaunchStatus("RopeQkWriteKvCuda launch");
}

absl::StatusOr<DeviceRopeTable> UploadRopeTable(const RopeTable& table) {
  const size_t half = table.inv_freq.size();
  if (half == 0 || half > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("UploadRopeTable: rotary_dim / 2 must be in [1, 1024], got ", half));
  }
  DeviceRopeTable out;
  auto buffer = DeviceBuffer<float>::Create(half);
  if (!buffer.ok()) return buffer.status();
  out.inv_freq = *std::move(buffer);
  absl::Status s = out.inv_freq.CopyFromHost(table.inv_freq.data());
  if (!s.ok()) return s;
  out.rotary_dim = static_cast<int64_t>(2 * half);
  out.attention_scaling = table.attention_scaling;
  return out;
}

absl::Status RopeCuda(bf16* x, int64_t num_tokens, int64_t num_heads, int64_t token_stride,
                      int64_t head_stride, int64_t offset, const int32_t* positions,
                      const DeviceRopeTable& table, bool interleave, cudaStream_t stream,
                      bool pdl) {
  const int64_t half = table.rotary_dim / 2;
  if (num_tokens < 0 || num_tokens > 0x7fffffff || num_heads < 0 || offset < 0 || half < 1 ||
      half > 1024 || table.inv_freq.size() != static_cast<size_t>(half)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RopeCuda: bad arguments num_tokens=", num_tokens, " num_heads=", num_heads,
                     " offset=", offset, " rotary_dim=", table.rotary_dim));
  }
  if (num_tokens == 0 || num_heads == 0) return absl::OkStatus();
  const int64_t heads_per_pass = std::clamp<int64_t>(kTargetThreads / half, 1, num_heads);
  const int threads = static_cast<int>(heads_per_pass * half);
  const unsigned grid = static_cast<unsigned>(num_tokens);
  (void)cuda_detail::LaunchKernelMaybePdl(
      interleave ? &RopeKernel<true> : &RopeKernel<false>, dim3(grid), dim3(threads), 0, stream,
      pdl, x, num_heads, token_stride, head_stride, offset, positions,
      table.inv_freq.data(), static_cast<int>(half), static_cast<int>(heads_per_pass),
      table.attention_scaling);
  return CudaLaunchStatus("RopeCuda launch");
}

}  // namespace sluice::kernels
