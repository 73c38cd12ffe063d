// PagedMmaPrefillKernel (PagedPrefillKernel::kMmaTiles; paged_attention_launch.cuh): paged
// prefill attention in 128-row mma.sync tiles, served at head dims ≤ 32 (the FA2 tiles serve
// 33..128). The same online-softmax algorithm and GQA row packing as
// PagedTileKernel, reshaped for long prompts, where the mma.sync pipe — not bytes — is what
// should bound the time:
//  * A warp owns kMT m16 tiles (32 rows at kMT 2), so every K/V fragment read from shared
//    memory feeds 2·kMT mmas: half the shared-memory bytes per mma of 16-row warps, and a
//    128-row CTA tile makes each K/V tile copied from L2 serve twice the rows of the 64-row
//    CTA tiles.
//  * Q lives in shared memory (copied once per CTA) and is re-read per key tile with ldmatrix:
//    a 32-row warp cannot keep its Q fragments (64 registers at d 128) beside a 128-register
//    accumulator and 64 scores. K fragments come from ldmatrix.x4 (two n8 tiles × k16 per
//    instruction) instead of two 32-bit loads per mma; V from ldmatrix.x4.trans as before.
//  * One barrier per key tile: a thread waits for tile i, the CTA syncs, and only then is the
//    buffer of tile i − 1 (which every warp has left) refilled with tile i + kStages − 1.
//  * Scores stay unscaled until the exponent: p = 2^(s·c − m·c) with c = scale·log2(e) is one
//    FFMA + MUFU per score (needs c > 0, checked by the planner); the running max m is kept in
//    raw score units.
//  * The accumulator rescale (kMT·kDV/2 FMULs per thread) is skipped when no row of the warp
//    raised its max (exact: the factor would be 1).
//  * Masking per element only on tiles some row of the warp sees partly (the causal diagonal,
//    window edges, partition edges); the rest take the unmasked path.
//  * Per-warp K/V copies: warp w copies keys [w·kBN/kWarps, (w+1)·kBN/kWarps) of each tile, one
//    block-table lookup per lane and tile (prefetched a tile ahead) shuffled to the lanes
//    copying that key's 16-byte chunks.
//  * The grid is linear over (query tile, KV head, split) with the longest query tiles (latest
//    under the causal mask) first for every head, so the short tiles fill the tail.
// Registers: at kD = kDV = 128, kMT 2, kBN 32 a thread holds 128 accumulator and 32 score
// floats; launch bounds of 2 CTAs × 128 threads leave it 255 registers (nvcc -Xptxas -v:
// 249 on sm_90a, no spills).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/paged_attention_launch.cuh"
#include "kernels/attention/paged_prefill_device.cuh"

namespace sluice::kernels::paged_detail {
namespace {

using attention_detail::CpAsync16;
using attention_detail::CpAsyncCommit;
using attention_detail::CpAsyncWait;
using attention_detail::Exp2;
using attention_detail::SmemAddr;

template <int kD, int kDV, int kWarps, int kMT, int kBN, int kStages>
struct PrefillConfig {
  static_assert(kStages >= 2);
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBM = 16 * kMT * kWarps;
  static constexpr int kQElems = kBM * Pitch<kD>();
  static constexpr int kTileElems = kBN * (Pitch<kD>() + Pitch<kDV>());
  static constexpr int kSmemBytes =
      (kQElems + kStages * kTileElems) * static_cast<int>(sizeof(bf16));
};

template <int kD, int kDV, int kWarps, int kMT, int kBN, int kStages>
__global__ void __launch_bounds__(32 * kWarps, 2) PagedMmaPrefillKernel(const AttnArgs args) {
  using Cfg = PrefillConfig<kD, kDV, kWarps, kMT, kBN, kStages>;
  constexpr int kKSteps = kD / 16;   // k16 steps of Q·Kᵀ
  constexpr int kSTiles = kBN / 8;   // n8 score tiles per m16 tile
  constexpr int kVTiles = kDV / 8;   // n8 output tiles
  constexpr int kPSteps = kBN / 16;  // k16 steps of P·V
  constexpr int kKChunks = kD / 8, kVChunks = kDV / 8;  // 16-byte chunks per K / V row
  constexpr int kWarpKeys = kBN / kWarps;                // keys each warp copies per tile
  static_assert(kSTiles % 2 == 0 && kVTiles % 2 == 0 && kWarpKeys <= 32);
  static_assert((kWarpKeys * kKChunks) % 32 == 0 && (kWarpKeys * kVChunks) % 32 == 0);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const q_smem = reinterpret_cast<bf16*>(smem_raw);
  bf16* const kv_smem = q_smem + Cfg::kQElems;

  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();
  PrefillTile cta;
  if (!PrefillTileOf<Cfg::kBM>(args, &cta)) return;  // uniform over the CTA
  const int seq = cta.seq, split = cta.split, kv_head = cta.kv_head, q_begin = cta.q_begin;
  const int ctx = cta.ctx, group = cta.group, rows = cta.rows, row0 = cta.row0;
  const int kv_begin = cta.kv_begin, kv_end = cta.kv_end;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wrow0 = row0 + warp * 16 * kMT;  // this warp's first row
  // Positions of this warp's first and last valid row (the unmasked-tile test).
  const int w_pos_first = ctx + wrow0 / group;
  const int w_pos_last = ctx + max(wrow0, min(wrow0 + 16 * kMT, rows) - 1) / group;

  CopyPrefillQ<Cfg::kBM, kD, Cfg::kThreads>(args, cta, q_smem);
  CpAsyncCommit();  // the oldest group: waiting for K/V tile 0 waits for Q too

  // Slot of key tile + warp·kWarpKeys + lane (lane < kWarpKeys; −1 outside [kv_begin, kv_end)).
  auto lookup = [&](int tile) -> int64_t {
    const int j = tile + warp * kWarpKeys + lane;
    if (lane >= kWarpKeys || j < kv_begin || j >= kv_end) return -1;
    const int block = args.block_shift >= 0 ? j >> args.block_shift : j / args.block_size;
    const int offset = j - block * args.block_size;
    return static_cast<int64_t>(__ldg(args.block_tables + seq * args.max_blocks_per_seq + block)) *
               args.block_size +
           offset;
  };
  // The warp's keys of a tile into buffer `buf` (zero rows for slot −1, zero columns past the
  // true head dims), as one commit group.
  // Bases and strides are recomputed from the kernel parameters here (cheap, once per tile)
  // rather than held in registers across the math.
  auto copy_keys = [&](int buf, int64_t lane_slot) {
    const int64_t k_token_stride = static_cast<int64_t>(args.num_kv_heads) * args.head_dim;
    const int64_t v_token_stride = static_cast<int64_t>(args.num_kv_heads) * args.v_head_dim;
    const bf16* k_base = args.k_cache + static_cast<int64_t>(kv_head) * args.head_dim;
    const bf16* v_base = args.v_cache + static_cast<int64_t>(kv_head) * args.v_head_dim;
    bf16* k_dst = kv_smem + buf * Cfg::kTileElems + warp * kWarpKeys * Pitch<kD>();
    bf16* v_dst = kv_smem + buf * Cfg::kTileElems + kBN * Pitch<kD>() + warp * kWarpKeys * Pitch<kDV>();
#pragma unroll
    for (int i = 0; i < kWarpKeys * kKChunks / 32; ++i) {
      const int c = lane + 32 * i;
      const int key = c / kKChunks;
      const int col = (c % kKChunks) * 8;
      const int64_t slot = __shfl_sync(0xffffffffu, lane_slot, key);
      const bool live = slot >= 0 && col < args.head_dim;
      CpAsync16(k_dst + key * Pitch<kD>() + col,
                live ? k_base + slot * k_token_stride + col : k_base, live ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kWarpKeys * kVChunks / 32; ++i) {
      const int c = lane + 32 * i;
      const int key = c / kVChunks;
      const int col = (c % kVChunks) * 8;
      const int64_t slot = __shfl_sync(0xffffffffu, lane_slot, key);
      const bool live = slot >= 0 && col < args.v_head_dim;
      CpAsync16(v_dst + key * Pitch<kDV>() + col,
                live ? v_base + slot * v_token_stride + col : v_base, live ? 16 : 0);
    }
    CpAsyncCommit();
  };
  // Tiles start at multiples of kBN; tile i (from tile_first) lives in buffer i % kStages and
  // is commit group i + 1 (Q is group 0). Every call commits one group (empty past kv_end).
  const int tile_first = kv_begin / kBN * kBN;
  int64_t next_slot = lookup(tile_first);
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

  float acc[kMT][kVTiles][4];
  float row_max[kMT][2];  // raw (unscaled) score units
  float row_sum[kMT][2];  // this thread's partial; summed over the quad at the end
  PrefillInitRows(acc, row_max, row_sum);
  const float c_log2 = args.scale_log2;  // > 0 (the planner checks)

  // ldmatrix lane addresses: Q A fragments (rows lane%16, columns 8·(lane/16)); K B fragments
  // of two n8 tiles (keys lane%8 + 8·(lane/16), columns 8·(lane/8 % 2)); V as in the CTA tiles.
  // Byte addresses in the shared window.
  constexpr int kB = static_cast<int>(sizeof(bf16));
  const uint32_t q_lane =
      SmemAddr(q_smem + (warp * 16 * kMT + (lane & 15)) * Pitch<kD>() + (lane >> 4) * 8);
  const uint32_t k_lane =
      SmemAddr(kv_smem + ((lane & 7) + ((lane >> 4) << 3)) * Pitch<kD>() + ((lane >> 3) & 1) * 8);
  const uint32_t v_lane =
      SmemAddr(kv_smem + kBN * Pitch<kD>() + (lane & 15) * Pitch<kDV>() + (lane >> 4) * 8);

  int buf = 0;  // buffer of `tile`
  for (int tile = tile_first; tile < kv_end; tile += kBN) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    // Every warp is past tile − kBN: its buffer takes the tile kStages − 1 ahead.
    load(tile + (kStages - 1) * kBN, buf == 0 ? kStages - 1 : buf - 1);
    const uint32_t tile_off = static_cast<uint32_t>(buf * Cfg::kTileElems * kB);
    buf = buf + 1 == kStages ? 0 : buf + 1;
    // Skip tiles no row of this warp sees (the causal end of the warp's rows is before the
    // CTA's; the window start after it).
    if (tile > w_pos_last ||
        (args.sliding_window > 0 && tile + kBN <= w_pos_first - args.sliding_window + 1)) {
      continue;
    }

    float s[kMT][kSTiles][4];
    PrefillQk<kMT, kSTiles, kKSteps, Pitch<kD>()>(s, q_lane, k_lane, tile_off);
    // Mask only where some row of the warp sees part of the tile.
    const bool full = tile >= kv_begin && tile + kBN <= kv_end && tile + kBN - 1 <= w_pos_first &&
                      (args.sliding_window <= 0 || tile > w_pos_last - args.sliding_window);
    if (!full) {
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
        for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            // This thread's rows are g and g + 8 of each m16 tile; padding rows see nothing.
            const int r = wrow0 + mi * 16 + g + 8 * (e >> 1);
            const int pos = r < rows ? ctx + r / group : -1;
            const int j = tile + n * 8 + 2 * t + (e & 1);
            const bool visible = j >= kv_begin && j < kv_end && j <= pos &&
                                 (args.sliding_window <= 0 || j > pos - args.sliding_window);
            if (!visible) s[mi][n][e] = -INFINITY;
          }
        }
      }
    }
    // Online softmax per m16 tile (PrefillSoftmaxStep), one at a time so its scores die into P
    // fragments before the next tile's rescale (register peak).
    uint32_t p_frag[kMT][kPSteps][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
      PrefillSoftmaxStep<kSTiles, kVTiles>(s[mi], c_log2, row_max[mi], row_sum[mi], acc[mi],
                                           p_frag[mi]);
    }
    PrefillPv<kMT, kPSteps, kVTiles, Pitch<kDV>()>(acc, p_frag, v_lane, tile_off);
  }
  // An empty partition never waited for its Q copy; no copy may outlive the CTA.
  CpAsyncWait<0>();

  StorePrefillRows<kMT, kVTiles>(args, acc, row_max, row_sum, c_log2, wrow0, rows,
                                               q_begin, kv_head, split, g, t);
}

constexpr int kMmaWarps = 4, kMmaTilesPerWarp = 2, kMmaKeys = 32, kMmaStages = 3;
static_assert(16 * kMmaTilesPerWarp * kMmaWarps == kMmaTileRows);

struct MmaLaunchOp {
  const AttnArgs* args;
  dim3 grid;
  cudaStream_t stream;
  bool pdl;
  template <int kD, int kDV>
  absl::Status Run() const {
    if constexpr (kD <= 128 && kDV <= 128) {
      using Cfg = PrefillConfig<kD, kDV, kMmaWarps, kMmaTilesPerWarp, kMmaKeys, kMmaStages>;
      return LaunchWithSmem(
          &PagedMmaPrefillKernel<kD, kDV, kMmaWarps, kMmaTilesPerWarp, kMmaKeys, kMmaStages>,
          Cfg::kThreads, Cfg::kSmemBytes, *args, grid, stream, pdl);
    } else {
      return absl::InvalidArgumentError(
          "PagedAttentionCuda: the MMA-tile prefill kernel serves head dims up to 128");
    }
  }
};

struct MmaOccupancyOp {
  template <int kD, int kDV>
  int Run() const {
    if constexpr (kD <= 128 && kDV <= 128) {
      using Cfg = PrefillConfig<kD, kDV, kMmaWarps, kMmaTilesPerWarp, kMmaKeys, kMmaStages>;
      return Occupancy(
          &PagedMmaPrefillKernel<kD, kDV, kMmaWarps, kMmaTilesPerWarp, kMmaKeys, kMmaStages>,
          Cfg::kThreads, Cfg::kSmemBytes);
    } else {
      return 1;
    }
  }
};

}  // namespace

absl::Status LaunchMmaPrefill(PaddedDims dims, const AttnArgs& args, dim3 grid,
                              cudaStream_t stream, bool pdl) {
  return WithPaddedDims(dims, MmaLaunchOp{&args, grid, stream, pdl});
}

int MmaPrefillOccupancy(PaddedDims dims) { return WithPaddedDims(dims, MmaOccupancyOp{}); }

}  // namespace sluice::kernels::paged_detail
