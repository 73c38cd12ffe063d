#include "kernels/mla_attention/mla_plumbing_cuda.h"

#include <algorithm>

#include "kernels/attention/attention_device.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/mla_attention/mla_attention_cuda.h"

namespace sluice::kernels {
namespace {

constexpr int kThreads = 256;

using kernels::cuda_detail::GridDependencyWait;
using kernels::cuda_detail::LaunchDependents;
using kernels::cuda_detail::LaunchKernelMaybePdl;

// pdl (the launchers' `pdl`): launched as a programmatic dependent of the kernel before it
// (kernels/cuda/pdl.cuh): wait for it before the first read, then let the next kernel launch.
__device__ __forceinline__ void PdlEnter(bool pdl) {
  if (pdl) {
    GridDependencyWait();
    LaunchDependents();
  }
}

__global__ void CopyHeadsKernel(const bf16* src, HeadSpans s, bf16* dst, HeadSpans d,
                                int64_t num_heads, int64_t width, int64_t total, bool pdl) {
  PdlEnter(pdl);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % width;
    const int64_t th = e / width;
    const int64_t h = th % num_heads;
    const int64_t t = th / num_heads;
    dst[t * d.token_stride + h * d.head_stride + i] =
        src[t * s.token_stride + h * s.head_stride + i];
  }
}

__global__ void AddInPlaceKernel(bf16* y, const bf16* x, int64_t n, bool pdl) {
  PdlEnter(pdl);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(x[i]));
  }
}

constexpr int kPrologueThreads = 256;

// Token t's prologue, by one block of kPrologueThreads: the latent row's norm, then every rope
// pair (heads of q, then k_pe) in one sweep; sources and destinations are disjoint, so no
// barrier between reads and writes.
__device__ __forceinline__ void PrologueToken(const MlaPrologueArgs& a, int64_t t) {
  __shared__ float scratch[32];
  const int r = static_cast<int>(a.R);
  const bf16* kv = a.kv + t * a.kv_stride;
  const int64_t slot = a.slots[t];
  bf16* row = slot >= 0 ? a.cache + slot * (a.R + a.dr) : nullptr;
  float sumsq = 0.0f;
  for (int i = threadIdx.x; i < r; i += blockDim.x) {
    const float v = __bfloat162float(kv[i]);
    sumsq += v * v;
  }
  const float total = kernels::cuda_detail::BlockSum(sumsq, scratch);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(r) + a.eps);
  if (row != nullptr) {
    for (int i = threadIdx.x; i < r; i += blockDim.x) {
      row[i] = __float2bfloat16_rn(__bfloat162float(kv[i]) * inv * __bfloat162float(a.kv_norm[i]));
    }
  }
  const int half = static_cast<int>(a.dr / 2);
  const int heads = static_cast<int>(a.heads);
  const float pos = static_cast<float>(a.positions[t]);
  for (int p = threadIdx.x; p < (heads + 1) * half; p += blockDim.x) {
    const int h = p / half;
    const int i = p % half;
    const bf16* src;
    bf16* dst;
    if (h < heads) {
      src = a.q_pe + t * a.q_token_stride + h * a.q_head_stride;
      dst = a.q_out + t * a.q_out_token_stride + h * a.q_out_head_stride;
    } else {
      if (row == nullptr) continue;
      src = kv + a.R;
      dst = row + a.R;
    }
    float s, c;
    sincosf(pos * a.inv_freq[i], &s, &c);
    c *= a.scaling;
    s *= a.scaling;
    const float x1 = __bfloat162float(a.interleave ? src[2 * i] : src[i]);
    const float x2 = __bfloat162float(a.interleave ? src[2 * i + 1] : src[i + half]);
    dst[i] = __float2bfloat16_rn(x1 * c - x2 * s);
    dst[i + half] = __float2bfloat16_rn(x2 * c + x1 * s);
  }
}

// One block per token.
__global__ void __launch_bounds__(kPrologueThreads)
    MlaPrologueKernel(MlaPrologueArgs a, bool pdl) {
  PdlEnter(pdl);
  PrologueToken(a, blockIdx.x);
}

constexpr int kAbsorbThreads = 256;
constexpr int kAbsorbColVecs = 16;                            // 8-column vectors per block
constexpr int kAbsorbDGroups = kAbsorbThreads / kAbsorbColVecs;  // d rows summed in parallel
constexpr int kAbsorbCols = kAbsorbColVecs * 8;
// Weight vectors per thread loaded before GridDependencyWait under kPdl: all of them for
// dn <= kAbsorbPreloads · kAbsorbDGroups (128: DeepSeek-V2/V3's qk_nope_head_dim), 32 registers.
constexpr int kAbsorbPreloads = 8;

struct AbsorbArgs {
  const bf16* q;
  int64_t q_token_stride, q_head_stride;
  const bf16* w;
  int64_t w_head_stride;
  bf16* out;
  int64_t out_token_stride, out_head_stride;
  int num_tokens, dn, r;
};

// Block (h, column block cb): thread (dg, cv) accumulates rows d ≡ dg (mod kAbsorbDGroups) of
// its 8 columns for every token (kRows >= num_tokens); the kAbsorbDGroups partial sums per
// column are then added in dg order through shared memory, one token at a time.
// kPdl (a programmatic dependent launch): the thread's first kAbsorbPreloads weight vectors
// (W_UK: no kernel of the step writes it) are loaded before GridDependencyWait, so they are in
// flight while the kernel before still runs; the same rows in the same order, so the same sums.
template <int kRows, bool kPdl>
__device__ __forceinline__ void AbsorbBlock(const AbsorbArgs& a, int h, int cb) {
  __shared__ float red[kAbsorbDGroups][kAbsorbCols];
  const int cv = threadIdx.x % kAbsorbColVecs;
  const int dg = threadIdx.x / kAbsorbColVecs;
  const int col = cb * kAbsorbCols + cv * 8;
  const bf16* w = a.w + h * a.w_head_stride + col;
  const bf16* q = a.q + h * a.q_head_stride;
  float acc[kRows][8];
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
#pragma unroll
    for (int u = 0; u < 8; ++u) acc[t][u] = 0.0f;
  }
  // acc[t] += q[t, d] · w[d, col .. col + 8) for every token.
  auto fma_row = [&](int d, const float(&wf)[8]) {
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
      if (t < a.num_tokens) {
        const float qv = __bfloat162float(q[t * a.q_token_stride + d]);
#pragma unroll
        for (int u = 0; u < 8; ++u) acc[t][u] = fmaf(qv, wf[u], acc[t][u]);
      }
    }
  };
  int d0 = dg;  // this thread's first row not yet summed
  if constexpr (kPdl) {
    kernels::cuda_detail::Bf16x8 pre[kAbsorbPreloads];
    if (col < a.r) {
#pragma unroll
      for (int i = 0; i < kAbsorbPreloads; ++i) {
        const int d = dg + i * kAbsorbDGroups;
        if (d < a.dn) pre[i] = kernels::cuda_detail::LoadVec(w + static_cast<int64_t>(d) * a.r);
      }
    }
    GridDependencyWait();  // q comes from the kernel before; out may still be read by others
    if (col < a.r) {
#pragma unroll
      for (int i = 0; i < kAbsorbPreloads; ++i) {
        const int d = dg + i * kAbsorbDGroups;
        if (d < a.dn) {
          float wf[8];
          kernels::cuda_detail::ToFloat8(pre[i], wf);
          fma_row(d, wf);
        }
      }
    }
    d0 = dg + kAbsorbPreloads * kAbsorbDGroups;
  }
  if (col < a.r) {
#pragma unroll 8
    for (int d = d0; d < a.dn; d += kAbsorbDGroups) {
      float wf[8];
      kernels::cuda_detail::LoadBf16x8(w + static_cast<int64_t>(d) * a.r, wf);
      fma_row(d, wf);
    }
  }
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    if (t >= a.num_tokens) break;  // block-uniform
#pragma unroll
    for (int u = 0; u < 8; ++u) red[dg][cv * 8 + u] = acc[t][u];
    __syncthreads();
    const int c = cb * kAbsorbCols + static_cast<int>(threadIdx.x);
    if (threadIdx.x < kAbsorbCols && c < a.r) {
      float sum = 0.0f;
      for (int g = 0; g < kAbsorbDGroups; ++g) sum += red[g][threadIdx.x];
      a.out[t * a.out_token_stride + h * a.out_head_stride + c] = __float2bfloat16_rn(sum);
    }
    __syncthreads();  // red is rewritten for the next token
  }
}

// Grid (heads, column blocks). kPdl: a programmatic dependent launch (AbsorbBlock waits).
template <int kRows, bool kPdl>
__global__ void __launch_bounds__(kAbsorbThreads) MlaAbsorbQueryKernel(AbsorbArgs a) {
  if constexpr (kPdl) LaunchDependents();
  AbsorbBlock<kRows, kPdl>(a, blockIdx.x, blockIdx.y);
}

static_assert(kAbsorbThreads == kPrologueThreads, "one block shape serves both");

// MlaPrologueAbsorbCuda's grid: blocks [0, num_tokens) run token blockIdx.x's prologue, the
// rest the absorbed-query GEMV's blocks in (head, column block) order. The branch is
// block-uniform, so each side's barriers see its whole block; the two write disjoint spans.
// When launched as a programmatic dependent of the fused input projection
// (pdl_bits & kMlaPdlAbsorb) every block waits before it reads what that
// wrote (a no-op in a plain launch): kPdl (kMlaPdlAbsorbPreload), the GEMV blocks after
// loading their W_UK vectors, else before any load.
template <int kRows, bool kPdl>
__global__ void __launch_bounds__(kAbsorbThreads)
    MlaPrologueAbsorbKernel(MlaPrologueArgs p, AbsorbArgs a, int col_blocks) {
  // The decode attention kernel after this one (a programmatic dependent on sm_90+) may get
  // resident now; it waits on griddepcontrol for this grid's writes. A no-op otherwise.
  kernels::attention_detail::LaunchDependents();
  const int b = static_cast<int>(blockIdx.x);
  if (b < a.num_tokens) {
    GridDependencyWait();
    PrologueToken(p, b);
  } else {
    const int g = b - a.num_tokens;
    if constexpr (!kPdl) GridDependencyWait();
    AbsorbBlock<kRows, kPdl>(a, g / col_blocks, g % col_blocks);
  }
}

// The kernel instances for num_tokens rows (1, 2, <= 4, <= 8) and a programmatic launch or not.
using AbsorbQueryFn = void (*)(AbsorbArgs);
template <int kRows>
AbsorbQueryFn AbsorbQueryFor(bool pdl) {
  return pdl ? &MlaAbsorbQueryKernel<kRows, true> : &MlaAbsorbQueryKernel<kRows, false>;
}
AbsorbQueryFn PickAbsorbQuery(int64_t num_tokens, bool pdl) {
  return num_tokens == 1   ? AbsorbQueryFor<1>(pdl)
         : num_tokens == 2 ? AbsorbQueryFor<2>(pdl)
         : num_tokens <= 4 ? AbsorbQueryFor<4>(pdl)
                           : AbsorbQueryFor<8>(pdl);
}
using PrologueAbsorbFn = void (*)(MlaPrologueArgs, AbsorbArgs, int);
template <int kRows>
PrologueAbsorbFn PrologueAbsorbFor(bool pdl) {
  return pdl ? &MlaPrologueAbsorbKernel<kRows, true> : &MlaPrologueAbsorbKernel<kRows, false>;
}
PrologueAbsorbFn PickPrologueAbsorb(int64_t num_tokens, bool pdl) {
  return num_tokens == 1   ? PrologueAbsorbFor<1>(pdl)
         : num_tokens == 2 ? PrologueAbsorbFor<2>(pdl)
         : num_tokens <= 4 ? PrologueAbsorbFor<4>(pdl)
                           : PrologueAbsorbFor<8>(pdl);
}

int Blocks(int64_t total) {
  return static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65535));
}

}  // namespace

absl::Status CopyHeadsCuda(const bf16* src, HeadSpans src_spans, bf16* dst, HeadSpans dst_spans,
                           int64_t num_tokens, int64_t num_heads, int64_t width,
                           cudaStream_t stream, bool pdl) {
  if (num_tokens < 0 || num_heads < 0 || width < 0) {
    return absl::InvalidArgumentError("CopyHeadsCuda: negative size");
  }
  const int64_t total = num_tokens * num_heads * width;
  if (total == 0) return absl::OkStatus();
  (void)LaunchKernelMaybePdl(&CopyHeadsKernel, dim3(Blocks(total)), dim3(kThreads), 0, stream,
                             pdl, src, src_spans, dst, dst_spans, num_heads, width, total, pdl);
  return kernels::CudaLaunchStatus("CopyHeadsKernel");
}

absl::Status AddInPlaceCuda(bf16* y, const bf16* x, int64_t n, cudaStream_t stream, bool pdl) {
  if (n < 0) return absl::InvalidArgumentError("AddInPlaceCuda: n < 0");
  if (n == 0) return absl::OkStatus();
  (void)LaunchKernelMaybePdl(&AddInPlaceKernel, dim3(Blocks(n)), dim3(kThreads), 0, stream, pdl,
                             y, x, n, pdl);
  return kernels::CudaLaunchStatus("AddInPlaceKernel");
}

namespace {

// MlaPrologueCuda's argument checks (num_tokens > 0).
absl::Status CheckPrologue(const MlaPrologueArgs& args, int64_t num_tokens) {
  if (num_tokens < 0 || args.R < 1 || args.dr < 2 || args.dr % 2 != 0 || args.heads < 0 ||
      num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError("MlaPrologueCuda: bad sizes");
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (args.kv == nullptr || args.kv_norm == nullptr || args.positions == nullptr ||
      args.slots == nullptr || args.inv_freq == nullptr || args.cache == nullptr ||
      (args.heads > 0 && (args.q_pe == nullptr || args.q_out == nullptr))) {
    return absl::InvalidArgumentError("MlaPrologueCuda: null pointer");
  }
  return absl::OkStatus();
}

// MlaAbsorbQueryCuda's argument checks, then its kernel arguments in *a.
absl::Status CheckAbsorb(const bf16* q, int64_t q_token_stride, int64_t q_head_stride,
                         const bf16* w, int64_t w_head_stride, bf16* out, int64_t out_token_stride,
                         int64_t out_head_stride, int64_t num_tokens, int64_t heads, int64_t dn,
                         int64_t R, AbsorbArgs* a) {
  if (num_tokens < 0 || num_tokens > kMlaAbsorbMaxTokens || heads < 1 || heads > 65535 ||
      dn < 1 || R < 8 || R % 8 != 0 || R > (int64_t{1} << 24) || dn > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        "MlaAbsorbQueryCuda: num_tokens must be in [0, 8], heads and dn positive, R a positive "
        "multiple of 8");
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (q == nullptr || w == nullptr || out == nullptr || !kernels::cuda_detail::Aligned16(w) ||
      w_head_stride % 8 != 0) {
    return absl::InvalidArgumentError(
        "MlaAbsorbQueryCuda: null pointer, or w / w_head_stride not 16-byte aligned");
  }
  *a = AbsorbArgs{q,   q_token_stride,   q_head_stride,   w,
                  w_head_stride, out, out_token_stride, out_head_stride,
                  static_cast<int>(num_tokens), static_cast<int>(dn), static_cast<int>(R)};
  return absl::OkStatus();
}

}  // namespace

absl::Status MlaPrologueCuda(const MlaPrologueArgs& args, int64_t num_tokens, cudaStream_t stream,
                             bool pdl) {
  if (absl::Status s = CheckPrologue(args, num_tokens); !s.ok() || num_tokens == 0) return s;
  (void)LaunchKernelMaybePdl(&MlaPrologueKernel, dim3(static_cast<unsigned>(num_tokens)),
                             dim3(kPrologueThreads), 0, stream, pdl, args, pdl);
  return kernels::CudaLaunchStatus("MlaPrologueKernel");
}

absl::Status MlaAbsorbQueryCuda(const bf16* q, int64_t q_token_stride, int64_t q_head_stride,
                                const bf16* w, int64_t w_head_stride, bf16* out,
                                int64_t out_token_stride, int64_t out_head_stride,
                                int64_t num_tokens, int64_t heads, int64_t dn, int64_t R,
                                cudaStream_t stream, bool pdl) {
  AbsorbArgs a{};
  if (absl::Status s = CheckAbsorb(q, q_token_stride, q_head_stride, w, w_head_stride, out,
                                   out_token_stride, out_head_stride, num_tokens, heads, dn, R, &a);
      !s.ok() || num_tokens == 0) {
    return s;
  }
  const dim3 grid(static_cast<unsigned>(heads),
                  static_cast<unsigned>((R + kAbsorbCols - 1) / kAbsorbCols));
  (void)LaunchKernelMaybePdl(PickAbsorbQuery(num_tokens, pdl), grid, dim3(kAbsorbThreads), 0,
                             stream, pdl, a);
  return kernels::CudaLaunchStatus("MlaAbsorbQueryKernel");
}

absl::Status MlaPrologueAbsorbCuda(const MlaPrologueArgs& prologue, const bf16* q,
                                   int64_t q_token_stride, int64_t q_head_stride, const bf16* w,
                                   int64_t w_head_stride, bf16* out, int64_t out_token_stride,
                                   int64_t out_head_stride, int64_t num_tokens, int64_t heads,
                                   int64_t dn, int64_t R, cudaStream_t stream, int pdl_bits) {
  if (absl::Status s = CheckPrologue(prologue, num_tokens); !s.ok()) return s;
  AbsorbArgs a{};
  if (absl::Status s = CheckAbsorb(q, q_token_stride, q_head_stride, w, w_head_stride, out,
                                   out_token_stride, out_head_stride, num_tokens, heads, dn, R, &a);
      !s.ok() || num_tokens == 0) {
    return s;
  }
  const int64_t col_blocks = (R + kAbsorbCols - 1) / kAbsorbCols;
  if (heads * col_blocks + num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError("MlaPrologueAbsorbCuda: grid too large");
  }
  const unsigned grid = static_cast<unsigned>(num_tokens + heads * col_blocks);
  const int cb = static_cast<int>(col_blocks);
  const int bits = pdl_bits;
  const bool pdl = (bits & (kernels::kMlaPdlAbsorb | kernels::kMlaPdlAbsorbPreload)) != 0;
  const bool preload = (bits & kernels::kMlaPdlAbsorbPreload) != 0;
  (void)LaunchKernelMaybePdl(PickPrologueAbsorb(num_tokens, preload), dim3(grid),
                             dim3(kAbsorbThreads), 0, stream, pdl, prologue, a, cb);
  return kernels::CudaLaunchStatus("MlaPrologueAbsorbKernel");
}

namespace {

// Vector units of the MHA plumbing kernels: 16 bytes (8 bf16) when every span is a multiple
// of 8 elements, else 4 bytes (2 bf16, the gather: R and dr are even) or one element.
template <int kW>
struct VecOf;
template <>
struct VecOf<8> {
  using Type = uint4;
};
template <>
struct VecOf<2> {
  using Type = uint32_t;
};
template <>
struct VecOf<1> {
  using Type = uint16_t;
};

// Unit u of the gather: row r = u / units_per_row of the outputs, then kW-element unit i of
// that row's [kv_c (R) | k_pe (dr)]; the unit never straddles the two (kW divides R and dr).
template <int kW>
__global__ void GatherLatentKernel(const bf16* cache, int64_t R, int64_t dr,
                                   const int32_t* context_lens, const int32_t* query_start_loc,
                                   const int32_t* block_tables, int64_t max_blocks_per_seq,
                                   int64_t block_size, int64_t rows_per_seq, bf16* kv_c,
                                   bf16* k_pe, int64_t total) {
  using V = typename VecOf<kW>::Type;
  const int64_t units_per_row = (R + dr) / kW;
  for (int64_t u = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; u < total;
       u += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = u / units_per_row;
    const int64_t e = (u % units_per_row) * kW;  // element within the latent row
    const int64_t s = row / rows_per_seq;
    const int64_t j = row % rows_per_seq;
    const int64_t len =
        int64_t{context_lens[s]} + query_start_loc[s + 1] - query_start_loc[s];
    V val{};
    if (j < len) {
      const int64_t slot =
          int64_t{block_tables[s * max_blocks_per_seq + j / block_size]} * block_size +
          j % block_size;
      val = *reinterpret_cast<const V*>(cache + slot * (R + dr) + e);
    }
    bf16* dst = e < R ? kv_c + row * R + e : k_pe + row * dr + (e - R);
    *reinterpret_cast<V*>(dst) = val;
  }
}

// Unit u of the assembly: row r, head h, kW-element unit of that head's [k (dn + dr) | v (dv)]
// outputs; kW divides dn, dr and dv, so no unit straddles two spans.
template <int kW>
__global__ void AssembleKvKernel(const bf16* kv_up, const bf16* k_pe, int64_t heads, int64_t dn,
                                 int64_t dr, int64_t dv, bf16* k, bf16* v, int64_t total) {
  using V = typename VecOf<kW>::Type;
  const int64_t qk = dn + dr;
  const int64_t units_per_head = (qk + dv) / kW;
  for (int64_t u = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; u < total;
       u += int64_t{gridDim.x} * blockDim.x) {
    const int64_t rh = u / units_per_head;  // row · heads + head
    const int64_t e = (u % units_per_head) * kW;
    const int64_t r = rh / heads;
    const bf16* up = kv_up + rh * (dn + dv);
    const bf16* src;
    bf16* dst;
    if (e < dn) {
      src = up + e;
      dst = k + rh * qk + e;
    } else if (e < qk) {
      src = k_pe + r * dr + (e - dn);
      dst = k + rh * qk + e;
    } else {
      src = up + dn + (e - qk);
      dst = v + rh * dv + (e - qk);
    }
    *reinterpret_cast<V*>(dst) = *reinterpret_cast<const V*>(src);
  }
}

}  // namespace

absl::Status MlaGatherLatentCuda(const bf16* cache, int64_t R, int64_t dr,
                                 const int32_t* context_lens, const int32_t* query_start_loc,
                                 const int32_t* block_tables, int64_t max_blocks_per_seq,
                                 int64_t block_size, int64_t num_seqs, int64_t rows_per_seq,
                                 bf16* kv_c, bf16* k_pe, cudaStream_t stream) {
  if (R < 2 || R % 2 != 0 || dr < 2 || dr % 2 != 0 || num_seqs < 0 || rows_per_seq < 1 ||
      block_size < 1 || max_blocks_per_seq < 0) {
    return absl::InvalidArgumentError("MlaGatherLatentCuda: bad sizes");
  }
  if (num_seqs == 0) return absl::OkStatus();
  if (cache == nullptr || context_lens == nullptr || query_start_loc == nullptr ||
      block_tables == nullptr || kv_c == nullptr || k_pe == nullptr) {
    return absl::InvalidArgumentError("MlaGatherLatentCuda: null pointer");
  }
  // 16-byte units need every row start 16-byte aligned: cache rows of R + dr, kv_c rows of R,
  // k_pe rows of dr (the buffers themselves come from cudaMalloc).
  const bool wide = R % 8 == 0 && dr % 8 == 0 && kernels::cuda_detail::Aligned16(cache) &&
                    kernels::cuda_detail::Aligned16(kv_c) &&
                    kernels::cuda_detail::Aligned16(k_pe);
  const int64_t rows = num_seqs * rows_per_seq;
  if (wide) {
    const int64_t total = rows * (R + dr) / 8;
    GatherLatentKernel<8><<<Blocks(total), kThreads, 0, stream>>>(
        cache, R, dr, context_lens, query_start_loc, block_tables, max_blocks_per_seq, block_size,
        rows_per_seq, kv_c, k_pe, total);
  } else {
    const int64_t total = rows * (R + dr) / 2;
    GatherLatentKernel<2><<<Blocks(total), kThreads, 0, stream>>>(
        cache, R, dr, context_lens, query_start_loc, block_tables, max_blocks_per_seq, block_size,
        rows_per_seq, kv_c, k_pe, total);
  }
  return kernels::CudaLaunchStatus("GatherLatentKernel");
}

absl::Status MlaAssembleKvCuda(const bf16* kv_up, const bf16* k_pe, int64_t rows, int64_t heads,
                               int64_t dn, int64_t dr, int64_t dv, bf16* k, bf16* v,
                               cudaStream_t stream) {
  if (rows < 0 || heads < 0 || dn < 1 || dr < 1 || dv < 1) {
    return absl::InvalidArgumentError("MlaAssembleKvCuda: bad sizes");
  }
  if (rows == 0 || heads == 0) return absl::OkStatus();
  if (kv_up == nullptr || k_pe == nullptr || k == nullptr || v == nullptr) {
    return absl::InvalidArgumentError("MlaAssembleKvCuda: null pointer");
  }
  const bool wide = dn % 8 == 0 && dr % 8 == 0 && dv % 8 == 0 &&
                    kernels::cuda_detail::Aligned16(kv_up) &&
                    kernels::cuda_detail::Aligned16(k_pe) && kernels::cuda_detail::Aligned16(k) &&
                    kernels::cuda_detail::Aligned16(v);
  if (wide) {
    const int64_t total = rows * heads * (dn + dr + dv) / 8;
    AssembleKvKernel<8><<<Blocks(total), kThreads, 0, stream>>>(kv_up, k_pe, heads, dn, dr, dv,
                                                                 k, v, total);
  } else {
    const int64_t total = rows * heads * (dn + dr + dv);
    AssembleKvKernel<1><<<Blocks(total), kThreads, 0, stream>>>(kv_up, k_pe, heads, dn, dr, dv,
                                                                 k, v, total);
  }
  return kernels::CudaLaunchStatus("AssembleKvKernel");
}

}  // namespace sluice::kernels
