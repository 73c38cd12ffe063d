// PagedAttentionCuda's planner and dispatch (paged_attention_cuda.h): validation, the shape
// rules that pick a kernel per launch (PagedAttentionOptions may force one), the split-KV plan,
// and the launches of the kernel families (paged_attention_launch.cuh) and the split-KV
// combine (attention_device.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/attention/decode_rope_fusion.cuh"
#include "kernels/attention/paged_attention_cuda.h"
#include "kernels/attention/paged_attention_invariant.h"
#include "kernels/attention/paged_attention_launch.cuh"
#include "kernels/attention/paged_prefill_device.cuh"
#include "kernels/attention/paged_prefill_wgmma.h"
#include "kernels/cuda/device_utils.cuh"

namespace sluice::kernels {
namespace {

using attention_detail::kMaxSplitsDevice;
using cuda_detail::Aligned16;
using paged_detail::AttnArgs;
using paged_detail::kKeyTile;
using paged_detail::PaddedDims;
using paged_detail::TileKind;

constexpr float kLog2e = 1.4426950408889634f;

bool PickDims(int64_t d, int64_t dv, PaddedDims* v) {
  const int64_t m = std::max(d, dv);
  if (m <= 32) {
    *v = PaddedDims::k32;
  } else if (m <= 64) {
    *v = PaddedDims::k64;
  } else if (m <= 128) {
    *v = PaddedDims::k128;
  } else if (d <= 192 && dv <= 128) {
    *v = PaddedDims::k192v128;
  } else if (m <= 256) {
    *v = PaddedDims::k256;
  } else {
    return false;
  }
  return true;
}

constexpr int kMinPartition = 2 * kKeyTile;
constexpr int64_t kMaxSplits = kMaxSplitsDevice;

// Kernel kinds: the PagedTileKernel shapes (TileKind's values, so a kind below kKindMmaTiles is
// its TileKind), then the prefill families.
constexpr int kKindCtaTiles = static_cast<int>(TileKind::kCtaTiles),
              kKindRing4x3 = static_cast<int>(TileKind::kRing4x3),
              kKindRing2x3 = static_cast<int>(TileKind::kRing2x3), kKindMmaTiles = 3, kKindFa2 = 4,
              kKindWgmma = 5;
constexpr int kNumKinds = 6;
static_assert(kKindRing2x3 + 1 == kKindMmaTiles);

// Rows per CTA of a prefill kind.
constexpr int PrefillRowsPerCta(int kind) {
  return kind == kKindWgmma      ? paged_detail::kWgmmaRowsPerCta
         : kind == kKindFa2      ? paged_detail::kFa2RowsPerCta
         : kind == kKindMmaTiles ? paged_detail::kMmaTileRows
                                 : paged_detail::kCtaTileRows;
}

struct LaunchPlan {
  bool decode;  // rows per sequence fit one m16 tile
  bool persistent = false;  // PagedDecodeWarpKernel (kind unused)
  bool wide = false;        // its 8-warp evict-first shape (padded head dims 128)
  // The wide shape with the swapped GQA math: ≤ 8 query rows a (sequence, KV head), with or
  // without decode fusion.
  bool swapped = false;
  int kind;     // kernel kind (kKind*)
  int rows_per_cta;
  int m_tiles;
  int num_splits;
  int partition_tokens;
  bool pdl;  // PagedAttentionOptions::pdl: the launches (and the combine) programmatic dependents
};

absl::Status ValidateParams(const PagedAttentionParams& p) {
  if (p.num_heads < 1 || p.num_kv_heads < 1 || p.head_dim < 1 || p.v_head_dim < 1 ||
      p.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: sizes must be >= 1 (num_heads ", p.num_heads,
                     ", num_kv_heads ", p.num_kv_heads, ", head_dim ", p.head_dim, ", v_head_dim ",
                     p.v_head_dim, ", block_size ", p.block_size, ")"));
  }
  if (p.num_heads > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: num_heads ", p.num_heads, " > 65535"));
  }
  if (p.num_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionCuda: num_heads ", p.num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   p.num_kv_heads));
  }
  PaddedDims v;
  if (p.head_dim % 8 != 0 || p.v_head_dim % 8 != 0 || !PickDims(p.head_dim, p.v_head_dim, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: unsupported head dims (head_dim ", p.head_dim,
                     ", v_head_dim ", p.v_head_dim, "); both must be multiples of 8, at most 256"));
  }
  if (p.sliding_window < 0 || p.sliding_window > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: sliding_window ", p.sliding_window, " out of range"));
  }
  return absl::OkStatus();
}

absl::Status ValidateBatch(const PagedAttentionCudaBatch& b) {
  if (b.num_sequences < 1 || b.num_tokens < 1 || b.max_query_len < 1 || b.max_seq_len < 1 ||
      b.max_blocks_per_seq < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionCuda: batch sizes must be >= 1 (num_sequences ", b.num_sequences,
        ", num_tokens ", b.num_tokens, ", max_query_len ", b.max_query_len, ", max_seq_len ",
        b.max_seq_len, ", max_blocks_per_seq ", b.max_blocks_per_seq, ")"));
  }
  if (b.max_query_len > b.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionCuda: max_query_len ",
                                                   b.max_query_len, " exceeds max_seq_len ",
                                                   b.max_seq_len));
  }
  if (b.num_sequences > 65535 || b.max_seq_len > INT32_MAX / 2 || b.num_tokens > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: batch too large (num_sequences ", b.num_sequences,
                     " > 65535 or max_seq_len ", b.max_seq_len, " / num_tokens ", b.num_tokens,
                     " beyond int32)"));
  }
  if (b.query_start_loc == nullptr || b.context_lens == nullptr || b.block_tables == nullptr) {
    return absl::InvalidArgumentError("PagedAttentionCuda: null batch metadata pointer");
  }
  return absl::OkStatus();
}

// CTAs of the chosen kernel resident on the whole GPU at once (SMs × occupancy), cached per
// (padded dims, kernel kind) for device 0..15; the launch path must stay cheap and capturable.
int64_t ResidentSlots(PaddedDims v, int kind) {
  static std::atomic<int> cache[16][5][kNumKinds];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 16) device = 0;
  std::atomic<int>& slot = cache[device][static_cast<int>(v)][kind];
  int n = slot.load(std::memory_order_relaxed);
  if (n > 0) return n;
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int per_sm =
      kind == kKindWgmma ? paged_detail::WgmmaPrefillOccupancy()
      : kind == kKindFa2
          ? paged_detail::Fa2Occupancy(v == PaddedDims::k64 ? 64 : 128,
                                       v == PaddedDims::k64 ? 64 : 128)
      : kind == kKindMmaTiles ? paged_detail::MmaPrefillOccupancy(v)
                              : paged_detail::TileKernelOccupancy(static_cast<TileKind>(kind), v);
  n = std::max(1, sms * per_sm);
  slot.store(n, std::memory_order_relaxed);
  return n;
}

// Persistent decode warps resident on the whole GPU at once (SMs × CTAs per SM × warps), cached
// per shape for device 0..15.
int64_t ResidentDecodeWarps(PaddedDims v, bool wide) {
  static std::atomic<int> cache[16][5][2];  // [4-warp, wide]
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 16) device = 0;
  std::atomic<int>& slot = cache[device][static_cast<int>(v)][wide ? 1 : 0];
  int n = slot.load(std::memory_order_relaxed);
  if (n > 0) return n;
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  n = std::max(1, sms * paged_detail::PersistentDecodeOccupancy(v, wide) *
                      paged_detail::PersistentWarpsPerCta(wide));
  slot.store(n, std::memory_order_relaxed);
  return n;
}

// CTAs of a persistent decode launch over `units` (sequence, KV head, split) units: as few
// rounds of units per warp as the resident warps allow, spread evenly (every warp gets the
// same number of units, ± 1).
int64_t DecodeWarpCtas(int64_t units, PaddedDims v, bool wide) {
  const int64_t resident = ResidentDecodeWarps(v, wide);
  const int64_t rounds = (units + resident - 1) / resident;
  const int64_t warps = (units + rounds - 1) / rounds;
  const int per_cta = paged_detail::PersistentWarpsPerCta(wide);
  return (warps + per_cta - 1) / per_cta;
}

// The prefill kind of a launch: the chain wgmma → FA2 → MMA tiles → CTA tiles from `first`
// on, each kind where it serves. The MMA, FA2 and wgmma kinds fold the scale into the
// exponent (need scale > 0) and hold at most 128-wide heads in registers.
int PrefillKind(const PagedAttentionParams& p, PagedPrefillKernel first) {
  const bool mma_fits = p.head_dim <= 128 && p.v_head_dim <= 128 && p.scale > 0.0f &&
                        std::isfinite(p.scale);
  if (!mma_fits || first == PagedPrefillKernel::kCtaTiles) return kKindCtaTiles;
  if (first == PagedPrefillKernel::kWgmma &&
      paged_detail::WgmmaPrefillSupports(p.head_dim, p.v_head_dim, p.scale, p.sliding_window)) {
    return kKindWgmma;
  }
  if (first != PagedPrefillKernel::kMmaTiles &&
      paged_detail::Fa2Supports(p.head_dim, p.v_head_dim)) {
    return kKindFa2;
  }
  return kKindMmaTiles;
}

// Plan picks the kernel and the grid. Split-KV: with few CTAs the GPU idles, and CTAs run in
// waves of `slots`, so a partial last wave wastes its share. Among partitions of ≥
// kMinPartition keys (multiples of the key tile) pick the one whose waves are fullest,
// preferring fewer splits (each split costs a partial-output write and the combine pass)
// unless more splits fill the waves ≥ 10% better (relative). Depends only on host-side
// bounds and the options, so captured graphs stay valid.
LaunchPlan Plan(const PagedAttentionCudaBatch& b, const PagedAttentionParams& p,
                const PagedAttentionOptions& options) {
  LaunchPlan plan;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t max_rows = b.max_query_len * group;
  plan.decode = max_rows <= 16;
  plan.pdl = options.pdl;
  PaddedDims v = PaddedDims::k128;
  PickDims(p.head_dim, p.v_head_dim, &v);
  plan.kind = plan.decode ? kKindCtaTiles : PrefillKind(p, options.prefill_kernel);
  plan.rows_per_cta = plan.decode ? 16 : PrefillRowsPerCta(plan.kind);
  plan.m_tiles = static_cast<int>((max_rows + plan.rows_per_cta - 1) / plan.rows_per_cta);
  plan.num_splits = 1;
  plan.partition_tokens = 0;
  const int64_t ctas = plan.m_tiles * p.num_kv_heads * b.num_sequences;
  if (plan.decode) {
    // Persistent decode warps where the unsplit units fill the resident warps at least once
    // (batch 256 × 8 KV heads on an H200: 2048 units, 1056 warps), so they need no split-KV
    // pass (or always, or never, as the options force); smaller grids take the warp rings.
    // Units are indexed in int32 (< 2^31 with any split count).
    const bool fits_int = ctas * kMaxSplits < INT32_MAX;
    const PagedDecodeKernel dk = options.decode_kernel;
    plan.persistent =
        fits_int && (dk == PagedDecodeKernel::kPersistentWarps ||
                     (dk == PagedDecodeKernel::kAuto && ctas >= ResidentDecodeWarps(v, false)));
    if (plan.persistent) {
      // The shape follows the head dims, not which launches take the warps (the 4-warp
      // shape's resident warps decide that above).
      plan.wide = v == PaddedDims::k128;
      plan.swapped = plan.wide && max_rows <= 8 && p.head_dim % 8 == 0;
      plan.kind = kKindRing2x3;  // unused: LaunchPlanned checks persistent first
    } else if (2 * ctas >= ResidentSlots(v, kKindRing2x3)) {
      // Warp rings. With CTAs for about a wave of 2-warp × 3-stage CTAs (4 per SM at head_dim
      // 128) or more, those: smaller CTAs fill the SMs in fewer, fuller waves.
      plan.kind = kKindRing2x3;
    } else {
      // Fewer CTAs (the grid will split): 4-warp rings of 3 stages. (A 2-stage ring for grids
      // beyond two waves of these is never reached: that needs more than 4× their resident
      // CTAs of 2-warp ones, and 2 warps on half the shared memory fit at most 3× as many.)
      plan.kind = kKindRing4x3;
    }
  }
  // Persistent warps each serve a unit as a CTA would: the split rule counts them as slots.
  const int64_t slots =
      plan.persistent ? ResidentDecodeWarps(v, plan.wide) : ResidentSlots(v, plan.kind);
  int64_t keys = b.max_seq_len;
  if (p.sliding_window > 0) {
    keys = std::min<int64_t>(keys, p.sliding_window + b.max_query_len + kKeyTile);
  }
  if (ctas >= 8 * slots || keys < 2 * kMinPartition) return plan;
  // Short partitions only when the batch is far too small to fill the GPU (latency-bound);
  // otherwise each split's partial write, combine and pipeline ramp cost more than a slightly
  // emptier last wave. Latency-bound decode goes down to one key tile per CTA (batch 1 × 1k
  // context, 8 KV heads: 8 CTAs → 8·17), so every SM streams and each CTA's chain is one copy
  // and one tile of math.
  const bool latency_bound = ctas * 4 < slots;
  const int64_t min_part =
      latency_bound ? (plan.decode ? kKeyTile : kMinPartition) : 4 * kMinPartition;
  auto fill = [&](int64_t splits) { return attention_detail::SplitWaveFill(ctas, splits, slots); };
  double best_fill = fill(1);
  int64_t best_part = 0;
  for (int64_t part = (keys / kKeyTile) * kKeyTile; part >= min_part; part -= kKeyTile) {
    const int64_t splits = (b.max_seq_len + part - 1) / part;
    if (splits < 2 || splits > kMaxSplits) continue;
    if (ctas * splits > 16 * slots) break;
    const double f = fill(splits);
    if (f > best_fill * 1.1) {
      best_fill = f;
      best_part = part;
    }
  }
  if (best_part > 0) {
    // The loop finds the longest partition for the best split count, which can leave the
    // last split a sliver (1024 keys in 2: 960 + 64), and a unit waits for its longest
    // split: spread the keys evenly over that many splits instead (512 + 512).
    const int64_t splits = (b.max_seq_len + best_part - 1) / best_part;
    const int64_t even = (b.max_seq_len + splits - 1) / splits;
    best_part = std::max<int64_t>(kKeyTile, (even + kKeyTile - 1) / kKeyTile * kKeyTile);
    plan.partition_tokens = static_cast<int>(best_part);
    plan.num_splits = static_cast<int>((b.max_seq_len + best_part - 1) / best_part);
  }
  return plan;
}

absl::Status LaunchPlanned(const AttnArgs& args, const LaunchPlan& plan, dim3 grid,
                           const PagedAttentionParams& params, cudaStream_t stream) {
  PaddedDims v = PaddedDims::k128;
  PickDims(params.head_dim, params.v_head_dim, &v);
  const bool pdl = plan.pdl;
  if (plan.persistent) {
    const int64_t units = args.num_sequences * static_cast<int64_t>(params.num_kv_heads) *
                          plan.num_splits;
    return paged_detail::LaunchPersistentDecode(
        v, plan.wide, plan.swapped, args, static_cast<int>(DecodeWarpCtas(units, v, plan.wide)),
        stream, pdl);
  }
  if (plan.kind == kKindWgmma) return paged_detail::LaunchWgmmaPrefill(args, grid, stream, pdl);
  if (plan.kind == kKindFa2) return paged_detail::LaunchFa2Prefill(args, grid, stream, pdl);
  if (plan.kind == kKindMmaTiles) return paged_detail::LaunchMmaPrefill(v, args, grid, stream, pdl);
  return paged_detail::LaunchTileKernel(static_cast<TileKind>(plan.kind), v, args, grid, stream,
                                        pdl);
}

}  // namespace

absl::StatusOr<PagedAttentionPlanInfo> DescribePagedAttentionPlan(
    const PagedAttentionCudaBatch& batch, const PagedAttentionParams& params,
    const PagedAttentionOptions& options) {
  if (absl::Status s = ValidateParams(params); !s.ok()) return s;
  if (absl::Status s = ValidateBatch(batch); !s.ok()) return s;
  if (options.batch_invariant) {
    PagedAttentionPlanInfo info;
    info.kernel = PagedAttentionKernel::kBatchInvariant;
    info.num_splits = attention_detail::BatchInvariantSplits(batch);
    return info;
  }
  const LaunchPlan plan = Plan(batch, params, options);
  PagedAttentionPlanInfo info;
  info.num_splits = plan.num_splits;
  info.swapped = plan.persistent && plan.swapped;
  if (plan.persistent) {
    info.kernel = PagedAttentionKernel::kPersistentWarps;
  } else if (plan.decode) {
    info.kernel = PagedAttentionKernel::kWarpRings;
  } else {
    info.kernel = plan.kind == kKindWgmma      ? PagedAttentionKernel::kWgmma
                  : plan.kind == kKindFa2      ? PagedAttentionKernel::kFa2
                  : plan.kind == kKindMmaTiles ? PagedAttentionKernel::kMmaTiles
                                               : PagedAttentionKernel::kCtaTiles;
  }
  return info;
}

size_t PagedAttentionCudaWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                        const PagedAttentionParams& params,
                                        const PagedAttentionOptions& options) {
  if (!ValidateParams(params).ok() || !ValidateBatch(batch).ok()) return 0;
  if (options.batch_invariant) return attention_detail::BatchInvariantWorkspaceBytes(batch, params);
  const LaunchPlan plan = Plan(batch, params, options);
  return attention_detail::SplitKvWorkspaceBytes(plan.num_splits, batch.num_tokens,
                                                 params.num_heads, params.v_head_dim);
}

namespace {

// PagedAttentionCuda, or with `fusion` set (fusion.inv_freq non-null) the fused decode launch of
// PagedAttentionRopeDecodeCuda (the caller has checked PagedAttentionDecodeFusionApplies).
absl::Status RunPagedAttention(const bf16* q, int64_t q_token_stride, const bf16* k_cache,
                               const bf16* v_cache, const PagedAttentionCudaBatch& batch,
                               const PagedAttentionParams& params, void* workspace, bf16* out,
                               const attention_detail::DecodeRopeFusion& fusion,
                               const PagedAttentionOptions& options, cudaStream_t stream) {
  if (absl::Status s = ValidateParams(params); !s.ok()) return s;
  if (absl::Status s = ValidateBatch(batch); !s.ok()) return s;
  if (q == nullptr || k_cache == nullptr || v_cache == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("PagedAttentionCuda: null q, cache or out pointer");
  }
  if (q_token_stride < params.num_heads * params.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionCuda: q_token_stride ",
                                                   q_token_stride, " < num_heads · head_dim ",
                                                   params.num_heads * params.head_dim));
  }
  if (!Aligned16(k_cache) || !Aligned16(v_cache) || (reinterpret_cast<uintptr_t>(q) & 3u) != 0 ||
      (reinterpret_cast<uintptr_t>(out) & 3u) != 0 || q_token_stride % 2 != 0) {
    return absl::InvalidArgumentError(
        "PagedAttentionCuda: k_cache/v_cache must be 16-byte aligned, q/out 4-byte aligned "
        "with an even q_token_stride");
  }
  if (options.batch_invariant) {
    if (fusion.inv_freq != nullptr) {
      return absl::InvalidArgumentError(
          "PagedAttentionRopeDecodeCuda: no RoPE fusion in batch-invariant mode");
    }
    return attention_detail::LaunchBatchInvariantAttention(q, q_token_stride, k_cache, v_cache,
                                                           batch, params, workspace, out, stream);
  }
  const LaunchPlan plan = Plan(batch, params, options);
  const size_t ws_bytes = attention_detail::SplitKvWorkspaceBytes(
      plan.num_splits, batch.num_tokens, params.num_heads, params.v_head_dim);
  if (ws_bytes > 0 && (workspace == nullptr || !Aligned16(workspace))) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionCuda: needs a 16-byte aligned workspace of ", ws_bytes,
                     " bytes (PagedAttentionCudaWorkspaceBytes)"));
  }
  AttnArgs args;
  args.q = q;
  args.q_token_stride = q_token_stride;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.query_start_loc = batch.query_start_loc;
  args.context_lens = batch.context_lens;
  args.block_tables = batch.block_tables;
  args.max_blocks_per_seq = batch.max_blocks_per_seq;
  args.num_heads = static_cast<int>(params.num_heads);
  args.num_kv_heads = static_cast<int>(params.num_kv_heads);
  args.group = static_cast<int>(params.num_heads / params.num_kv_heads);
  args.head_dim = static_cast<int>(params.head_dim);
  args.v_head_dim = static_cast<int>(params.v_head_dim);
  args.block_size = static_cast<int>(params.block_size);
  args.block_shift = -1;
  for (int sh = 0; sh < 31; ++sh) {
    if ((int64_t{1} << sh) == params.block_size) args.block_shift = sh;
  }
  args.sliding_window = static_cast<int>(params.sliding_window);
  args.scale_log2 = params.scale * kLog2e;
  args.num_m_tiles = plan.m_tiles;
  args.num_splits = plan.num_splits;
  args.partition_tokens = plan.partition_tokens;
  args.num_tokens = static_cast<int>(batch.num_tokens);
  args.q_vec = Aligned16(q) && q_token_stride % 8 == 0 && params.head_dim % 8 == 0;
  args.out = out;
  const attention_detail::SplitKvCombineArgs combine = attention_detail::MakeSplitKvCombineArgs(
      ws_bytes > 0 ? workspace : nullptr, batch.query_start_loc, plan.num_splits, args.num_tokens,
      args.num_heads, args.v_head_dim, out);
  args.partial_ml = combine.partial_ml;
  args.partial_out = combine.partial_out;
  args.fusion = fusion;
  args.num_sequences = static_cast<int>(batch.num_sequences);

  // Prefill kinds but the CTA tiles take a linear x over (query tile, KV head, split), longest
  // tiles first.
  const bool linear = plan.kind >= kKindMmaTiles;
  const dim3 grid(
      static_cast<unsigned>(plan.m_tiles * plan.num_splits * (linear ? params.num_kv_heads : 1)),
      static_cast<unsigned>(linear ? 1 : params.num_kv_heads),
      static_cast<unsigned>(batch.num_sequences));
  const absl::Status s = LaunchPlanned(args, plan, grid, params, stream);
  if (!s.ok() || plan.num_splits == 1) return s;
  attention_detail::LaunchSplitKvCombine(combine, batch.max_query_len, batch.num_sequences, stream,
                                         plan.pdl);
  return CudaLaunchStatus("PagedAttentionCuda combine");
}

}  // namespace

absl::Status PagedAttentionCuda(const bf16* q, int64_t q_token_stride, const bf16* k_cache,
                                const bf16* v_cache, const PagedAttentionCudaBatch& batch,
                                const PagedAttentionParams& params, void* workspace, bf16* out,
                                cudaStream_t stream, const PagedAttentionOptions& options) {
  return RunPagedAttention(q, q_token_stride, k_cache, v_cache, batch, params, workspace, out,
                           attention_detail::DecodeRopeFusion{}, options, stream);
}

bool PagedAttentionDecodeFusionPays(const PagedAttentionCudaBatch& batch,
                                    const PagedAttentionParams& params,
                                    const PagedAttentionOptions& options) {
  if (!ValidateParams(params).ok() || !ValidateBatch(batch).ok()) return false;
  if (options.batch_invariant) return false;  // one kernel for every launch
  const LaunchPlan plan = Plan(batch, params, options);
  // The persistent decode warps pay only with the deferred new-key writes (head dims ≤ 128).
  const bool deferred = params.head_dim <= 128 && params.v_head_dim <= 128;
  return plan.decode && plan.num_splits == 1 && (!plan.persistent || deferred);
}

bool PagedAttentionDecodeFusionApplies(const PagedAttentionCudaBatch& batch,
                                       const PagedAttentionParams& params, int64_t rotary_dim,
                                       const PagedAttentionOptions& options) {
  if (!ValidateParams(params).ok() || !ValidateBatch(batch).ok()) return false;
  if (options.batch_invariant) return false;
  // One new token per sequence in one m16 tile (so one CTA per KV head and split: exactly one
  // owns the new key), K and V rows of the same width, and rotation pairs that never straddle
  // the rotated halves of a 32-bit q load.
  return batch.max_query_len == 1 && Plan(batch, params, options).decode &&
         params.v_head_dim == params.head_dim && rotary_dim >= 2 && rotary_dim % 4 == 0 &&
         rotary_dim <= params.head_dim;
}

absl::Status PagedAttentionRopeDecodeCuda(const bf16* qkv, int64_t token_stride, bf16* k_cache,
                                          bf16* v_cache, const PagedAttentionCudaBatch& batch,
                                          const PagedAttentionParams& params,
                                          const int32_t* positions, const DeviceRopeTable& rope,
                                          const int64_t* slot_mapping, void* workspace, bf16* out,
                                          cudaStream_t stream,
                                          const PagedAttentionOptions& options) {
  if (!PagedAttentionDecodeFusionApplies(batch, params, rope.rotary_dim, options) ||
      rope.inv_freq.size() != static_cast<size_t>(rope.rotary_dim / 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttentionRopeDecodeCuda: not a fusable decode launch (max_query_len ",
        batch.max_query_len, ", head_dim ", params.head_dim, ", v_head_dim ", params.v_head_dim,
        ", rotary_dim ", rope.rotary_dim, ")"));
  }
  if (positions == nullptr || slot_mapping == nullptr) {
    return absl::InvalidArgumentError("PagedAttentionRopeDecodeCuda: null positions or slots");
  }
  if (token_stride < (params.num_heads + 2 * params.num_kv_heads) * params.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttentionRopeDecodeCuda: token_stride ", token_stride,
                     " shorter than the q + k + v row"));
  }
  attention_detail::DecodeRopeFusion f;
  f.inv_freq = rope.inv_freq.data();
  f.positions = positions;
  f.slot_mapping = slot_mapping;
  f.k_cache = k_cache;
  f.v_cache = v_cache;
  f.half = static_cast<int>(rope.rotary_dim / 2);
  f.scaling = rope.attention_scaling;
  f.k_offset = params.num_heads * params.head_dim;
  f.v_offset = (params.num_heads + params.num_kv_heads) * params.head_dim;
  return RunPagedAttention(qkv, token_stride, k_cache, v_cache, batch, params, workspace, out, f,
                           options, stream);
}

}  // namespace sluice::kernels
