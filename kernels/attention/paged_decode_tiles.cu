// PagedTileKernel (paged_attention_launch.cuh): decode warp rings and prefill CTA tiles over a
// paged KV cache. A CTA serves one KV head of one sequence and a tile of its query rows (16 for
// decode, 64 for prefill), its kWarpsN warps splitting every key tile and merging through
// shared memory at the end; decode CTAs of 2 or 4 warps, chosen so the grid fills the SMs
// (paged_attention_plan.cu), stream their keys through per-warp cp.async rings (kRing: no CTA
// barrier until the merge). Design notes shared with the persistent decode warps:
// paged_decode_device.cuh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/paged_attention_launch.cuh"
#include "kernels/attention/paged_decode_device.cuh"

namespace sluice::kernels::paged_detail {
namespace {

// Configuration: kD/kDV padded head dims (multiples of 16), kWarpsM warps over query rows
// (16 rows each), kWarpsN warps over each key tile (kBN keys each), kStages K+V tiles resident
// in a cp.async ring (kStages − 1 copies in flight while one tile is being used).
template <int kD, int kDV, int kWarpsM, int kWarpsN, int kBN, int kStages>
struct AttnConfig {
  static_assert(kStages >= 2);
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kBM = 16 * kWarpsM;
  static constexpr int kTileN = kBN * kWarpsN;
  static constexpr int kTileElems = kTileN * (Pitch<kD>() + Pitch<kDV>());
  static constexpr int kLoopBytes = kStages * kTileElems * static_cast<int>(sizeof(bf16));
  static constexpr int kMergeBytes = kWarpsN > 1
                                         ? kThreads*(kDV / 2 + 4) * static_cast<int>(sizeof(float))
                                         : 0;
  static constexpr int kSmemBytes = kLoopBytes > kMergeBytes ? kLoopBytes : kMergeBytes;
};

// kRing (decode tiles, kWarpsM 1): every warp streams its own kBN-key slices of the key tiles
// through a private kStages-deep cp.async ring (its share of the same shared memory), synced
// with __syncwarp only, so no warp waits at a CTA barrier for another's copies or math until
// the final merge; one block-table lookup per lane and slice (prefetched a slice ahead) serves
// all 16-byte copies of that slice's keys. Without kRing the CTA copies each whole tile
// cooperatively and all warps meet at two barriers per tile.
template <int kD, int kDV, int kWarpsM, int kWarpsN, int kBN, int kStages, bool kRing>
__global__ void __launch_bounds__(32 * kWarpsM * kWarpsN)
    PagedTileKernel(const AttnArgs args) {
  using Cfg = AttnConfig<kD, kDV, kWarpsM, kWarpsN, kBN, kStages>;
  static_assert(!kRing || kWarpsM == 1, "warp rings serve decode tiles");
  constexpr int kKSteps = kD / 16;                                 // k16 steps of Q·Kᵀ
  constexpr int kVTiles = kDV / 8;                                 // n8 output tiles
  constexpr int kSliceElems = kBN * (Pitch<kD>() + Pitch<kDV>());  // one warp's slice (kRing)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const tile_smem = reinterpret_cast<bf16*>(smem_raw);

  // Before the dependency wait (PDL) only the step's metadata, block tables and keys below the
  // context length are read (PrefetchBeforeWait); q and the K/V just appended come after it.
  const int seq = blockIdx.z;
  const int kv_head = blockIdx.y;
  // Later query tiles see more keys under the causal mask: launch them first so the short
  // ones fill the tail of the grid.
  const int m_tile = args.num_m_tiles - 1 - static_cast<int>(blockIdx.x) / args.num_splits;
  const int split = blockIdx.x % args.num_splits;
  const int q_begin = args.query_start_loc[seq];
  const int q_len = args.query_start_loc[seq + 1] - q_begin;
  const int ctx = args.context_lens[seq];
  const int group = args.group;
  const int rows = q_len * group;
  const int row0 = m_tile * Cfg::kBM;
  if (row0 >= rows) return;  // uniform over the CTA
  const int row_last = min(row0 + Cfg::kBM, rows) - 1;

  // Keys this tile may see: causal end at the last row's position, window start at the
  // first row's; then this CTA's partition of them.
  const int pos_first = ctx + row0 / group;
  const int pos_last = ctx + row_last / group;
  int kv_begin = args.sliding_window > 0 ? max(0, pos_first - args.sliding_window + 1) : 0;
  int kv_end = pos_last + 1;
  if (args.num_splits > 1) {
    kv_begin = max(kv_begin, split * args.partition_tokens);
    kv_end = min(kv_end, (split + 1) * args.partition_tokens);
  }

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wm = warp % kWarpsM;
  const int wn = warp / kWarpsM;
  const int g = lane / 4;
  const int t = lane % 4;

  // This thread's two rows (g and g+8 of the warp's m16 tile).
  const RowInfo rw = MakeRows(row0 + wm * 16, rows, group, q_begin, ctx, kv_head, g);

  float acc[kVTiles][4];
#pragma unroll
  for (int u = 0; u < kVTiles; ++u) acc[u][0] = acc[u][1] = acc[u][2] = acc[u][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's partial; summed over the quad at the end

  const int32_t* block_table = args.block_tables + seq * args.max_blocks_per_seq;
  const int64_t k_token_stride = static_cast<int64_t>(args.num_kv_heads) * args.head_dim;
  const int64_t v_token_stride = static_cast<int64_t>(args.num_kv_heads) * args.v_head_dim;
  const bf16* k_base = args.k_cache + static_cast<int64_t>(kv_head) * args.head_dim;
  const bf16* v_base = args.v_cache + static_cast<int64_t>(kv_head) * args.v_head_dim;

  // Cooperative copy of the K and V tile starting at key `tile` into buffer `buf` (16-byte
  // chunks, zero-filled outside [kv_begin, kv_end) and past the true head dims).
  auto load_tile = [&](int tile, int buf) {
    bf16* k_dst = tile_smem + buf * Cfg::kTileElems;
    bf16* v_dst = k_dst + Cfg::kTileN * Pitch<kD>();
    constexpr int kKChunks = kD / 8, kVChunks = kDV / 8;
    constexpr int kChunks = kKChunks > kVChunks ? kKChunks : kVChunks;
    // Thread c copies chunk c % kChunks of key c / kChunks for K and for V, so a warp moves
    // whole contiguous rows and one block-table lookup serves both.
#pragma unroll 4
    for (int c = threadIdx.x; c < Cfg::kTileN * kChunks; c += Cfg::kThreads) {
      const int key = c / kChunks;
      const int col = (c % kChunks) * 8;
      const int j = tile + key;
      const bool in_range = j >= kv_begin && j < kv_end;
      int64_t slot = 0;
      if (in_range) {
        const int block = args.block_shift >= 0 ? j >> args.block_shift : j / args.block_size;
        const int offset = j - block * args.block_size;
        slot = static_cast<int64_t>(__ldg(block_table + block)) * args.block_size + offset;
      }
      if (col < kD) {
        const bool live = in_range && col < args.head_dim;
        CpAsync16(k_dst + key * Pitch<kD>() + col,
                  live ? k_base + slot * k_token_stride + col : k_base, live ? 16 : 0);
      }
      if (col < kDV) {
        const bool live = in_range && col < args.v_head_dim;
        CpAsync16(v_dst + key * Pitch<kDV>() + col,
                  live ? v_base + slot * v_token_stride + col : v_base, live ? 16 : 0);
      }
    }
    CpAsyncCommit();
  };

  // kRing: this warp's private ring; slices are copied by CopySlice with the LaneSlot of
  // their first key.
  bf16* const ring_smem = tile_smem + wn * kStages * kSliceElems;
  auto lookup = [&](int key0) {
    return LaneSlot<kBN>(args, block_table, key0, kv_begin, kv_end, lane);
  };
  // The slice of warp wn in the tile at `tile` holds keys some row may see.
  auto needed = [&](int tile) {
    const int key0 = tile + wn * kBN;
    return key0 < kv_end && key0 + kBN > kv_begin;
  };

  // Decode fusion: the (cos, sin) table lives after the kernel's own shared memory; the new
  // key's K/V reach the cache before the first copy below.
  float2* const rope_cs = reinterpret_cast<float2*>(smem_raw + Cfg::kSmemBytes);
  const bool fused = args.fusion.inv_freq != nullptr;

  // Tiles start at a multiple of kTileN so a window start inside a tile is just masked.
  // Ring: tile i lives in buffer i % kStages and is copy group i; every iteration commits one
  // group (empty past the last tile: an empty group completes at once), so "tile i landed" is
  // always "at most kStages − 1 newer groups pending". With kRing the same holds per warp
  // (each thread's groups hold only its own warp's copies).
  const int tile_first = kv_begin / Cfg::kTileN * Cfg::kTileN;
  int64_t next_slot = kRing ? lookup(tile_first + wn * kBN) : 0;  // for the next slice copy
  auto load = [&](int tile, int buf) {
    if constexpr (kRing) {
      if (needed(tile)) {
        CopySlice<kD, kDV, kBN>(args, ring_smem + buf * kSliceElems, next_slot, k_base, v_base,
                                lane);
      } else {
        CpAsyncCommit();
      }
      next_slot = lookup(tile + Cfg::kTileN + wn * kBN);
    } else {
      if (tile < kv_end) {
        load_tile(tile, buf);
      } else {
        CpAsyncCommit();
      }
    }
  };
  // Ring slices wholly below ctx were written by earlier steps: copied before the wait
  // (PrefetchBeforeWait). A decode fusion launch writes the new key first (below).
  int pre = 0;
  if constexpr (kRing) {
    if (!fused) {
      for (; pre < kStages - 1; ++pre) {
        const int tile = tile_first + pre * Cfg::kTileN;
        if (needed(tile) && tile + wn * kBN + kBN > ctx) break;
        load(tile, pre);
      }
    }
  }
  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();  // a PDL-launched combine may get ready meanwhile
  if (fused) {
    attention_detail::DecodeRopePrologue(
        args.fusion, args.q + static_cast<int64_t>(q_begin) * args.q_token_stride, q_begin,
        kv_head, args.num_kv_heads, args.head_dim, kv_begin <= ctx && ctx < kv_end, rope_cs);
  }
  for (; pre < kStages - 1; ++pre) load(tile_first + pre * Cfg::kTileN, pre);
  // Q fragments: read once per CTA, after the first K/V copies are issued so their latencies
  // overlap.
  uint32_t q_frag[kKSteps][4];
  LoadQFrag<kKSteps>(args, rw, t, fused, rope_cs, q_frag);

  int buf = 0;             // buffer of `tile`
  int fill = kStages - 1;  // buffer the next prefetch goes to (freed last round)
  for (int tile = tile_first; tile < kv_end; tile += Cfg::kTileN) {
    load(tile + (kStages - 1) * Cfg::kTileN, fill);
    CpAsyncWait<kStages - 1>();
    if constexpr (kRing) {
      __syncwarp();
    } else {
      __syncthreads();
    }
    // This warp's slice: rows r0.. of buffer `buf`.
    const bf16* k_smem = kRing ? ring_smem + buf * kSliceElems : tile_smem + buf * Cfg::kTileElems;
    const bf16* v_smem = k_smem + (kRing ? kBN : Cfg::kTileN) * Pitch<kD>();
    const int r0 = kRing ? 0 : wn * kBN;

    const int key0 = tile + wn * kBN;  // first key of this warp's slice
    // Skip slices no row of this warp can see (past the causal end / before the window).
    if (key0 < kv_end && key0 + kBN > kv_begin) {
      AttendSlice<kD, kDV, kBN>(args, k_smem, v_smem, r0, key0, kv_begin, kv_end, pos_first,
                                pos_last, rw, q_frag, acc, row_max, row_sum, lane);
    }
    // The prefetch after this overwrites the buffer just read.
    if constexpr (kRing) {
      __syncwarp();
    } else {
      __syncthreads();
    }
    buf = buf + 1 == kStages ? 0 : buf + 1;
    fill = fill + 1 == kStages ? 0 : fill + 1;
  }

  QuadSumRows(row_sum);

  if constexpr (kWarpsN > 1) {
    // Merge the kWarpsN key slices: every warp has the same fragment layout, so lane l of
    // warp (wm, wn) merges elementwise with lane l of warps (wm, *). Loop smem is free now.
    constexpr int kStride = kDV / 2 + 4;  // floats per lane: acc + (max, sum) × 2 rows
    float* merge = reinterpret_cast<float*>(smem_raw) + threadIdx.x * kStride;
    if constexpr (kRing) __syncthreads();  // other warps may still read their rings
    if (wn > 0) {
#pragma unroll
      for (int u = 0; u < kVTiles; ++u) {
#pragma unroll
        for (int e = 0; e < 4; ++e) merge[u * 4 + e] = acc[u][e];
      }
      merge[kDV / 2 + 0] = row_max[0];
      merge[kDV / 2 + 1] = row_max[1];
      merge[kDV / 2 + 2] = row_sum[0];
      merge[kDV / 2 + 3] = row_sum[1];
    }
    __syncthreads();
    if (wn > 0) return;
    for (int w = 1; w < kWarpsN; ++w) {
      const float* other = merge + w * kWarpsM * 32 * kStride;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float m_other = other[kDV / 2 + i];
        const float new_max = fmaxf(row_max[i], m_other);
        const float base = new_max == -INFINITY ? 0.0f : new_max;
        const float a_self = Exp2(row_max[i] - base);
        const float a_other = Exp2(m_other - base);
        row_sum[i] = row_sum[i] * a_self + other[kDV / 2 + 2 + i] * a_other;
        row_max[i] = new_max;
#pragma unroll
        for (int u = 0; u < kVTiles; ++u) {
          acc[u][2 * i] = acc[u][2 * i] * a_self + other[u * 4 + 2 * i] * a_other;
          acc[u][2 * i + 1] = acc[u][2 * i + 1] * a_self + other[u * 4 + 2 * i + 1] * a_other;
        }
      }
    }
  }

  StoreRows<kDV>(args, rw, split, acc, row_max, row_sum, t);
}

constexpr int kDecodeWarpsN = 4;  // warps of a 4-warp ring CTA
constexpr int kPrefillWarpsM = 4, kPrefillStages = 2;
static_assert(kDecodeWarpsN * kDecodeSliceKeys == kKeyTile && 16 * kPrefillWarpsM == kCtaTileRows);

// Deepest ring of 16-key slices for kWarps warps (≤ kWant stages) within the 227 KiB of shared
// memory a CTA may use on sm_90.
template <int kD, int kDV, int kWarps, int kWant>
constexpr int FitStages() {
  constexpr int kBytes = kWarps * kDecodeSliceKeys * (Pitch<kD>() + Pitch<kDV>()) * 2;
  constexpr int kFit = 227 * 1024 / kBytes;
  return kFit < kWant ? kFit : kWant;
}

struct TileLaunchOp {
  const AttnArgs* args;
  dim3 grid;
  cudaStream_t stream;
  bool pdl;
  template <int kD, int kDV, int kWarpsM, int kWarpsN, int kBN, int kStages, bool kRing>
  absl::Status Run() const {
    using Cfg = AttnConfig<kD, kDV, kWarpsM, kWarpsN, kBN, kStages>;
    // A fused decode launch also holds the RoPE table (decode_rope_fusion.cuh).
    const int fusion_bytes =
        args->fusion.inv_freq != nullptr ? attention_detail::DecodeRopeSmemBytes(kD) : 0;
    return LaunchWithSmem(&PagedTileKernel<kD, kDV, kWarpsM, kWarpsN, kBN, kStages, kRing>,
                          Cfg::kThreads, Cfg::kSmemBytes + fusion_bytes, *args, grid, stream, pdl);
  }
};

struct TileOccupancyOp {
  template <int kD, int kDV, int kWarpsM, int kWarpsN, int kBN, int kStages, bool kRing>
  int Run() const {
    using Cfg = AttnConfig<kD, kDV, kWarpsM, kWarpsN, kBN, kStages>;
    return Occupancy(&PagedTileKernel<kD, kDV, kWarpsM, kWarpsN, kBN, kStages, kRing>,
                     Cfg::kThreads, Cfg::kSmemBytes);
  }
};

template <int kD, int kDV, int kWarps, int kWant, typename Op>
auto WithRing(const Op& op) {
  constexpr int kStages = FitStages<kD, kDV, kWarps, kWant>();
  static_assert(kStages >= 2, "4 and 2 warps × 2 stages always fit");
  return op.template Run<kD, kDV, 1, kWarps, kDecodeSliceKeys, kStages, true>();
}

// Runs op.Run<config>() for the PagedTileKernel of `kind` at padded dims (kD, kDV).
template <typename Op>
struct KindOp {
  TileKind kind;
  const Op* op;
  template <int kD, int kDV>
  auto Run() const {
    switch (kind) {
      case TileKind::kRing4x3:
        return WithRing<kD, kDV, kDecodeWarpsN, 3>(*op);
      case TileKind::kRing2x3:
        return WithRing<kD, kDV, kDecodeWarpsN / 2, 3>(*op);
      case TileKind::kCtaTiles:
      default:
        return op->template Run<kD, kDV, kPrefillWarpsM, 1, kKeyTile, kPrefillStages, false>();
    }
  }
};

}  // namespace

absl::Status LaunchTileKernel(TileKind kind, PaddedDims dims, const AttnArgs& args, dim3 grid,
                              cudaStream_t stream, bool pdl) {
  const TileLaunchOp op{&args, grid, stream, pdl};
  return WithPaddedDims(dims, KindOp<TileLaunchOp>{kind, &op});
}

int TileKernelOccupancy(TileKind kind, PaddedDims dims) {
  const TileOccupancyOp op;
  return WithPaddedDims(dims, KindOp<TileOccupancyOp>{kind, &op});
}

}  // namespace sluice::kernels::paged_detail
