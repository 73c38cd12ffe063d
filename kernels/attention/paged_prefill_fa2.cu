// Paged prefill attention, FlashAttention-2 tile shapes (PagedPrefillKernel::kFa2;
// paged_prefill_device.cuh).
//
// Same algorithm, GQA row packing (row = token · group + head-in-group), paging, split-KV
// partials and causal/window masking as PagedMmaPrefillKernel in paged_prefill_mma.cu (its design
// notes apply); what differs is the tile shape, chosen after Dao, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning" (2023), §3.3 and its released
// head-dim-128 forward configuration (128 query rows × 64 keys per CTA, 4 warps of 2 m16
// tiles, 2 stages, Q re-read from shared memory per key tile):
//  * 64-key tiles (the MMA-tile kernel uses 32): half the CTA barriers, row-max shuffles,
//    rescale tests and block-table lookups per key, and each warp's Q fragments are re-read
//    from shared memory once per 64 keys instead of per 32. Shared-memory bytes read per
//    128×64 block of scores: K + V + Q = 4 warps × (16 + 16 + 8) KiB = 160 KiB, against
//    192 KiB for the MMA tiles; the mma count is the same.
//  * Register budget (d 128): 128 accumulator + 64 score floats + 8 Q + 4 K fragment
//    registers at the Q·Kᵀ peak; the softmax turns one m16 tile's scores into bf16 P fragments
//    (16 registers) before the other's, so P·V holds 128 + 32.
// Shared memory keeps the padded pitch of the MMA tiles (16 bytes a row: conflict-free
// ldmatrix and cp.async, and the address math is an add, where an XOR swizzle needs an extra
// LOP3 per ldmatrix); 34 KiB of Q + 2 × 34 KiB of K/V = 102 KiB at d 128, 2 CTAs per SM.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

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

// kD: padded head dim of K and V (64 or 128); kWarps warps of kMT m16 tiles each; kBN keys per
// tile; kStages K/V tiles resident. Launch bounds of 2 CTAs per SM cap the registers.
template <int kD, int kWarps, int kMT, int kBN, int kStages>
struct Fa2Config {
  static_assert(kStages >= 2);
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBM = 16 * kMT * kWarps;
  static constexpr int kQElems = kBM * Pitch<kD>();
  static constexpr int kTileElems = 2 * kBN * Pitch<kD>();  // K rows then V rows
  static constexpr int kSmemBytes =
      (kQElems + kStages * kTileElems) * static_cast<int>(sizeof(bf16));
};

template <int kD, int kWarps, int kMT, int kBN, int kStages>
__global__ void __launch_bounds__(32 * kWarps, 2) Fa2PrefillKernel(const Fa2Args args) {
  using Cfg = Fa2Config<kD, kWarps, kMT, kBN, kStages>;
  constexpr int kKSteps = kD / 16;   // k16 steps of Q·Kᵀ
  constexpr int kSTiles = kBN / 8;   // n8 score tiles per m16 tile
  constexpr int kVTiles = kD / 8;    // n8 output tiles
  constexpr int kPSteps = kBN / 16;  // k16 steps of P·V
  constexpr int kChunks = kD / 8;    // 16-byte chunks per K / V row
  constexpr int kWarpKeys = kBN / kWarps;  // keys each warp copies per tile
  constexpr int kP = Pitch<kD>();
  static_assert(kSTiles % 2 == 0 && kVTiles % 2 == 0 && kWarpKeys <= 32);
  static_assert((kWarpKeys * kChunks) % 32 == 0);
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
  // Positions of this warp's first and last valid row (the unmasked-tile and skip tests).
  const int w_pos_first = ctx + wrow0 / group;
  const int w_pos_last = ctx + max(wrow0, min(wrow0 + 16 * kMT, rows) - 1) / group;

  CopyPrefillQ<Cfg::kBM, kD, Cfg::kThreads>(args, cta, q_smem);
  CpAsyncCommit();  // group 0; K/V tile i (from tile_first) is group i + 1

  // Cache slot of key tile + warp·kWarpKeys + lane (lane < kWarpKeys; −1 outside
  // [kv_begin, kv_end): those rows are zero-filled).
  auto lookup = [&](int tile) -> int64_t {
    const int j = tile + warp * kWarpKeys + lane;
    if (lane >= kWarpKeys || j < kv_begin || j >= kv_end) return -1;
    const int block = args.block_shift >= 0 ? j >> args.block_shift : j / args.block_size;
    const int offset = j - block * args.block_size;
    return static_cast<int64_t>(__ldg(args.block_tables + seq * args.max_blocks_per_seq + block)) *
               args.block_size +
           offset;
  };
  // The warp's kWarpKeys keys of a tile (K and V rows, zero columns past the true head dims)
  // into buffer `buf`, as one commit group.
  auto copy_keys = [&](int buf, int64_t lane_slot) {
    const int64_t k_stride = static_cast<int64_t>(args.num_kv_heads) * args.head_dim;
    const int64_t v_stride = static_cast<int64_t>(args.num_kv_heads) * args.v_head_dim;
    const bf16* k_base = args.k_cache + static_cast<int64_t>(kv_head) * args.head_dim;
    const bf16* v_base = args.v_cache + static_cast<int64_t>(kv_head) * args.v_head_dim;
    bf16* k_dst = kv_smem + buf * Cfg::kTileElems + warp * kWarpKeys * kP;
    bf16* v_dst = k_dst + kBN * kP;
#pragma unroll
    for (int i = 0; i < kWarpKeys * kChunks / 32; ++i) {
      const int c = lane + 32 * i;
      const int key = c / kChunks;
      const int col = (c % kChunks) * 8;
      const int64_t slot = __shfl_sync(0xffffffffu, lane_slot, key);
      const bool k_live = slot >= 0 && col < args.head_dim;
      const bool v_live = slot >= 0 && col < args.v_head_dim;
      CpAsync16(k_dst + key * kP + col, k_live ? k_base + slot * k_stride + col : k_base,
                k_live ? 16 : 0);
      CpAsync16(v_dst + key * kP + col, v_live ? v_base + slot * v_stride + col : v_base,
                v_live ? 16 : 0);
    }
    CpAsyncCommit();
  };
  const int tile_first = kv_begin / kBN * kBN;
  int64_t next_slot = lookup(tile_first);
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

  float acc[kMT][kVTiles][4];
  float row_max[kMT][2];  // raw (unscaled) score units
  float row_sum[kMT][2];  // this thread's partial; summed over the quad at the end
  PrefillInitRows(acc, row_max, row_sum);
  const float c_log2 = args.scale_log2;  // > 0 (the planner checks)

  int buf = 0;  // buffer of `tile`
  for (int tile = tile_first; tile < kv_end; tile += kBN) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    // Every warp is past tile − kBN: its buffer takes the tile kStages − 1 ahead (one commit
    // group per thread and tile, also in warps that skip the tile).
    const int load_buf = buf == 0 ? kStages - 1 : buf - 1;
    const uint32_t tile_off = static_cast<uint32_t>(buf * Cfg::kTileElems * kB);
    buf = buf + 1 == kStages ? 0 : buf + 1;
    // Skip tiles no row of this warp sees.
    const bool skip =
        tile > w_pos_last ||
        (args.sliding_window > 0 && tile + kBN <= w_pos_first - args.sliding_window + 1);
    load(tile + (kStages - 1) * kBN, load_buf);
    if (skip) continue;

    float s[kMT][kSTiles][4];
    PrefillQk<kMT, kSTiles, kKSteps, kP>(s, q_lane, k_lane, tile_off);
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
    // Online softmax per m16 tile (PrefillSoftmaxStep), one at a time so its scores die into P
    // fragments before the next tile's rescale (register peak).
    uint32_t p_frag[kMT][kPSteps][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
      PrefillSoftmaxStep<kSTiles, kVTiles>(s[mi], c_log2, row_max[mi], row_sum[mi], acc[mi],
                                           p_frag[mi]);
    }
    PrefillPv<kMT, kPSteps, kVTiles, kP>(acc, p_frag, v_lane, tile_off);
  }
  // An empty partition never waited for its copies; no copy may outlive the CTA.
  CpAsyncWait<0>();

  StorePrefillRows<kMT, kVTiles>(args, acc, row_max, row_sum, c_log2, wrow0, rows, q_begin,
                                 kv_head, split, g, t);
}

// Runs op.Run<Cfg>(kernel) for the kernel at the padded dim of (head_dim, v_head_dim): 4 warps
// of 2 m16 tiles (128 rows), 64-key tiles, 2 stages.
template <typename Op>
auto WithFa2(int64_t head_dim, int64_t v_head_dim, const Op& op) {
  if (head_dim > 64 || v_head_dim > 64) {
    return op.template Run<Fa2Config<128, 4, 2, 64, 2>>(&Fa2PrefillKernel<128, 4, 2, 64, 2>);
  }
  return op.template Run<Fa2Config<64, 4, 2, 64, 2>>(&Fa2PrefillKernel<64, 4, 2, 64, 2>);
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

int Fa2Occupancy(int64_t head_dim, int64_t v_head_dim) {
  return WithFa2(head_dim, v_head_dim, Fa2OccupancyOp{});
}

absl::Status LaunchFa2Prefill(const Fa2Args& args, dim3 grid, cudaStream_t stream, bool pdl) {
  if (!Fa2Supports(args.head_dim, args.v_head_dim) || !(args.scale_log2 > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: the FA2 prefill kernel does not serve head_dim ",
                     args.head_dim, ", v_head_dim ", args.v_head_dim));
  }
  return WithFa2(args.head_dim, args.v_head_dim, Fa2LaunchOp{&args, grid, stream, pdl});
}

}  // namespace sluice::kernels::paged_detail
