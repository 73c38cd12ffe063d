// Paged prefill attention, FlashAttention-2 tile shapes (SetPagedAttentionPrefillKernel 3..7;
// paged_prefill_device.cuh lists the configurations).
//
// Same algorithm, GQA row packing (row = token · group + head-in-group), paging, split-KV
// partials and causal/window masking as PagedPrefillKernel in paged_attention.cu (its design
// notes apply); what differs is the tile shape, chosen after Dao, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning" (2023), §3.3 and its released
// head-dim-128 forward configuration (128 query rows × 64 keys per CTA, 4 warps):
//  * 64-key tiles (kernel 1 uses 32): half the CTA barriers, row-max shuffles, rescale tests
//    and block-table lookups per key, and each warp's Q fragments (config 0) are re-read from
//    shared memory once per 64 keys instead of per 32. Shared-memory bytes read per 128×64
//    block of scores: K + V + Q = 4 warps × (16 + 16 + 8) KiB = 160 KiB, against 192 KiB for
//    kernel 1; the mma count is the same.
//  * Config 1 keeps each warp's 16 query rows' Q fragments in registers for the whole key loop
//    (32 registers at d 128), so the inner loop reads only K and V from shared memory; with 16
//    rows a warp every K/V fragment feeds one mma (8 warps × 32 KiB = 256 KiB per 128×64
//    block), traded against no Q traffic and lighter register pressure. Both are here so one
//    device run can A/B them.
//  * Register budget (config 0, d 128): 128 accumulator + 64 score floats + 8 Q + 4 K fragment
//    registers at the Q·Kᵀ peak; the softmax turns one m16 tile's scores into bf16 P fragments
//    (16 registers) before the other's, so P·V holds 128 + 32. nvcc 13 -Xptxas -v, sm_90a:
//    config 0 uses 255 registers with 64 bytes of spill stores (68 of loads) at d 128 and 224
//    without spills at d 64; config 1 uses 204 (d 128) / 151 (d 64), config 2 205 / 157, no
//    spills.
//  * H200, Llama-3-8B prefill 16k, 32 layers (cuda_decode_bench, device call of 2026-11-29):
//    attention 253.8 ms with config 0 (kernel 3; 277 TFLOP/s), 311.5 / 312.8 ms with configs
//    1 / 2 (kernels 4 / 5), against 276.7 ms for kernel 1. Configs 1 and 2 do run (the bench's
//    totals coincided, 640.16 / 640.15 ms, but their attention rows differ); they lose to
//    shared-memory bandwidth: 256 KiB of ldmatrix traffic per 128×64 block against 160 KiB,
//    which at 128 bytes per clock and SM is about as long as the block's mma.sync work
//    (1024 m16n8k16), so more warps cannot hide it. A third stage (config 2) does not help.
//  * Config 3 (kernel 6) is config 0 with a lighter K/V copy: when a warp's 16 keys of a tile
//    are consecutive slots of one cache block (block sizes that are multiples of 16: the
//    serving default, all tiles off the causal diagonal and partition edges) each lane copies
//    its column of keys from one base address with a fixed 32-bit byte step, instead of a
//    shuffle, a 64-bit multiply and a select per 16-byte chunk; 32-bit slots and shared
//    addresses elsewhere. ~100 instead of ~190 issued instructions per warp and tile for the
//    copy (SASS, cuobjdump), out of ~1,200 (256 HMMA, 80 LDSM). ptxas (d 128): 255 registers,
//    72 / 76 bytes of spill stores / loads (config 0: 64 / 68); the spills are the 4 row sums
//    and a few loop bounds, ~10 local accesses per warp and tile, not in the mma chains.
//  * Config 4 (kernel 7) is config 3 with the next tile's copies issued after Q·Kᵀ (as
//    FlashAttention-2 does): the first ldmatrix/mma follow the barrier at once and the copy's
//    address registers are no longer live beside the accumulators at the loop top; ptxas
//    (d 128): 255 registers, no spills. The copies then have the softmax and P·V (~60% of a
//    tile) rather than a whole tile to land; A/B on the device decides.
// Shared memory keeps the padded pitch of kernel 1 (16 bytes a row: conflict-free ldmatrix and
// cp.async, and the address math is an add, where an XOR swizzle needs an extra LOP3 per
// ldmatrix); it fits: config 0 uses 34 KiB of Q + 2 × 34 KiB of K/V = 102 KiB, 2 CTAs per SM.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/attention/paged_prefill_device.cuh"
#include "kernels/cuda/cuda_common.h"

namespace sluice::kernels::paged_detail {
namespace {

using attention_detail::CpAsync16;
using attention_detail::CpAsyncCommit;
using attention_detail::CpAsyncWait;
using attention_detail::Exp2;
using attention_detail::SmemAddr;

// 16-byte global→shared copy to a 32-bit shared-window address; src_bytes 0 writes zeros.
static __device__ __forceinline__ void CpAsync16At(uint32_t smem_addr, const void* gmem,
                                                   int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(src_bytes));
}

// kD: padded head dim of K and V (64 or 128); kWarps warps of kMT m16 tiles each; kBN keys per
// tile; kStages K/V tiles resident; kQRegs: Q fragments in registers (kMT 1 only); kMinCtas:
// launch-bound occupancy target (sets the register cap).
template <int kD, int kWarps, int kMT, int kBN, int kStages, bool kQRegs, int kMinCtas,
          int kCopy>
struct Fa2Config {
  static_assert(kStages >= 2 && (!kQRegs || kMT == 1));
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBM = 16 * kMT * kWarps;
  static constexpr int kQElems = kBM * Pitch<kD>();
  static constexpr int kTileElems = 2 * kBN * Pitch<kD>();  // K rows then V rows
  static constexpr int kSmemBytes =
      (kQElems + kStages * kTileElems) * static_cast<int>(sizeof(bf16));
};

template <int kD, int kWarps, int kMT, int kBN, int kStages, bool kQRegs, int kMinCtas,
          int kCopy>
__global__ void __launch_bounds__(32 * kWarps, kMinCtas) Fa2PrefillKernel(const Fa2Args args) {
  using Cfg = Fa2Config<kD, kWarps, kMT, kBN, kStages, kQRegs, kMinCtas, kCopy>;
  constexpr bool kLean = kCopy >= 1;  // the lighter copy path (config 3)
  constexpr bool kLate = kCopy == 2;  // ... issued after Q·Kᵀ (config 4)
  constexpr int kKSteps = kD / 16;   // k16 steps of Q·Kᵀ
  constexpr int kSTiles = kBN / 8;   // n8 score tiles per m16 tile
  constexpr int kVTiles = kD / 8;    // n8 output tiles
  constexpr int kPSteps = kBN / 16;  // k16 steps of P·V
  constexpr int kChunks = kD / 8;    // 16-byte chunks per K / V / Q row
  constexpr int kWarpKeys = kBN / kWarps;  // keys each warp copies per tile
  constexpr int kP = Pitch<kD>();
  static_assert(kSTiles % 2 == 0 && kVTiles % 2 == 0 && kWarpKeys <= 32);
  static_assert((kWarpKeys * kChunks) % 32 == 0);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const q_smem = reinterpret_cast<bf16*>(smem_raw);
  bf16* const kv_smem = q_smem + Cfg::kQElems;

  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();
  const int seq = blockIdx.z;
  int linear = static_cast<int>(blockIdx.x);
  const int split = linear % args.num_splits;
  linear /= args.num_splits;
  const int kv_head = linear % args.num_kv_heads;
  const int m_tile = args.num_m_tiles - 1 - linear / args.num_kv_heads;
  const int q_begin = args.query_start_loc[seq];
  const int q_len = args.query_start_loc[seq + 1] - q_begin;
  const int ctx = args.context_lens[seq];
  const int group = args.group;
  const int rows = q_len * group;
  const int row0 = m_tile * Cfg::kBM;
  if (row0 >= rows) return;  // uniform over the CTA
  const int row_last = min(row0 + Cfg::kBM, rows) - 1;
  int kv_begin =
      args.sliding_window > 0 ? max(0, ctx + row0 / group - args.sliding_window + 1) : 0;
  int kv_end = ctx + row_last / group + 1;
  if (args.num_splits > 1) {
    kv_begin = max(kv_begin, split * args.partition_tokens);
    kv_end = min(kv_end, (split + 1) * args.partition_tokens);
  }

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wrow0 = row0 + warp * 16 * kMT;  // this warp's first row
  // Positions of this warp's first and last valid row (the unmasked-tile and skip tests).
  const int w_pos_first = ctx + wrow0 / group;
  const int w_pos_last = ctx + max(wrow0, min(wrow0 + 16 * kMT, rows) - 1) / group;

  // Q tile → shared memory, zero-filled past the true head dim and the last row (16-byte
  // cp.async when args.q_vec, else 32-bit loads).
  for (int c = threadIdx.x; c < Cfg::kBM * kChunks; c += Cfg::kThreads) {
    const int r = c / kChunks;
    const int col = (c % kChunks) * 8;
    const int row = row0 + r;
    const bool live = row < rows && col < args.head_dim;
    const bf16* src = args.q;
    if (live) {
      src += static_cast<int64_t>(q_begin + row / group) * args.q_token_stride +
             static_cast<int64_t>(kv_head * group + row % group) * args.head_dim + col;
    }
    bf16* dst = q_smem + r * kP + col;
    if (args.q_vec) {
      CpAsync16(dst, src, live ? 16 : 0);
    } else {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        reinterpret_cast<uint32_t*>(dst)[w] =
            live ? __ldg(reinterpret_cast<const unsigned int*>(src) + w) : 0u;
      }
    }
  }
  CpAsyncCommit();  // group 0; K/V tile i (from tile_first) is group i + 1

  // Cache slot of key tile + warp·kWarpKeys + lane (lane < kWarpKeys; −1 outside
  // [kv_begin, kv_end): those rows are zero-filled). kLean: 32-bit slots (a cache of < 2^31
  // token slots: at ≥ 512 bytes of K per token and layer that is ≥ 1 TiB) and strides, the
  // 64-bit offset formed by one widening multiply per copy; one register each instead of two.
  using Slot = std::conditional_t<kLean, int, int64_t>;
  // A warp's kWarpKeys keys of a tile (which start at a multiple of kWarpKeys) share a block.
  const bool block_multiple = args.block_size % kWarpKeys == 0;
  auto lookup = [&](int tile) -> Slot {
    const int j = tile + warp * kWarpKeys + lane;
    if (lane >= kWarpKeys || j < kv_begin || j >= kv_end) return -1;
    const int block = args.block_shift >= 0 ? j >> args.block_shift : j / args.block_size;
    const int offset = j - block * args.block_size;
    return static_cast<Slot>(__ldg(args.block_tables + seq * args.max_blocks_per_seq + block)) *
               args.block_size +
           offset;
  };
  // The warp's kWarpKeys keys of a tile (K and V rows, zero columns past the true head dims)
  // into buffer `buf`, as one commit group.
  auto copy_keys = [&](int buf, Slot lane_slot) {
    const Slot k_stride = static_cast<Slot>(args.num_kv_heads) * args.head_dim;
    const Slot v_stride = static_cast<Slot>(args.num_kv_heads) * args.v_head_dim;
    const bf16* k_base = args.k_cache + static_cast<int64_t>(kv_head) * args.head_dim;
    const bf16* v_base = args.v_cache + static_cast<int64_t>(kv_head) * args.v_head_dim;
    bf16* k_dst = kv_smem + buf * Cfg::kTileElems + warp * kWarpKeys * kP;
    bf16* v_dst = k_dst + kBN * kP;
    // kLean: 32-bit shared-window destinations (a generic pointer holds two registers).
    const uint32_t k_dst_at = SmemAddr(k_dst);
    if constexpr (kLean) {
      // Fast path: the warp's kWarpKeys keys are consecutive slots of one cache block (block
      // sizes that are multiples of kWarpKeys: the keys start at a multiple of kWarpKeys) and
      // all inside [kv_begin, kv_end) (then the first and last are). Each lane then copies the
      // same column of keys lane/kChunks + i·(32/kChunks): one base address and a fixed step,
      // instead of a shuffle and a 64-bit multiply per 16-byte chunk.
      static_assert(32 % kChunks == 0);
      constexpr int kKeysPerPass = 32 / kChunks;
      const Slot first = __shfl_sync(0xffffffffu, lane_slot, 0);
      const Slot last = __shfl_sync(0xffffffffu, lane_slot, kWarpKeys - 1);
      if (block_multiple && first >= 0 && last >= 0) {
        const int key0 = lane / kChunks;
        const int col = (lane % kChunks) * 8;
        const bool k_live = col < args.head_dim;
        const bool v_live = col < args.v_head_dim;
        // Byte steps in 32 bits (kWarpKeys keys of K or V: < 2^31 bytes); dead columns stay at
        // the base with a zero step.
        const char* k_src = reinterpret_cast<const char*>(
            k_live ? k_base + static_cast<int64_t>(first + key0) * k_stride + col : k_base);
        const char* v_src = reinterpret_cast<const char*>(
            v_live ? v_base + static_cast<int64_t>(first + key0) * v_stride + col : v_base);
        const int k_step = k_live ? kKeysPerPass * k_stride * static_cast<int>(sizeof(bf16)) : 0;
        const int v_step = v_live ? kKeysPerPass * v_stride * static_cast<int>(sizeof(bf16)) : 0;
        const uint32_t at = k_dst_at + (key0 * kP + col) * static_cast<int>(sizeof(bf16));
#pragma unroll
        for (int i = 0; i < kWarpKeys / kKeysPerPass; ++i) {
          const uint32_t at_i = at + i * kKeysPerPass * kP * static_cast<int>(sizeof(bf16));
          CpAsync16At(at_i, k_src + i * k_step, k_live ? 16 : 0);
          CpAsync16At(at_i + kBN * kP * static_cast<int>(sizeof(bf16)), v_src + i * v_step,
                      v_live ? 16 : 0);
        }
        CpAsyncCommit();
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < kWarpKeys * kChunks / 32; ++i) {
      const int c = lane + 32 * i;
      const int key = c / kChunks;
      const int col = (c % kChunks) * 8;
      const Slot slot = __shfl_sync(0xffffffffu, lane_slot, key);
      const bool k_live = slot >= 0 && col < args.head_dim;
      const bool v_live = slot >= 0 && col < args.v_head_dim;
      if constexpr (kLean) {
        const uint32_t at = k_dst_at + (key * kP + col) * static_cast<int>(sizeof(bf16));
        CpAsync16At(at, k_live ? k_base + static_cast<int64_t>(slot) * k_stride + col : k_base,
                    k_live ? 16 : 0);
        CpAsync16At(at + kBN * kP * static_cast<int>(sizeof(bf16)),
                    v_live ? v_base + static_cast<int64_t>(slot) * v_stride + col : v_base,
                    v_live ? 16 : 0);
      } else {
        CpAsync16(k_dst + key * kP + col, k_live ? k_base + slot * k_stride + col : k_base,
                  k_live ? 16 : 0);
        CpAsync16(v_dst + key * kP + col, v_live ? v_base + slot * v_stride + col : v_base,
                  v_live ? 16 : 0);
      }
    }
    CpAsyncCommit();
  };
  const int tile_first = kv_begin / kBN * kBN;
  Slot next_slot = lookup(tile_first);
  // Every call commits one group (empty past kv_end), so group i + 1 is always tile i.
  auto load = [&](int tile, int buf) {
    if (tile < kv_end) {
      copy_keys(buf, next_slot);
    } else {
      CpAsyncCommit();
    }
    next_slot = lookup(tile + kBN);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) load(tile_first + s * kBN, s);

  constexpr int kB = static_cast<int>(sizeof(bf16));
  // ldmatrix lane addresses (shared-window bytes): Q A fragments (rows lane%16, columns
  // 8·(lane/16)); K B fragments of two n8 tiles (keys lane%8 + 8·(lane/16), columns
  // 8·(lane/8 % 2)); V transposed B fragments (keys lane%16, columns 8·(lane/16)).
  const uint32_t q_lane = SmemAddr(q_smem + (warp * 16 * kMT + (lane & 15)) * kP + (lane >> 4) * 8);
  const uint32_t k_lane =
      SmemAddr(kv_smem + ((lane & 7) + ((lane >> 4) << 3)) * kP + ((lane >> 3) & 1) * 8);
  const uint32_t v_lane = SmemAddr(kv_smem + (kBN + (lane & 15)) * kP + (lane >> 4) * 8);

  // Config 1: the warp's Q fragments, read once (Q is group 0: the kStages − 1 tile groups
  // committed after it may stay in flight; the barrier makes every thread's Q copies visible).
  uint32_t q_reg[kQRegs ? kKSteps : 1][4];
  if constexpr (kQRegs) {
    CpAsyncWait<kStages - 1>();
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) LdMatrixX4At(q_reg[ks], q_lane + ks * 16 * kB);
  }

  float acc[kMT][kVTiles][4];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
    for (int u = 0; u < kVTiles; ++u) {
      acc[mi][u][0] = acc[mi][u][1] = acc[mi][u][2] = acc[mi][u][3] = 0.0f;
    }
  }
  float row_max[kMT][2];  // raw (unscaled) score units
  float row_sum[kMT][2];  // this thread's partial; summed over the quad at the end
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
    row_max[mi][0] = row_max[mi][1] = -INFINITY;
    row_sum[mi][0] = row_sum[mi][1] = 0.0f;
  }
  const float c_log2 = args.scale_log2;  // > 0 (the planner checks)

  int buf = 0;  // buffer of `tile`
  for (int tile = tile_first; tile < kv_end; tile += kBN) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    // Every warp is past tile − kBN: its buffer takes the tile kStages − 1 ahead. kLate: the
    // copies are issued after this tile's Q·Kᵀ (as FlashAttention-2 does), so its first
    // ldmatrix/mma follow the barrier at once; they land during the softmax and P·V. A warp
    // that skips the tile issues them here (one commit group per thread and tile either way).
    const int load_buf = buf == 0 ? kStages - 1 : buf - 1;
    const uint32_t tile_off = static_cast<uint32_t>(buf * Cfg::kTileElems * kB);
    buf = buf + 1 == kStages ? 0 : buf + 1;
    // Skip tiles no row of this warp sees.
    const bool skip =
        tile > w_pos_last ||
        (args.sliding_window > 0 && tile + kBN <= w_pos_first - args.sliding_window + 1);
    if (!kLate || skip) load(tile + (kStages - 1) * kBN, load_buf);
    if (skip) continue;

    float s[kMT][kSTiles][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
        s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.0f;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        if constexpr (kQRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[mi][e] = q_reg[ks][e];
        } else {
          LdMatrixX4At(qa[mi], q_lane + (mi * 16 * kP + ks * 16) * kB);
        }
      }
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t kb[4];
        LdMatrixX4At(kb, k_lane + tile_off + (np * 16 * kP + ks * 16) * kB);
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          Mma16816(s[mi][2 * np], qa[mi], kb[0], kb[1]);
          Mma16816(s[mi][2 * np + 1], qa[mi], kb[2], kb[3]);
        }
      }
    }
    if constexpr (kLate) load(tile + (kStages - 1) * kBN, load_buf);
    // Mask only where some row of the warp sees part of the tile (the causal diagonal, window
    // and partition edges).
    const bool full = tile >= kv_begin && tile + kBN <= kv_end && tile + kBN - 1 <= w_pos_first &&
                      (args.sliding_window <= 0 || tile > w_pos_last - args.sliding_window);
    if (!full) {
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          // This thread's rows are g and g + 8 of each m16 tile; padding rows see nothing.
          const int r = wrow0 + mi * 16 + g + 8 * e2;
          const int pos = r < rows ? ctx + r / group : -1;
          const int lo = max(kv_begin, args.sliding_window > 0 ? pos - args.sliding_window + 1 : 0);
          const int hi = min(kv_end - 1, pos);  // visible keys: lo ≤ j ≤ hi
#pragma unroll
          for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
            for (int e1 = 0; e1 < 2; ++e1) {
              const int j = tile + n * 8 + 2 * t + e1;
              if (j < lo || j > hi) s[mi][n][2 * e2 + e1] = -INFINITY;
            }
          }
        }
      }
    }
    // Online softmax per m16 tile; P = 2^(s·c − m·c) rounded to bf16 A fragments (the C
    // fragments of score tiles 2k and 2k+1 are exactly the A fragment of P's k-step k).
    uint32_t p_frag[kMT][kPSteps][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
      float neg_base[2], alpha[2];
      bool raised = false;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = row_max[mi][i];
#pragma unroll
        for (int n = 0; n < kSTiles; ++n) {
          mx = fmaxf(mx, fmaxf(s[mi][n][2 * i], s[mi][n][2 * i + 1]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with nothing visible yet keeps max −inf; exponentiate against 0 so that
        // 2^(−inf) is 0 rather than NaN.
        const float mb = mx == -INFINITY ? 0.0f : mx * c_log2;
        const bool up = mx != row_max[mi][i];
        alpha[i] = up ? Exp2(row_max[mi][i] * c_log2 - mb) : 1.0f;
        raised |= up;
        row_max[mi][i] = mx;
        row_sum[mi][i] *= alpha[i];
        neg_base[i] = -mb;
      }
      // Rescale only when some row of the warp raised its max (otherwise every alpha is 1).
      if (__any_sync(0xffffffffu, raised)) {
#pragma unroll
        for (int u = 0; u < kVTiles; ++u) {
          acc[mi][u][0] *= alpha[0];
          acc[mi][u][1] *= alpha[0];
          acc[mi][u][2] *= alpha[1];
          acc[mi][u][3] *= alpha[1];
        }
      }
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = Exp2(fmaf(s[mi][n][e], c_log2, neg_base[e >> 1]));
          row_sum[mi][e >> 1] += p[e];
        }
        p_frag[mi][n / 2][(n & 1) * 2 + 0] = PackBf16(p[0], p[1]);
        p_frag[mi][n / 2][(n & 1) * 2 + 1] = PackBf16(p[2], p[3]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const uint32_t vrow = v_lane + tile_off + kk * 16 * kP * kB;
#pragma unroll
      for (int u = 0; u < kVTiles; u += 2) {
        uint32_t b[4];
        LdMatrixX4TransAt(b, vrow + u * 8 * kB);
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          Mma16816(acc[mi][u], p_frag[mi][kk], b[0], b[1]);
          Mma16816(acc[mi][u + 1], p_frag[mi][kk], b[2], b[3]);
        }
      }
    }
  }
  // An empty partition never waited for its copies; no copy may outlive the CTA.
  CpAsyncWait<0>();

  StorePrefillRows<kMT, kVTiles>(args, acc, row_max, row_sum, c_log2, wrow0, rows, q_begin,
                                 kv_head, split, g, t);
}

// Runs op.Run<kernel, Cfg>() for `config` at padded dim kD.
template <int kD, int kWarps, int kMT, int kStages, bool kQRegs, int kMinCtas, int kCopy,
          typename Op>
auto RunFa2(const Op& op) {
  using K = Fa2Config<kD, kWarps, kMT, 64, kStages, kQRegs, kMinCtas, kCopy>;
  return op.template Run<K>(
      &Fa2PrefillKernel<kD, kWarps, kMT, 64, kStages, kQRegs, kMinCtas, kCopy>);
}
template <int kD, typename Op>
auto WithFa2Config(int config, const Op& op) {
  switch (config) {
    case 1:
      return RunFa2<kD, 8, 1, 2, true, 1, 0>(op);
    case 2:
      return RunFa2<kD, 8, 1, 3, true, 1, 0>(op);
    case 3:
      return RunFa2<kD, 4, 2, 2, false, 2, 1>(op);
    case 4:
      return RunFa2<kD, 4, 2, 2, false, 2, 2>(op);
    default:
      return RunFa2<kD, 4, 2, 2, false, 2, 0>(op);
  }
}

template <typename Op>
auto WithFa2(int config, int64_t head_dim, int64_t v_head_dim, const Op& op) {
  return (head_dim > 64 || v_head_dim > 64) ? WithFa2Config<128>(config, op)
                                            : WithFa2Config<64>(config, op);
}

// Above 48 KiB dynamic shared memory must be opted into (idempotent, host-only; allowed during
// stream capture).
cudaError_t AllowSmem(void (*kernel)(Fa2Args), int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

struct Fa2LaunchOp {
  const Fa2Args* args;
  dim3 grid;
  cudaStream_t stream;
  bool pdl;
  template <typename Cfg>
  absl::Status Run(void (*kernel)(Fa2Args)) const {
    SLUICE_CUDA_RETURN_IF_ERROR(AllowSmem(kernel, Cfg::kSmemBytes),
                                "PagedAttentionCuda (FA2 prefill): cudaFuncSetAttribute");
    SLUICE_CUDA_RETURN_IF_ERROR(
        attention_detail::LaunchKernelMaybePdl(kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes,
                                               stream, pdl, *args),
        "PagedAttentionCuda (FA2 prefill): launch");
    return CudaLaunchStatus("PagedAttentionCuda (FA2 prefill)");
  }
};

struct Fa2OccupancyOp {
  template <typename Cfg>
  int Run(void (*kernel)(Fa2Args)) const {
    int n = 0;
    if (AllowSmem(kernel, Cfg::kSmemBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Cfg::kThreads,
                                                      Cfg::kSmemBytes) != cudaSuccess) {
      return 1;
    }
    return n > 1 ? n : 1;
  }
};

}  // namespace

int Fa2Occupancy(int config, int64_t head_dim, int64_t v_head_dim) {
  return WithFa2(config, head_dim, v_head_dim, Fa2OccupancyOp{});
}

absl::Status LaunchFa2Prefill(int config, const Fa2Args& args, dim3 grid, cudaStream_t stream,
                              bool pdl) {
  if (config < 0 || config >= kNumFa2Configs || !Fa2Supports(args.head_dim, args.v_head_dim) ||
      !(args.scale_log2 > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: FA2 prefill config ", config, " does not serve head_dim ",
                     args.head_dim, ", v_head_dim ", args.v_head_dim));
  }
  return WithFa2(config, args.head_dim, args.v_head_dim, Fa2LaunchOp{&args, grid, stream, pdl});
}

}  // namespace sluice::kernels::paged_detail
