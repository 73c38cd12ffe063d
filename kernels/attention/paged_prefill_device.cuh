// The paged prefill kernels' shared pieces: their argument block (Fa2Args), the epilogue
// (StorePrefillRows), the mma.sync / ldmatrix wrappers, and the host entry points of the
// FlashAttention-2 style kernel (paged_prefill_fa2.cu).
#ifndef SLUICE_KERNELS_ATTENTION_PAGED_PREFILL_DEVICE_CUH_
#define SLUICE_KERNELS_ATTENTION_PAGED_PREFILL_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/cuda/device_utils.cuh"

namespace sluice::kernels::paged_detail {

using bf16 = __nv_bfloat16;

// Kernel arguments shared by every paged attention kernel (paged_attention_launch.cuh's AttnArgs
// extends them for the decode kernels; see PagedAttentionCuda for their meaning).
struct Fa2Args {
  const bf16* q;
  int64_t q_token_stride;
  const bf16* k_cache;
  const bf16* v_cache;
  const int32_t* query_start_loc;
  const int32_t* context_lens;
  const int32_t* block_tables;
  int64_t max_blocks_per_seq;
  int num_heads;
  int num_kv_heads;
  int group;  // query heads per KV head
  int head_dim;
  int v_head_dim;
  int block_size;
  int block_shift;  // log2(block_size) when a power of two, else -1
  int sliding_window;
  float scale_log2;  // softmax scale · log2(e): scores are exponentiated with exp2
  int num_m_tiles;
  int num_splits;
  int partition_tokens;  // keys per split (multiple of the key tile); unused when num_splits 1
  int num_tokens;
  bool q_vec;  // q 16-byte aligned with a stride of whole 16-byte chunks (prefill kinds)
  bf16* out;
  float* partial_out;  // [num_splits, num_tokens, num_heads, v_head_dim] normalized
  float2* partial_ml;  // [num_splits, num_tokens, num_heads] (max·log2e-scaled, sum)
};

// StorePrefillRows: the prefill kernels' epilogue. Each of a warp's kMT m16 tiles holds, per
// thread, rows g and g + 8 (acc[mi][u][2i..2i+1]: columns u·8 + 2t, +1); the row sums are
// summed over the quad, and rows below `rows` (query tokens × group) are normalized and written
// as bf16 to args.out, or, for a split, as fp32 to args.partial_out with (max · c_log2, sum) in
// args.partial_ml for the split-KV combine (the max in log2-scaled units; −inf stays −inf).
// wrow0: the warp's first row; q_begin: the sequence's first query token.
template <int kMT, int kVTiles>
__device__ __forceinline__ void StorePrefillRows(const Fa2Args& args,
                                                 const float (&acc)[kMT][kVTiles][4],
                                                 const float (&row_max)[kMT][2],
                                                 const float (&row_sum)[kMT][2], float c_log2,
                                                 int wrow0, int rows, int q_begin, int kv_head,
                                                 int split, int g, int t) {
  const int group = args.group;
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = row_sum[mi][i];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int r = wrow0 + mi * 16 + g + 8 * i;
      if (r >= rows) continue;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int64_t out_row = static_cast<int64_t>(q_begin + r / group) * args.num_heads +
                              kv_head * group + r % group;
      if (args.num_splits == 1) {
        bf16* o = args.out + out_row * args.v_head_dim;
#pragma unroll
        for (int u = 0; u < kVTiles; ++u) {
          const int col = u * 8 + 2 * t;
          if (col < args.v_head_dim) {
            *reinterpret_cast<__nv_bfloat162*>(o + col) =
                __floats2bfloat162_rn(acc[mi][u][2 * i] * inv, acc[mi][u][2 * i + 1] * inv);
          }
        }
      } else {
        const int64_t part_row =
            static_cast<int64_t>(split) * args.num_tokens * args.num_heads + out_row;
        float* o = args.partial_out + part_row * args.v_head_dim;
#pragma unroll
        for (int u = 0; u < kVTiles; ++u) {
          const int col = u * 8 + 2 * t;
          if (col < args.v_head_dim) {
            *reinterpret_cast<float2*>(o + col) =
                make_float2(acc[mi][u][2 * i] * inv, acc[mi][u][2 * i + 1] * inv);
          }
        }
        // The combine expects the max in log2-scaled units (−inf stays −inf: c > 0).
        if (t == 0) args.partial_ml[part_row] = make_float2(row_max[mi][i] * c_log2, sum);
      }
    }
  }
}

using cuda_detail::Mma16816;  // kernels/cuda/device_utils.cuh

static __device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Shared-memory row pitch in bf16: 8 elements (16 bytes) of padding shift consecutive rows by
// 4 banks, so the 8 rows read by one B-fragment load (and by ldmatrix) hit distinct banks.
template <int kD>
__host__ __device__ constexpr int Pitch() {
  return kD + 8;
}

// Four 8×8 bf16 matrices from shared memory (ldmatrix, no transpose) at 32-bit shared-window
// addresses (fewer live registers than generic pointers): lanes 8i..8i+7 give the row
// addresses of matrix i; lane l receives row l/4, columns 2(l%4)..+1 of each. ..Trans: the
// transposes (B fragments of a row-major K×N tile).
static __device__ __forceinline__ void LdMatrixX4At(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
static __device__ __forceinline__ void LdMatrixX4TransAt(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// PrefillSoftmaxStep: one key tile's online-softmax step (FlashAttention-2) for a warp's m16
// tile of query rows, as the MMA-tile, FA2 and wgmma prefill kernels keep it: this thread holds
// rows g and g + 8, score tile n the keys 8n + 2t, +1 (s[n][2i + e]: row g + 8i; raw, unscaled
// scores, masked ones −inf), output column tile u likewise (acc[u][2i + e]). The running max
// stays in raw score units and the scale folds into the exponent, P = 2^(s·c − m·c) with
// c = scale·log2(e) > 0: one FFMA + MUFU per score. row_sum (this thread's partial sums) and
// acc are rescaled only when some row of the warp raised its max (exact: otherwise every
// factor is 1). P comes out rounded to bf16 as the A fragments of P·V: the C fragments of
// score tiles 2k and 2k + 1 are exactly the A fragment of P's k-step k.
template <int kSTiles, int kVTiles>
__device__ __forceinline__ void PrefillSoftmaxStep(const float (&s)[kSTiles][4], float c_log2,
                                                   float (&row_max)[2], float (&row_sum)[2],
                                                   float (&acc)[kVTiles][4],
                                                   uint32_t (&p_frag)[kSTiles / 2][4]) {
  float neg_base[2], alpha[2];
  bool raised = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = row_max[i];
#pragma unroll
    for (int n = 0; n < kSTiles; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // A row with nothing visible yet keeps max −inf; exponentiate against 0 so that 2^(−inf)
    // is 0 rather than NaN.
    const float mb = mx == -INFINITY ? 0.0f : mx * c_log2;
    const bool up = mx != row_max[i];
    alpha[i] = up ? attention_detail::Exp2(row_max[i] * c_log2 - mb) : 1.0f;
    raised |= up;
    row_max[i] = mx;
    row_sum[i] *= alpha[i];
    neg_base[i] = -mb;
  }
  if (__any_sync(0xffffffffu, raised)) {
#pragma unroll
    for (int u = 0; u < kVTiles; ++u) {
      acc[u][0] *= alpha[0];
      acc[u][1] *= alpha[0];
      acc[u][2] *= alpha[1];
      acc[u][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int n = 0; n < kSTiles; ++n) {
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[e] = attention_detail::Exp2(fmaf(s[n][e], c_log2, neg_base[e >> 1]));
      row_sum[e >> 1] += p[e];
    }
    p_frag[n / 2][(n & 1) * 2 + 0] = PackBf16(p[0], p[1]);
    p_frag[n / 2][(n & 1) * 2 + 1] = PackBf16(p[2], p[3]);
  }
}

// ---- FlashAttention-2 style prefill kernel (paged_prefill_fa2.cu) ----
// Whether the FA2 kernel serves (head_dim, v_head_dim): both ≤ 128 and the larger > 32
// (padded to 64 or 128 columns). Others must use another prefill kernel.
inline bool Fa2Supports(int64_t head_dim, int64_t v_head_dim) {
  const int64_t m = head_dim > v_head_dim ? head_dim : v_head_dim;
  return m > 32 && m <= 128;
}

// Query rows (token · group + head) per CTA.
constexpr int kFa2RowsPerCta = 128;

// CTAs resident per SM at the padded dims of (head_dim, v_head_dim) (≥ 1; 1 on errors).
// Requires Fa2Supports.
int Fa2Occupancy(int64_t head_dim, int64_t v_head_dim);

// Launches the kernel over `grid` = (m tiles · KV heads · splits, 1, sequences), linear x with
// the longest query tiles first (as PagedMmaPrefillKernel). Requires Fa2Supports and
// args.scale_log2 > 0. `pdl`: launch as a programmatic dependent.
absl::Status LaunchFa2Prefill(const Fa2Args& args, dim3 grid, cudaStream_t stream, bool pdl);

}  // namespace sluice::kernels::paged_detail

#endif  // SLUICE_KERNELS_ATTENTION_PAGED_PREFILL_DEVICE_CUH_
