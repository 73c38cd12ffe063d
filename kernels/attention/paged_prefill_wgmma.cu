// Paged prefill attention on Hopper tensor cores with wgmma (PagedPrefillKernel::kWgmma;
// paged_prefill_wgmma.h). sm_90a only: wgmma exists in no other architecture, so there the
// kernel's body is a __trap() guard and WgmmaPrefillSupports keeps PagedAttentionCuda off it.
//
// Same semantics, GQA row packing (row = token · group + head-in-group, 128 rows a CTA), paging,
// split-KV partials, causal masking and epilogue (StorePrefillRows) as the FlashAttention-2
// kernel of paged_prefill_fa2.cu; what differs is the matrix instruction. mma.sync m16n8k16
// leaves much of Hopper's tensor-core rate unused; wgmma.mma_async, where a warpgroup (4 warps,
// 128 threads) multiplies a 64-row A by an N-column B read straight from shared memory through
// matrix descriptors, is what reaches the rest of the bf16 rate (PTX ISA, "Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate Instructions"; Shah et al., "FlashAttention-3",
// 2024, arXiv:2407.08608, for using it in attention). Design (our own, simpler than FA3: no
// TMA, no producer warps, no overlap of one tile's softmax with the next tile's Q·Kᵀ inside a
// warpgroup):
//  * CTA = 2 warpgroups (256 threads); warpgroup w owns query rows 64w..64w+63 of the CTA's 128.
//    Key tiles of 64 keys, double-buffered in shared memory, copied by all threads with cp.async
//    (16 B each, zero-filled outside [kv_begin, kv_end) so masked keys never bring NaN garbage
//    from unowned cache slots into P·V); the next tile's copies are issued right after the
//    barrier and land while this tile is computed.
//  * S = Q·Kᵀ: 8 × wgmma m64n64k16 (A = Q, B = K, both from shared memory, K-major), fp32
//    accumulators in registers (32 a thread).
//  * Online softmax in registers as the FA2 kernel (PrefillSoftmaxStep: raw-score running max,
//    exp2 with the scale folded into one FFMA, O rescaled only when some row of the warp raised
//    its max). The accumulator
//    layout of wgmma .m64nNk16 per warp is the m16n8 C-fragment layout repeated over n (PTX ISA,
//    "Register Fragments and Shared Memory Matrix Layouts" of wgmma: lane holds rows lane/4 and
//    lane/4 + 8 of its warp's 16, columns 8i + 2(lane%4) + {0,1}), and wgmma's register A
//    operand has the m16n8k16 A-fragment layout per warp, so P's bf16 A fragments are S's
//    registers packed in pairs, no shuffles (as with mma.sync in FA2).
//  * O += P·V: 4 × wgmma m64n128k16, A = P from registers, B = V from shared memory as an
//    MN-major operand (V's rows are keys = the K dimension; its head dim, N, is contiguous:
//    imm-trans-b = 1). O: 64 fp32 registers a thread.
//  * Shared-memory operands use the 128-byte swizzle (descriptor mode 1): a block of rows of 64
//    columns (128 bytes), row r at r·128 bytes, its 16-byte chunk c stored at chunk c ^ (r % 8)
//    (CUTLASS's Swizzle<3,4,3>; PTX ISA "Shared Memory Matrix Layout"), so the 8 rows of a core
//    matrix hit distinct banks. Head dim 128 = two such blocks of 64 rows (8 KiB apart). Every
//    block starts at a 1024-byte boundary (descriptor base offset 0). Descriptors (PTX ISA
//    "Matrix Descriptor Format": start address, leading / stride byte offsets, each >> 4;
//    swizzle mode in bits 62-63):
//      K-major (Q, K): SBO = 1024 (8 rows × 128 B to the next 8 rows), LBO unused (1); k16 step
//      ks starts at block ks/4, byte 32·(ks%4) of the row (the swizzle applies to the computed
//      addresses, so advancing the start address is enough).
//      MN-major (V): canonical layout ((8,8,m),(8,k)) : ((1,8,LBO),(64,SBO)) in elements, so
//      LBO = 8 KiB between the two 64-column blocks of N and SBO = 1024 B between groups of 8
//      keys; k16 step kk starts at key 16·kk (2 KiB).
//  * Proxies: wgmma reads shared memory through the async proxy while cp.async / st.shared write
//    through the generic proxy, so each thread issues fence.proxy.async.shared::cta after its
//    copies complete and before the CTA barrier that publishes them (PTX ISA, "Memory
//    Consistency Model", proxies). Each warpgroup waits for its wgmma groups (wait_group 0)
//    before the next barrier, so no buffer is overwritten while it is read.
//  * 2 CTAs per SM (97 KiB of shared memory, ≤ 128 registers a thread): while one CTA's
//    warpgroups run the softmax, the other's keep the tensor cores busy.
//  * Causal: a warpgroup skips key tiles past its last row's position (the CTA still copies them
//    for the other warpgroup) and masks only tiles that straddle its diagonal or a partition
//    edge. The grid runs the longest query tiles first (as the other prefill kinds).
//  * ptxas (nvcc 13, sm_90a): 128 registers, 24 bytes of spill stores / 40 of loads.
//  * Faster than the FA2 kernel at Llama-3-8B prefill on an H200; 1-CTA, register-Q and
//    FA3-pipelined forms measured slower (bench/results/paged_attention_variants.md).
#include "kernels/attention/paged_prefill_wgmma.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/paged_prefill_device.cuh"
#include "kernels/cuda/cuda_common.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SLUICE_WGMMA_ENABLED 1
#else
#define SLUICE_WGMMA_ENABLED 0
#endif

namespace sluice::kernels::paged_detail {
namespace {

using attention_detail::CpAsyncCommit;
using attention_detail::CpAsyncWait;
using attention_detail::Exp2;
using attention_detail::SmemAddr;

constexpr int kD = 128;                // head dim of Q, K and V
constexpr int kBM = kWgmmaRowsPerCta;  // query rows per CTA (2 warpgroups × 64)
constexpr int kBN = 64;                // keys per tile
constexpr int kThreads = 256;
constexpr int kStages = 2;
constexpr int kBlockBytes = 64 * 128;           // 64 rows × 64 columns of bf16, swizzled
constexpr int kOperandBytes = 2 * kBlockBytes;  // 64 rows × 128 columns
constexpr int kQBytes = 2 * kOperandBytes;      // both warpgroups' Q
constexpr int kStageBytes = 2 * kOperandBytes;  // K tile, then V tile
// + 1 KiB to align the base to the swizzle pattern's 1024-byte period.
constexpr int kSmemBytes = kQBytes + kStages * kStageBytes + 1024;
static_assert(kBN == 64 && kD == 128);

// Byte offset of 16-byte chunk `chunk` (0..15) of row `row` (0..63) in a 64-row × 128-column bf16
// operand stored as two 128-byte-swizzled column blocks.
static __device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * kBlockBytes + row * 128 +
                               (((chunk & 7) ^ (row & 7)) << 4));
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle (PTX ISA "Matrix Descriptor Format"):
// start address, leading and stride byte offsets, each encoded (x & 0x3FFFF) >> 4.
static __device__ __forceinline__ uint64_t SmemDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}

static __device__ __forceinline__ void CpAsync16At(uint32_t smem_addr, const void* gmem,
                                                   int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(src_bytes));
}

static __device__ __forceinline__ void StShared16(uint32_t smem_addr, uint32_t a, uint32_t b,
                                                  uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}

static __device__ __forceinline__ void FenceProxyAsync() {
#if SLUICE_WGMMA_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void WgmmaFence() {
#if SLUICE_WGMMA_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void WgmmaCommit() {
#if SLUICE_WGMMA_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
static __device__ __forceinline__ void WgmmaWait() {
#if SLUICE_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Pins accumulator registers after a wait: an empty volatile asm that "rewrites" them, so no read
// of them can be scheduled before the wgmma.wait_group (which does not name them).
template <int kN>
static __device__ __forceinline__ void FenceOperands(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// D(64×64, fp32) (+)= A(64×16) · B(16×64), A and B bf16 from shared memory (descriptors), both
// K-major (no transpose); scale_d 0 overwrites D.
static __device__ __forceinline__ void WgmmaSsM64N64K16(float (&d)[32], uint64_t desc_a,
                                                        uint64_t desc_b, int scale_d) {
#if SLUICE_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

// D(64×128, fp32) += A(64×16) · B(16×128): A bf16 from registers (the m16n8k16 A fragment layout
// per warp, rows 16·(warp%4)..), B bf16 from shared memory, MN-major (transposed).
static __device__ __forceinline__ void WgmmaRsM64N128K16T(float (&d)[64], const uint32_t (&a)[4],
                                                          uint64_t desc_b, int scale_d) {
#if SLUICE_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#endif
}

__global__ void __launch_bounds__(kThreads, 2) WgmmaPrefillKernel(const Fa2Args args) {
#if SLUICE_WGMMA_ENABLED
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem0 = (SmemAddr(smem_raw) + 1023u) & ~1023u;
  const uint32_t q_smem = smem0;
  const uint32_t kv_smem = smem0 + kQBytes;

  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();
  PrefillTile cta;  // no sliding window (WgmmaPrefillSupports)
  if (!PrefillTileOf<kBM, /*kWindow=*/false>(args, &cta)) return;  // uniform over the CTA
  const int seq = cta.seq, split = cta.split, kv_head = cta.kv_head, q_begin = cta.q_begin;
  const int ctx = cta.ctx, group = cta.group, rows = cta.rows, row0 = cta.row0;
  const int kv_begin = cta.kv_begin, kv_end = cta.kv_end;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wg = warp / 4;  // warpgroup
  const int wg_row0 = row0 + wg * 64;
  const int wrow0 = wg_row0 + (warp % 4) * 16;  // this warp's first row
  const bool wg_live = wg_row0 < rows;
  // Positions of the warpgroup's first and last valid row (skip and unmasked-tile tests).
  const int wg_pos_first = ctx + wg_row0 / group;
  const int wg_pos_last = ctx + (min(wg_row0 + 64, rows) - 1) / group;

  // Q tile → shared memory (swizzled), zero rows past `rows`: 128 rows × 16 chunks, 8 a thread.
#pragma unroll
  for (int i = 0; i < kBM * 16 / kThreads; ++i) {
    const int c = tid + kThreads * i;
    const int r = c >> 4;
    const int chunk = c & 15;
    const int row = row0 + r;
    const bool live = row < rows;
    const bf16* src = args.q;
    if (live) {
      src += static_cast<int64_t>(q_begin + row / group) * args.q_token_stride +
             static_cast<int64_t>(kv_head * group + row % group) * kD + chunk * 8;
    }
    const uint32_t dst = q_smem + (r >> 6) * kOperandBytes + SwizzledOffset(r & 63, chunk);
    if (args.q_vec) {
      CpAsync16At(dst, src, live ? 16 : 0);
    } else {
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (live) {
#pragma unroll
        for (int k = 0; k < 4; ++k) w[k] = __ldg(reinterpret_cast<const unsigned int*>(src) + k);
      }
      StShared16(dst, w[0], w[1], w[2], w[3]);
    }
  }
  CpAsyncCommit();

  // K/V copies: thread tid copies chunk tid % 16 of keys tid / 16 + 16·i (i < 4) of a tile, K and
  // V; 16 consecutive threads read one key's 256-byte row (coalesced). Keys 16 apart share the
  // swizzle phase (row % 8), so one base offset serves all four.
  const int64_t slot_stride = static_cast<int64_t>(args.num_kv_heads) * kD;  // elements
  const bf16* const k_src0 = args.k_cache + static_cast<int64_t>(kv_head) * kD + (tid & 15) * 8;
  const bf16* const v_src0 = args.v_cache + static_cast<int64_t>(kv_head) * kD + (tid & 15) * 8;
  const int key_lo = tid >> 4;
  const uint32_t kv_dst0 = kv_smem + SwizzledOffset(key_lo, tid & 15);
  const int32_t* const table =
      args.block_tables + static_cast<int64_t>(seq) * args.max_blocks_per_seq;
  auto load = [&](int tile, int stage) {
#pragma unroll
    for (int i = 0; i < kBN / 16; ++i) {
      const int j = tile + key_lo + 16 * i;
      const bool live = j >= kv_begin && j < kv_end;
      int64_t slot = 0;
      if (live) {
        const int block = args.block_shift >= 0 ? j >> args.block_shift : j / args.block_size;
        slot = static_cast<int64_t>(__ldg(table + block)) * args.block_size +
               (j - block * args.block_size);
      }
      const uint32_t dst = kv_dst0 + stage * kStageBytes + i * 16 * 128;
      CpAsync16At(dst, live ? k_src0 + slot * slot_stride : k_src0, live ? 16 : 0);
      CpAsync16At(dst + kOperandBytes, live ? v_src0 + slot * slot_stride : v_src0, live ? 16 : 0);
    }
    CpAsyncCommit();
  };

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float row_max[1][2] = {{-INFINITY, -INFINITY}};  // raw (unscaled) score units
  float row_sum[1][2] = {{0.0f, 0.0f}};            // this thread's partial; quad-summed at the end
  const float c_log2 = args.scale_log2;            // > 0 (WgmmaPrefillSupports)

  const int tile_first = kv_begin / kBN * kBN;
  if (tile_first < kv_end) load(tile_first, 0);
  const uint64_t q_desc = SmemDesc(q_smem + wg * kOperandBytes, 16, 1024);
  int stage = 0;
  for (int tile = tile_first; tile < kv_end; tile += kBN, stage ^= 1) {
    // This thread's copies of Q and this tile are done; publish them to the async proxy and the
    // CTA. Past the barrier every warpgroup is also done with the other buffer.
    CpAsyncWait<0>();
    FenceProxyAsync();
    __syncthreads();
    if (tile + kBN < kv_end) load(tile + kBN, stage ^ 1);
    if (!wg_live || tile > wg_pos_last) continue;  // uniform over the warpgroup

    const uint32_t k_smem = kv_smem + stage * kStageBytes;
    const uint64_t k_desc = SmemDesc(k_smem, 16, 1024);
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      // k16 step ks: column block ks / 4, byte 32·(ks % 4) of the 128-byte rows.
      const uint64_t off = static_cast<uint64_t>(((ks >> 2) * kBlockBytes + (ks & 3) * 32) >> 4);
      WgmmaSsM64N64K16(s, q_desc + off, k_desc + off, ks > 0 ? 1 : 0);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceOperands(s);

    // Mask where some row of the warpgroup sees part of the tile (its causal diagonal and the
    // partition edges). s[4n + 2h + e]: row wrow0 + g + 8h, key tile + 8n + 2t + e.
    const bool full = tile >= kv_begin && tile + kBN <= kv_end && tile + kBN - 1 <= wg_pos_first;
    if (!full) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wrow0 + g + 8 * h;
        const int pos = r < rows ? ctx + r / group : -1;
        const int hi = min(kv_end - 1, pos);  // visible keys: kv_begin ≤ j ≤ hi
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = tile + n * 8 + 2 * t + e;
            if (j < kv_begin || j > hi) s[4 * n + 2 * h + e] = -INFINITY;
          }
        }
      }
    }

    // Online softmax (PrefillSoftmaxStep): s[4n + 2h + e] and o[4u + 2h + e] are the m16n8 C
    // layouts it takes as s[n][2h + e] and acc[u][2h + e]; P's k16 step kk takes score chunks
    // 2kk (a0: row g, a1: row g + 8) and 2kk + 1 (a2, a3).
    uint32_t p[kBN / 16][4];
    PrefillSoftmaxStep<kBN / 8, kD / 8>(*reinterpret_cast<const float(*)[kBN / 8][4]>(s), c_log2,
                                        row_max[0], row_sum[0],
                                        *reinterpret_cast<float(*)[kD / 8][4]>(o), p);

    // O += P·V; V MN-major: k16 step kk starts at key 16·kk (16 rows × 128 B).
    const uint64_t v_desc = SmemDesc(k_smem + kOperandBytes, kBlockBytes, 1024);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      WgmmaRsM64N128K16T(o, p[kk], v_desc + static_cast<uint64_t>((kk * 16 * 128) >> 4), 1);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceOperands(o);
  }
  // An empty partition never waited for its copies; no copy may outlive the CTA.
  CpAsyncWait<0>();

  // o[4u + 2h + e] is the m16n8 C layout (row g + 8h, column 8u + 2t + e) that StorePrefillRows
  // reads as acc[0][u][2h + e].
  StorePrefillRows<1, kD / 8>(args, *reinterpret_cast<const float(*)[1][kD / 8][4]>(o), row_max,
                              row_sum, c_log2, wrow0, rows, q_begin, kv_head, split, g, t);
#else
#ifdef __CUDA_ARCH__
  __trap();  // not sm_90a code: WgmmaPrefillSupports keeps launches away
#endif
#endif
}

cudaError_t AllowSmem() {
  return cudaFuncSetAttribute(WgmmaPrefillKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSmemBytes);
}

// Whether the current device runs this binary's sm_90a code (cached per device 0..15).
bool DeviceRunsWgmma() {
  static std::atomic<int> cache[16];  // 0 unknown, 1 yes, 2 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 16) return false;
  int v = cache[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    cudaFuncAttributes attr{};
    const bool ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
        major == 9 && minor == 0 &&
        cudaFuncGetAttributes(&attr, WgmmaPrefillKernel) == cudaSuccess && attr.binaryVersion == 90;
    v = ok ? 1 : 2;
    cache[device].store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

}  // namespace

bool WgmmaPrefillSupports(int64_t head_dim, int64_t v_head_dim, float scale,
                          int64_t sliding_window) {
  return head_dim == kD && v_head_dim == kD && scale > 0.0f && std::isfinite(scale) &&
         sliding_window <= 0 && DeviceRunsWgmma();
}

int WgmmaPrefillOccupancy() {
  int n = 0;
  if (AllowSmem() != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, WgmmaPrefillKernel, kThreads, kSmemBytes) !=
          cudaSuccess) {
    return 1;
  }
  return n > 1 ? n : 1;
}

absl::Status LaunchWgmmaPrefill(const Fa2Args& args, dim3 grid, cudaStream_t stream, bool pdl) {
  if (!WgmmaPrefillSupports(args.head_dim, args.v_head_dim, args.scale_log2, args.sliding_window)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: the wgmma prefill kernel does not serve head_dim ",
                     args.head_dim, ", v_head_dim ", args.v_head_dim, ", sliding_window ",
                     args.sliding_window, " on this device"));
  }
  SLUICE_CUDA_RETURN_IF_ERROR(AllowSmem(),
                              "PagedAttentionCuda (wgmma prefill): cudaFuncSetAttribute");
  SLUICE_CUDA_RETURN_IF_ERROR(
      attention_detail::LaunchKernelMaybePdl(WgmmaPrefillKernel, grid, dim3(kThreads), kSmemBytes,
                                             stream, pdl, args),
      "PagedAttentionCuda (wgmma prefill): launch");
  return CudaLaunchStatus("PagedAttentionCuda (wgmma prefill)");
}

}  // namespace sluice::kernels::paged_detail
