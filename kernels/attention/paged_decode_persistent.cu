// PagedDecodeWarpKernel (paged_attention_launch.cuh): persistent decode warps over a paged KV
// cache, served where a decode launch's (sequence, KV head) units fill the GPU's resident warps.
//
// PagedTileKernel gives each (sequence, KV head) a CTA whose warps split the keys and
// merge at the end. At batch 256 × 1k context (Llama-3-8B: 2048 CTAs of 2 warps, ~4 waves of
// ~70 µs) every CTA pays a ramp — metadata, then block table, then the first K/V bytes, ~2-3
// µs of dependent latency with its ring empty — and a merge barrier, ~4% of its life; at 8k
// context (8× longer CTAs) the same kernel reaches 0.96 of the copy bandwidth, at 1k 0.92.
// Here a WARP owns a whole unit (sequence, KV head, split): no merge and no CTA barrier, and
// each warp walks its units u = first, first + W, ... (W warps in the grid, sized to about
// one or a few rounds of resident warps) through ONE private cp.async ring whose copies run
// kStages − 1 slices ahead ACROSS unit boundaries: while the warp finishes unit n, the first
// slices of unit n + 1 are already in flight, and the metadata of the unit after that (query
// range, context length) is loaded a unit ahead, the block-table lookup a slice ahead. So the
// ramp is paid once per warp rather than once per unit. Same math per slice as the warp rings
// (AttendSlice), same partial-output format for split-KV.
// Units enumerate KV heads fastest, then sequences, then splits: warps running side by side
// read the neighbouring heads of the same cache rows.
// Decode fusion: before its first copy the warp writes the rotated k and v of every unit it
// owns that holds its token's new key position (exactly one unit per (sequence, KV head)
// does, and that unit is read by no other warp), then __syncwarp orders those writes before
// its own cp.async reads; each unit's q is rotated with a per-warp (cos, sin) table.
// Shared memory: kWarps × kStages slices of kBN keys (+ kWarps tables of kD/2 float2 when
// fused); at d 128 with 4 warps × 3 stages 102 KiB: 2 CTAs (8 warps) per SM; the wide shape
// served at padded head dim 128 puts the same 8 warps in one CTA (204 KiB) and copies with an
// L2 evict-first policy.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/attention/paged_attention_launch.cuh"
#include "kernels/attention/paged_decode_device.cuh"

namespace sluice::kernels::paged_detail {
namespace {

struct DecodeUnit {
  int seq, kv_head, split;  // split: the index of the unit's partial output
  int q_begin, rows, ctx;
  int kv_begin, kv_end;  // keys the unit's rows may see, within its partition
  int tile_first;        // first slice start (a multiple of kBN); == kv_end when no keys
};

struct UnitMeta {
  int q_begin, q_end, ctx;
};

__device__ __forceinline__ int UnitSeq(const AttnArgs& a, int u) {
  return (u / a.num_kv_heads) % a.num_sequences;
}

// Metadata of unit u (zeros past the last unit: no rows).
__device__ __forceinline__ UnitMeta LoadUnitMeta(const AttnArgs& a, int u, int num_units) {
  if (u >= num_units) return UnitMeta{0, 0, 0};
  const int seq = UnitSeq(a, u);
  return UnitMeta{a.query_start_loc[seq], a.query_start_loc[seq + 1], a.context_lens[seq]};
}

// Unit u with metadata m: split u / (KV heads · sequences) is the partition of the keys
// [split · P, (split + 1) · P) (P = partition_tokens) and the index of its partial output.
template <int kBN>
__device__ __forceinline__ DecodeUnit MakeUnit(const AttnArgs& a, int u, const UnitMeta& m) {
  DecodeUnit d;
  d.kv_head = u % a.num_kv_heads;
  d.seq = UnitSeq(a, u);
  d.split = u / a.num_kv_heads / a.num_sequences;
  d.q_begin = m.q_begin;
  d.rows = (m.q_end - m.q_begin) * a.group;  // ≤ 16 (decode plan), 0 past the last unit
  d.ctx = m.ctx;
  d.kv_begin = 0;
  d.kv_end = 0;
  if (d.rows > 0) {
    // As PagedTileKernel for its one m16 tile.
    const int pos_last = m.ctx + (d.rows - 1) / a.group;
    d.kv_begin = a.sliding_window > 0 ? max(0, m.ctx - a.sliding_window + 1) : 0;
    d.kv_end = pos_last + 1;
    if (a.num_splits > 1) {
      d.kv_begin = max(d.kv_begin, d.split * a.partition_tokens);
      d.kv_end = min(d.kv_end, (d.split + 1) * a.partition_tokens);
    }
  }
  d.tile_first = d.kv_begin < d.kv_end ? d.kv_begin / kBN * kBN : d.kv_end;
  return d;
}

// ---- Swapped GQA decode math (the wide persistent warps, ≤ 8 query rows a unit) ----
//
// A decode unit has rows = query tokens × group ≤ 8 query rows (4 at Llama-3-8B's group 4),
// but the m16 tiles of AttendSlice hold 16: three quarters of the Q·Kᵀ and P·V work and of
// the 64 output accumulators a thread keeps are padding. The swapped form puts the keys on
// the m16 side and the unit's rows on the n8 side (TensorRT-LLM's XQA kernels pack GQA query
// heads the same way): Sᵀ[16 keys × 8 rows] = K·Qᵀ (kD / 16 mma a slice, K by ldmatrix as the
// A operand, Qᵀ as B fragments kept in registers), the online softmax runs per column (a
// column's 16 keys live in the 8 lanes of one t, reduced with three shuffles), Pᵀ goes from
// the C layout to the B layout with movmatrix.trans, and Oᵀ[dims × 8 rows] += Vᵀ·Pᵀ (kDV / 16
// mma a slice, Vᵀ by ldmatrix.trans as the A operand): half the mma and 32 accumulators.
// Column r of a unit is its row r: query token q_begin + r / group, head kv_head·group +
// r % group; columns ≥ rows hold zero queries and are never stored. Split-KV units write the
// partials StoreRows writes.
// 128 registers a thread instead of 218; the launch is bound by the K/V bytes, not the warps'
// instruction chains (figures: bench/results/paged_attention_variants.md).

// Transposes the 8×8 b16 matrix whose row lane / 4, columns 2(lane % 4)..+1 this lane holds.
__device__ __forceinline__ uint32_t MovMatrixTrans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Qᵀ's B fragments for every k16 step: b0 = Q[row g][ks·16 + 2t..+1], b1 = … + 8; rotated on
// the way when `rope_cs` is the unit's token's (cos, sin) table (decode fusion, one token a
// unit), as LoadQFrag.
template <int kKSteps>
__device__ __forceinline__ void LoadQSwapped(const AttnArgs& a, const DecodeUnit& c, int g, int t,
                                             uint32_t (&qb)[kKSteps][2],
                                             const float2* rope_cs = nullptr) {
  const bool live = g < c.rows;
  const bf16* qrow =
      live ? a.q + static_cast<int64_t>(c.q_begin + g / a.group) * a.q_token_stride +
                 static_cast<int64_t>(c.kv_head * a.group + g % a.group) * a.head_dim
           : a.q;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = ks * 16 + h * 8 + 2 * t;
      if (!live || col >= a.head_dim) {
        qb[ks][h] = 0u;
      } else if (rope_cs != nullptr) {
        qb[ks][h] = attention_detail::DecodeRopePair(qrow, col, rope_cs, a.fusion.half);
      } else {
        qb[ks][h] = *reinterpret_cast<const uint32_t*>(qrow + col);
      }
    }
  }
}

// The keys [lo, hi) that every live row of swapped unit c sees (ScoresSwapped's mask is
// all-true there): within the partition, at or before the first row's position (rows of one
// unit are its tokens' group heads, positions ctx, ctx + 1, …), and inside the window of the
// last row. A slice key0.. is whole-visible when lo ≤ key0 and key0 + 16 ≤ hi.
struct SwappedFullKeys {
  int lo, hi;
};
__device__ __forceinline__ SwappedFullKeys SwappedFull(const AttnArgs& a, const DecodeUnit& c) {
  int lo = c.kv_begin;
  if (a.sliding_window > 0) {
    const int pos_last = c.ctx + (c.rows > 0 ? (c.rows - 1) / a.group : 0);
    lo = max(lo, pos_last - a.sliding_window + 1);
  }
  return SwappedFullKeys{lo, min(c.kv_end, c.ctx + 1)};
}

// Sᵀ of one 16-key slice (K rows 0..15 of k_smem, keys key0..) of unit c in the swapped form
// and its online-softmax step: rescales acc / col_sum where a column's max grew and returns
// Pᵀ as the B fragments pb of Oᵀ += Vᵀ·Pᵀ (PvSwapped). acc[m]: Oᵀ tile m, (dim m·16 + g,
// columns 2t, 2t+1), (dim m·16 + g + 8, …); col_max / col_sum: columns 2t and 2t+1 (col_sum
// partial over this lane's keys).
// full (warp-uniform): every key of the slice is visible to every row (SwappedFullKeys), so
// the per-score mask is skipped. kSwizzled: k_smem's rows are SliceRows<kD, true>.
template <int kD, int kDV, bool kSwizzled = false>
__device__ __forceinline__ void ScoresSwapped(const AttnArgs& a, const bf16* k_smem, int key0,
                                              const DecodeUnit& c,
                                              const uint32_t (&qb)[kD / 16][2],
                                              float (&acc)[kDV / 16][4], float (&col_max)[2],
                                              float (&col_sum)[2], int lane, uint32_t (&pb)[2],
                                              bool full = false) {
  constexpr int kKSteps = kD / 16;
  constexpr int kOTiles = kDV / 16;
  const int g = lane / 4;
  const int t = lane % 4;
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // ldmatrix.x4: lanes 0-7 keys 0-7 / dims +0, 8-15 keys 8-15 / +0, 16-23 keys 0-7 / +8,
  // 24-31 keys 8-15 / +8 → the A fragment (a0 key g, a1 key g + 8, a2 / a3 the next 8 dims).
  using Rows = SliceRows<kD, kSwizzled>;
  const int krow = (lane & 7) + ((lane >> 3) & 1) * 8;
  const bf16* kmat = k_smem + krow * Rows::kPitch;
  // Column ks·16 + (lane / 16)·8 = ks·16 ^ (lane / 16)·8 (the lane's part is below 16), so
  // At(krow, column) = (lane's part ^ Mask) ^ ks·16. Keep the XOR: with the mask folded in,
  // + would be wrong.
  const int kcol = ((lane >> 4) * 8) ^ Rows::Mask(krow);
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t af[4];
    LdMatrixX4(af, kmat + (kcol ^ (ks * 16)));
    Mma16816(s, af, qb[ks][0], qb[ks][1]);
  }
  float tile_max[2] = {-INFINITY, -INFINITY};
  if (full) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[e] *= a.scale_log2;
      tile_max[e & 1] = fmaxf(tile_max[e & 1], s[e]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + g + (e >> 1) * 8;
      const int col = 2 * t + (e & 1);
      const int pos = c.ctx + col / a.group;
      const bool visible = key >= c.kv_begin && key < c.kv_end && key <= pos &&
                           (a.sliding_window <= 0 || key > pos - a.sliding_window);
      s[e] = visible ? s[e] * a.scale_log2 : -INFINITY;
      tile_max[e & 1] = fmaxf(tile_max[e & 1], s[e]);
    }
  }
  float alpha[2], base[2];
  bool grew = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int x = 4; x < 32; x *= 2) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], x));
    }
    const float new_max = fmaxf(col_max[i], tile_max[i]);
    base[i] = new_max == -INFINITY ? 0.0f : new_max;
    alpha[i] = Exp2(col_max[i] - base[i]);
    grew |= new_max != col_max[i];
    col_max[i] = new_max;
  }
  if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
    for (int i = 0; i < 2; ++i) col_sum[i] *= alpha[i];
#pragma unroll
    for (int m = 0; m < kOTiles; ++m) {
      acc[m][0] *= alpha[0];
      acc[m][1] *= alpha[1];
      acc[m][2] *= alpha[0];
      acc[m][3] *= alpha[1];
    }
  }
  float p[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    p[e] = Exp2(s[e] - base[e & 1]);
    col_sum[e & 1] += p[e];
  }
  // Pᵀ keys 0-7 / 8-15 in the C layout (row key, columns 2t..) → transposed, the B fragments
  // (keys 2t..+1 / 8 + 2t..+1, column g) of Oᵀ += Vᵀ·Pᵀ.
  pb[0] = MovMatrixTrans(PackBf16(p[0], p[1]));
  pb[1] = MovMatrixTrans(PackBf16(p[2], p[3]));
}

// Oᵀ += Vᵀ·Pᵀ for one 16-key slice (V rows 0..15 of v_smem, rows SliceRows<kDV, kSwizzled>;
// pb from ScoresSwapped).
template <int kDV, bool kSwizzled = false>
__device__ __forceinline__ void PvSwapped(const bf16* v_smem, const uint32_t (&pb)[2],
                                          float (&acc)[kDV / 16][4], int lane) {
  // ldmatrix.x4.trans: lanes 0-7 keys 0-7 / dims +0, 8-15 keys 0-7 / +8, 16-23 keys 8-15 / +0,
  // 24-31 keys 8-15 / +8 → Vᵀ's A fragment (dims g / g + 8 × keys 2t.. / 8 + 2t..).
  using Rows = SliceRows<kDV, kSwizzled>;
  const int vrow = (lane & 7) + (lane >> 4) * 8;
  const bf16* vmat = v_smem + vrow * Rows::kPitch;
  const int vcol = (((lane >> 3) & 1) * 8) ^ Rows::Mask(vrow);  // XOR as ScoresSwapped's kcol
#pragma unroll
  for (int m = 0; m < kDV / 16; ++m) {
    uint32_t av[4];
    LdMatrixX4Trans(av, vmat + (vcol ^ (m * 16)));
    Mma16816(acc[m], av, pb[0], pb[1]);
  }
}

// Writes unit c's rows from the swapped accumulators: bf16 outputs, or with num_splits > 1 the
// fp32 partial and its (max, sum) in the layout StoreRows writes.
template <int kDV>
__device__ __forceinline__ void StoreSwapped(const AttnArgs& a, const DecodeUnit& c,
                                             const float (&acc)[kDV / 16][4],
                                             const float (&col_max)[2], float (&col_sum)[2],
                                             int lane) {
  const int g = lane / 4;
  const int t = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int x = 4; x < 32; x *= 2) col_sum[i] += __shfl_xor_sync(0xffffffffu, col_sum[i], x);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int col = 2 * t + i;
    if (col >= c.rows) continue;
    const float inv = col_sum[i] > 0.0f ? 1.0f / col_sum[i] : 0.0f;
    const int64_t out_row = static_cast<int64_t>(c.q_begin + col / a.group) * a.num_heads +
                            c.kv_head * a.group + col % a.group;
    if (a.num_splits == 1) {
      bf16* o = a.out + out_row * a.v_head_dim;
#pragma unroll
      for (int m = 0; m < kDV / 16; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int dim = m * 16 + g + 8 * h;
          if (dim < a.v_head_dim) o[dim] = __float2bfloat16_rn(acc[m][i + 2 * h] * inv);
        }
      }
    } else {
      const int64_t part_row =
          static_cast<int64_t>(c.split) * a.num_tokens * a.num_heads + out_row;
      float* o = a.partial_out + part_row * a.v_head_dim;
#pragma unroll
      for (int m = 0; m < kDV / 16; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int dim = m * 16 + g + 8 * h;
          if (dim < a.v_head_dim) o[dim] = acc[m][i + 2 * h] * inv;
        }
      }
      if (g == 0) a.partial_ml[part_row] = make_float2(col_max[i], col_sum[i]);
    }
  }
}

// The producer side of a persistent decode warp: the kBN-key slices of the units first,
// first + stride, … (< num_units) in order, skipping units without keys (their outputs are
// still written by the consumer). u / p: the unit of the next slice to copy, tile its first
// key, slot its LaneSlot; next_meta the metadata of the unit after it.
template <int kBN>
struct SliceStream {
  int u, stride, num_units, tile;
  DecodeUnit p;
  UnitMeta next_meta;
  int64_t slot;

  __device__ __forceinline__ SliceStream(const AttnArgs& a, int first, int stride_, int units,
                                         const UnitMeta& meta0, int lane)
      : u(first), stride(stride_), num_units(units) {
    p = MakeUnit<kBN>(a, u, meta0);
    next_meta = LoadUnitMeta(a, u + stride, num_units);
    tile = p.tile_first;
    SkipEmpty(a);
    Locate(a, lane);
  }
  __device__ __forceinline__ bool live() const { return u < num_units; }
  // After the current slice was copied: the next slice (and its unit).
  __device__ __forceinline__ void Next(const AttnArgs& a, int lane) {
    tile += kBN;
    SkipEmpty(a);
    Locate(a, lane);
  }

 private:
  __device__ __forceinline__ void SkipEmpty(const AttnArgs& a) {
    while (u < num_units && tile >= p.kv_end) {
      u += stride;
      p = MakeUnit<kBN>(a, u, next_meta);
      next_meta = LoadUnitMeta(a, u + stride, num_units);
      tile = p.tile_first;
    }
  }
  __device__ __forceinline__ void Locate(const AttnArgs& a, int lane) {
    slot = u < num_units ? LaneSlot<kBN>(a, a.block_tables + p.seq * a.max_blocks_per_seq, tile,
                                         p.kv_begin, p.kv_end, lane)
                         : -1;
  }
};

template <int kD, int kDV, int kWarps, int kBN, int kStages, bool kSwizzled = false>
struct DecodeWarpConfig {
  static_assert(kStages >= 2);
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSliceElems =
      kBN * (SliceRows<kD, kSwizzled>::kPitch + SliceRows<kDV, kSwizzled>::kPitch);
  static constexpr int kSmemBytes = kWarps * kStages * kSliceElems * static_cast<int>(sizeof(bf16));
  // Fused launches add a (cos, sin) table per warp after the rings.
  static constexpr int kFusionBytes = kWarps * attention_detail::DecodeRopeSmemBytes(kD);
};

// kEvictFirst: K/V copies with an L2 evict-first policy (CopyChunk).
// kSwapped: the swapped GQA math (ScoresSwapped / PvSwapped; only launched with ≤ 8 rows a
// unit; under decode fusion each unit's q is rotated on load with its token's table).
// kSwizzled (swapped only): the ring's K/V rows are SliceRows<·, true>.
template <int kD, int kDV, int kWarps, int kBN, int kStages, bool kEvictFirst,
          bool kSwapped = false, bool kSwizzled = false>
__global__ void __launch_bounds__(32 * kWarps) PagedDecodeWarpKernel(const AttnArgs args) {
  static_assert(kSwapped || !kSwizzled, "AttendSlice reads padded rows");
  using Cfg = DecodeWarpConfig<kD, kDV, kWarps, kBN, kStages, kSwizzled>;
  constexpr int kKSteps = kD / 16;
  constexpr int kVTiles = kDV / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  bf16* const ring = reinterpret_cast<bf16*>(smem_raw) + warp * kStages * Cfg::kSliceElems;
  float2* const rope_cs =
      reinterpret_cast<float2*>(smem_raw + Cfg::kSmemBytes) + warp * (kD / 2);
  const bool fused = args.fusion.inv_freq != nullptr;
  // Fused launches at head dims ≤ 128 write each unit's new key right before copying the slice
  // that holds it (DeferredKvWrite), so the slices below it stream from the start as in plain
  // launches; wider heads write every new key of the warp before any copy (the loaded row
  // costs d/32 × 3 bf16 and d/32 floats a lane, which at d 256 would spill).
  const bool deferred_write = kD <= 128 && fused;
  const uint64_t policy = kEvictFirst ? attention_detail::L2EvictFirstPolicy() : 0;
  const int num_units = args.num_sequences * args.num_kv_heads * args.num_splits;
  const int stride = static_cast<int>(gridDim.x) * kWarps;
  const int first = static_cast<int>(blockIdx.x) * kWarps + warp;

  // Producer: the slice stream of all this warp's units, kStages − 1 slices ahead of the
  // consumer. Every issue() commits exactly one copy group (empty once the stream is
  // exhausted), so "slice i landed" is "at most kStages − 1 newer groups pending", as in the
  // rings of PagedTileKernel.
  const UnitMeta meta0 = LoadUnitMeta(args, first, num_units);
  // Fused launches load each unit's RoPE position while the warp attends the unit before
  // (step metadata: the first one before the dependency wait), so a unit's table costs no load.
  const auto position_of = [&](const UnitMeta& m) {
    return fused && m.q_end > m.q_begin ? static_cast<float>(args.fusion.positions[m.q_begin])
                                        : 0.0f;
  };
  float c_pos = position_of(meta0);
  SliceStream<kBN> pr(args, first, stride, num_units, meta0, lane);
  int fill = 0;
  constexpr int kPendingPerLane = kD <= 128 ? kD / 32 : 1;
  attention_detail::PendingKvWrite<kPendingPerLane> pending;  // DeferredKvWrite's new key
  int pending_unit = -1;  // the unit it was loaded for
  bool waited = false;  // past the dependency wait (qkv may be read)
  constexpr bool kContiguousFits = kD == kDV && 32 % (kD / 8) == 0;
  const bool contiguous_copies =
      kContiguousFits && args.head_dim == args.v_head_dim && args.block_size % kBN == 0;
  auto issue = [&]() {
    if (pr.live()) {
      // DeferredKvWrite (only after the dependency wait: the early copies take slices wholly
      // below ctx). The unit's new key (position ctx, token q_begin) is loaded into registers
      // when the slice before the one holding it is copied, and rotated and stored with its
      // value right before that slice's copy (loaded then if the unit has no earlier slice).
      if (deferred_write && waited && pr.p.rows > 0 && pr.p.kv_begin <= pr.p.ctx &&
          pr.p.ctx < pr.p.kv_end && pr.tile <= pr.p.ctx && pr.p.ctx < pr.tile + 2 * kBN) {
        const auto load = [&]() {
          attention_detail::DecodeKvWriteLoad<kPendingPerLane>(
              args.fusion, args.q + static_cast<int64_t>(pr.p.q_begin) * args.q_token_stride,
              pr.p.q_begin, pr.p.kv_head, args.head_dim, lane, pending);
          pending_unit = pr.u;
        };
        if (pr.p.ctx >= pr.tile + kBN) {
          load();
        } else {
          if (pending_unit != pr.u) load();
          attention_detail::DecodeKvWriteStore<kPendingPerLane>(
              args.fusion, pr.p.kv_head, args.num_kv_heads, args.head_dim, lane, pending);
          __syncwarp();  // orders the writes before the copies
        }
      }
      const int64_t kv_off = static_cast<int64_t>(pr.p.kv_head);
      bool copied = false;
      if constexpr (kContiguousFits) {
        if (contiguous_copies && pr.tile >= pr.p.kv_begin && pr.tile + kBN <= pr.p.kv_end) {
          CopySliceContiguous<kD, kBN, kEvictFirst, kSwizzled>(
              args, ring + fill * Cfg::kSliceElems, pr.slot,
              args.k_cache + kv_off * args.head_dim, args.v_cache + kv_off * args.head_dim, lane,
              policy);
          copied = true;
        }
      }
      if (!copied) {
        CopySlice<kD, kDV, kBN, kEvictFirst, kSwizzled>(
            args, ring + fill * Cfg::kSliceElems, pr.slot, args.k_cache + kv_off * args.head_dim,
            args.v_cache + kv_off * args.v_head_dim, lane, policy);
      }
      pr.Next(args, lane);
    } else {
      CpAsyncCommit();  // an empty group keeps the wait_group count
    }
    fill = fill + 1 == kStages ? 0 : fill + 1;
  };
  // Slices wholly below their unit's context length, copied before the dependency wait
  // (PrefetchBeforeWait); in a fusion launch only with the deferred writes.
  int pre = 0;
  if (!fused || deferred_write) {
    while (pre < kStages - 1 && (!pr.live() || pr.tile + kBN <= pr.p.ctx)) {
      issue();
      ++pre;
    }
  }
  attention_detail::GridDependencyWait();
  attention_detail::LaunchDependents();
  waited = true;

  if (fused && !deferred_write) {
    // The new keys of this warp's units reach the cache before any of its copies.
    for (int u = first; u < num_units; u += stride) {
      const DecodeUnit d = MakeUnit<kBN>(args, u, LoadUnitMeta(args, u, num_units));
      if (d.rows > 0 && d.kv_begin <= d.ctx && d.ctx < d.kv_end) {
        attention_detail::DecodeRopeTable(args.fusion, d.q_begin, rope_cs, lane, 32);
        __syncwarp();
        attention_detail::DecodeRopeWriteKv(
            args.fusion, args.q + static_cast<int64_t>(d.q_begin) * args.q_token_stride,
            d.q_begin, d.kv_head, args.num_kv_heads, args.head_dim, rope_cs, lane, 32);
        __syncwarp();  // before cs is refilled, and orders the writes before the copies
      }
    }
  }

  for (; pre < kStages - 1; ++pre) issue();

  // Consumer: the same units in the same order, one slice per iteration.
  int buf = 0;
  UnitMeta c_meta = meta0;
  for (int u = first; u < num_units; u += stride) {
    const DecodeUnit c = MakeUnit<kBN>(args, u, c_meta);
    const float pos = c_pos;
    c_meta = LoadUnitMeta(args, u + stride, num_units);
    c_pos = position_of(c_meta);
    if constexpr (kSwapped) {
      static_assert(kBN == 16, "one m16 tile of keys a slice");
      if (fused && c.rows > 0) {
        attention_detail::DecodeRopeTableAt(args.fusion, pos, rope_cs, lane, 32);
        __syncwarp();
      }
      uint32_t qb[kKSteps][2];
      LoadQSwapped<kKSteps>(args, c, g, t, qb, fused ? rope_cs : nullptr);
      if (fused) __syncwarp();  // every lane has read rope_cs before the next unit refills it
      float acc[kDV / 16][4];
#pragma unroll
      for (int m = 0; m < kDV / 16; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
      float col_max[2] = {-INFINITY, -INFINITY};
      float col_sum[2] = {0.0f, 0.0f};
      const SwappedFullKeys fk = SwappedFull(args, c);
      for (int tile = c.tile_first; tile < c.kv_end; tile += kBN) {
        issue();
        CpAsyncWait<kStages - 1>();
        __syncwarp();
        const bf16* k_smem = ring + buf * Cfg::kSliceElems;
        uint32_t pb[2];
        ScoresSwapped<kD, kDV, kSwizzled>(args, k_smem, tile, c, qb, acc, col_max, col_sum,
                                          lane, pb, tile >= fk.lo && tile + kBN <= fk.hi);
        PvSwapped<kDV, kSwizzled>(k_smem + kBN * SliceRows<kD, kSwizzled>::kPitch, pb, acc,
                                  lane);
        __syncwarp();  // the next issue() may refill this buffer
        buf = buf + 1 == kStages ? 0 : buf + 1;
      }
      StoreSwapped<kDV>(args, c, acc, col_max, col_sum, lane);
      continue;
    }
    const RowInfo rw = MakeRows(0, c.rows, args.group, c.q_begin, c.ctx, c.kv_head, g);
    if (fused && c.rows > 0) {
      attention_detail::DecodeRopeTableAt(args.fusion, pos, rope_cs, lane, 32);
      __syncwarp();
    }
    uint32_t q_frag[kKSteps][4];
    LoadQFrag<kKSteps>(args, rw, t, fused, rope_cs, q_frag);
    float acc[kVTiles][4];
#pragma unroll
    for (int v = 0; v < kVTiles; ++v) acc[v][0] = acc[v][1] = acc[v][2] = acc[v][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    const int pos_last = c.ctx + (c.rows > 0 ? (c.rows - 1) / args.group : 0);
    for (int tile = c.tile_first; tile < c.kv_end; tile += kBN) {
      issue();
      CpAsyncWait<kStages - 1>();
      __syncwarp();
      const bf16* k_smem = ring + buf * Cfg::kSliceElems;
      AttendSlice<kD, kDV, kBN>(args, k_smem, k_smem + kBN * Pitch<kD>(), 0, tile, c.kv_begin,
                                c.kv_end, c.ctx, pos_last, rw, q_frag, acc, row_max, row_sum,
                                lane);
      __syncwarp();  // the next issue() may refill this buffer
      buf = buf + 1 == kStages ? 0 : buf + 1;
    }
    QuadSumRows(row_sum);
    StoreRows<kDV>(args, rw, c.split, acc, row_max, row_sum, t);
    if (fused) __syncwarp();  // every lane has read rope_cs before the next unit refills it
  }
}

constexpr int kDecodeWarpStages = 3;

// PagedDecodeWarpKernel's depth at padded dims (kD, kDV) in the 4-warp shape: kDecodeWarpStages
// or what fits the 227 KiB of shared memory with the fusion's tables.
template <int kD, int kDV>
constexpr int DecodeWarpStages() {
  constexpr int kWarps = PersistentWarpsPerCta(false);
  constexpr int kStageBytes =
      kWarps * kDecodeSliceKeys * (Pitch<kD>() + Pitch<kDV>()) * static_cast<int>(sizeof(bf16));
  constexpr int kFusionBytes = kWarps * attention_detail::DecodeRopeSmemBytes(kD);
  constexpr int kFit = (227 * 1024 - kFusionBytes) / kStageBytes;
  static_assert(kFit >= 2, "two stages of persistent decode warps fit");
  return kFit < kDecodeWarpStages ? kFit : kDecodeWarpStages;
}

// PagedDecodeWarpKernel at padded dims (kD, kDV): the 4-warp shape, or (kWide, dims 128 only)
// the 8-warp evict-first one, with the swapped math on swizzled slice rows (kSwapped) or the
// m16-row math on padded rows; op.Run gets the kernel and its config.
template <int kD, int kDV, bool kWide, bool kSwapped = false, typename Op>
auto WithDecodeWarpKernel(const Op& op) {
  constexpr int kWarps = PersistentWarpsPerCta(kWide);
  if constexpr (!kWide) {
    constexpr int kStages = DecodeWarpStages<kD, kDV>();
    using Cfg = DecodeWarpConfig<kD, kDV, kWarps, kDecodeSliceKeys, kStages>;
    return op.template Run<Cfg>(
        &PagedDecodeWarpKernel<kD, kDV, kWarps, kDecodeSliceKeys, kStages, false>);
  } else {
    static_assert(kD == 128 && kDV == 128);
    using Cfg =
        DecodeWarpConfig<kD, kDV, kWarps, kDecodeSliceKeys, kDecodeWarpStages, kSwapped>;
    static_assert(Cfg::kSmemBytes + Cfg::kFusionBytes <= 227 * 1024);
    return op.template Run<Cfg>(&PagedDecodeWarpKernel<kD, kDV, kWarps, kDecodeSliceKeys,
                                                       kDecodeWarpStages, true, kSwapped,
                                                       kSwapped>);
  }
}

// WithDecodeWarpKernel for a run-time shape (the 4-warp one off the 128 dims).
template <int kD, int kDV, typename Op>
auto WithDecodeWarpShape(bool wide, const Op& op, bool swapped = false) {
  if constexpr (kD == 128 && kDV == 128) {
    if (wide && swapped) return WithDecodeWarpKernel<kD, kDV, true, true>(op);
    if (wide) return WithDecodeWarpKernel<kD, kDV, true>(op);
  }
  return WithDecodeWarpKernel<kD, kDV, false>(op);
}

struct DecodeWarpLaunchOp {
  const AttnArgs* args;
  int ctas;
  bool wide;
  bool swapped;
  cudaStream_t stream;
  bool pdl;
  template <typename Cfg>
  absl::Status Run(void (*kernel)(AttnArgs)) const {
    const int smem = Cfg::kSmemBytes + (args->fusion.inv_freq != nullptr ? Cfg::kFusionBytes : 0);
    return LaunchWithSmem(kernel, Cfg::kThreads, smem, *args, dim3(static_cast<unsigned>(ctas)),
                          stream, pdl);
  }
  template <int kD, int kDV>
  absl::Status Run() const {
    return WithDecodeWarpShape<kD, kDV>(wide, *this, swapped);
  }
};

// Sizes the wide shape with its padded, unswapped kernel (204 KiB at d 128); the swapped
// kernel on swizzled rows launched instead (192 KiB) also fits one CTA per SM, and a low
// estimate would only shrink the persistent grid.
struct DecodeWarpOccupancyOp {
  bool wide;
  template <typename Cfg>
  int Run(void (*kernel)(AttnArgs)) const {
    return Occupancy(kernel, Cfg::kThreads, Cfg::kSmemBytes);
  }
  template <int kD, int kDV>
  int Run() const {
    return WithDecodeWarpShape<kD, kDV>(wide, *this);
  }
};

}  // namespace

absl::Status LaunchPersistentDecode(PaddedDims dims, bool wide, bool swapped, const AttnArgs& args,
                                    int ctas, cudaStream_t stream, bool pdl) {
  return WithPaddedDims(dims, DecodeWarpLaunchOp{&args, ctas, wide, swapped, stream, pdl});
}

int PersistentDecodeOccupancy(PaddedDims dims, bool wide) {
  return WithPaddedDims(dims, DecodeWarpOccupancyOp{wide});
}

}  // namespace sluice::kernels::paged_detail
