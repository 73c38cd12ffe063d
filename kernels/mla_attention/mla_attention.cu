// CUDA MLA attention core over the paged latent cache (mla_attention_cuda.h): the launch plan
// (which kernel, how many key partitions) and the dispatch. The kernels live in mla_decode.cu
// (decode steps) and mla_prefill.cu (prefill chunks, and the fp32 kernel for small dims); all
// serve a group of up to 16 heads per CTA, so every head of the group reuses each latent row the
// CTA loads (all heads attend over the same rows).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/attention/attention_device.cuh"
#include "kernels/mla_attention/mla_attention_cuda.h"
#include "kernels/mla_attention/mla_attention_device.cuh"

namespace sluice::kernels {
namespace {

using namespace mla_detail;  // NOLINT(build/namespaces): the shapes the planner sizes

struct MlaPlan {
  bool tensor_cores = false;
  bool decode = false;     // MlaDecodeKernel
  int decode_stages = 0;   // its ring depth
  int tokens_per_cta = 1;  // T of MlaLatentMmaKernel
  int num_splits = 1;
  int partition_tokens = 0;
  int head_chunks = 1;
  bool prefill_mma = false;  // MlaPrefillMmaKernel instead of MlaLatentMmaKernel<4>
};

// Whether decode launches go out as programmatic dependents: on an sm_90+ device (griddepcontrol
// compiles to nothing below sm_90). Asked per launch plan, which graph capture does once.
bool MlaDecodePdl() { return PdlSupported(); }

// Whether this device lets a CTA opt in to `bytes` of dynamic shared memory.
bool SmemFits(size_t bytes) {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return false;
  }
  return bytes <= static_cast<size_t>(optin);
}

int MultiprocessorCount() {
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  return std::max(sms, 1);
}

// The decode kernel's split plan. CTAs come in waves of SMs × resident CTAs per SM (1 with the
// deep ring's ~170 KB of shared memory, 2 with the shallow one's ~97 KB). Among partitions of whole
// tiles pick the one whose waves are fullest, preferring fewer splits (each costs a partial write
// and combine input) unless more fill the waves ≥ 10% better. Partitions keep ≥ 4 tiles, except
// when the batch is far too small to fill the GPU (latency-bound: batch 1 reads one 32-row tile per
// CTA, 32 CTAs at 1k context). Host bounds only, so captured graphs stay valid.
void PlanDecodeSplits(const PagedAttentionCudaBatch& b, const MlaDims& d, MlaPlan* plan) {
  // Resident CTAs per SM (228 KiB of shared memory, 1 KiB of it reserved per CTA): 1 with the
  // deep ring, 2 with the shallow one at DeepSeek widths.
  const size_t per_cta =
      DecodeSmemBytes(static_cast<int>(d.LatentWidth()), plan->decode_stages) + 1024;
  const int64_t per_sm = std::max<int64_t>(1, static_cast<int64_t>(228 * 1024 / per_cta));
  const int64_t slots = MultiprocessorCount() * per_sm;
  const int64_t ctas = static_cast<int64_t>(plan->head_chunks) * b.num_sequences;
  if (ctas >= 4 * slots || b.max_seq_len < 2 * kDecTile) return;
  const bool latency_bound = ctas * 4 < slots;
  const int64_t min_part = latency_bound ? kDecTile : 4 * kDecTile;
  auto fill = [&](int64_t splits) { return attention_detail::SplitWaveFill(ctas, splits, slots); };
  double best_fill = fill(1);
  int64_t best_part = 0;
  for (int64_t part = (b.max_seq_len + kDecTile - 1) / kDecTile * kDecTile; part >= min_part;
       part -= kDecTile) {
    const int64_t splits = (b.max_seq_len + part - 1) / part;
    if (splits < 2) continue;
    if (splits > attention_detail::kMaxSplitsDevice || ctas * splits > 16 * slots) break;
    const double f = fill(splits);
    if (f > best_fill * 1.1) {
      best_fill = f;
      best_part = part;
    }
  }
  if (best_part > 0) {
    plan->partition_tokens = static_cast<int>(best_part);
    plan->num_splits = static_cast<int>((b.max_seq_len + best_part - 1) / best_part);
  }
}

MlaPlan Plan(const PagedAttentionCudaBatch& b, const MlaDims& d) {
  MlaPlan plan;
  plan.tensor_cores = UseTensorCores(d);
  plan.decode = plan.tensor_cores && b.max_query_len == 1;
  plan.tokens_per_cta = plan.tensor_cores && b.max_query_len > 1 ? kTcPrefillTokens : 1;
  plan.head_chunks = static_cast<int>((d.num_heads + kHeads - 1) / kHeads);
  // Ring depth (automatic): the decode kernel is bound by its per-tile latency chain (three
  // barriers a tile), not by bytes, so two CTAs per SM (shallow rings) overlap one's barriers
  // with the other's work — H200, DeepSeek-V2-Lite: batch 64 × 1k 39.6 µs vs 53.5 deep,
  // 64 × 8k 239 vs 373 — except for latency-bound grids (a few sequences), whose many short
  // partitions do better one CTA per SM: batch 1 × 8k 20.7 µs deep vs 31.1 (1k: 10.5 both).
  const bool few =
      static_cast<int64_t>(plan.head_chunks) * b.num_sequences * 4 < MultiprocessorCount();
  plan.decode_stages = few ? kDecStagesDeep : kDecStagesShallow;
  if (plan.decode) {
    PlanDecodeSplits(b, d, &plan);
    return plan;
  }
  // Partitions are whole key tiles; the tensor-core kernel's tile costs little, so decode at
  // small batch splits finely (a 1k context over 16 CTAs) and leans on the combine.
  const int tile = plan.tensor_cores ? kTcTile : kKeys;
  const int min_partition = plan.tensor_cores ? kTcTile : kMinPartition;
  const int sms = MultiprocessorCount();
  // Split only when the CTAs fall short of ~2 per SM and partitions keep ≥ min_partition keys.
  const int64_t q_tiles = (b.max_query_len + plan.tokens_per_cta - 1) / plan.tokens_per_cta;
  const int64_t ctas = q_tiles * plan.head_chunks * b.num_sequences;
  const int64_t target = 2LL * sms;
  if (ctas < target && b.max_seq_len >= 2 * min_partition) {
    int64_t splits = std::min<int64_t>({(target + ctas - 1) / ctas, b.max_seq_len / min_partition,
                                        attention_detail::kMaxSplitsDevice});
    if (splits > 1) {
      int64_t part = (b.max_seq_len + splits - 1) / splits;
      part = (part + tile - 1) / tile * tile;
      plan.partition_tokens = static_cast<int>(part);
      plan.num_splits = static_cast<int>((b.max_seq_len + part - 1) / part);
    }
  }
  if (plan.num_splits == 1) plan.partition_tokens = 0;
  // MlaPrefillMmaKernel shares the 4-token kernel's grid and split plan; dims or devices it
  // cannot serve (multiples of 64, ~227 KB of shared memory) keep the 4-token kernel.
  plan.prefill_mma = plan.tensor_cores && plan.tokens_per_cta == kPfTokens &&
                     d.kv_lora_rank % 64 == 0 && d.LatentWidth() % 64 == 0 &&
                     SmemFits(PrefillSmemBytes(static_cast<int>(d.LatentWidth())));
  return plan;
}

absl::Status Validate(const PagedAttentionCudaBatch& b, const MlaDims& d, int64_t block_size) {
  if (d.num_heads < 1 || d.kv_lora_rank < 1 || d.qk_rope_head_dim < 0 || block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaLatentAttentionCuda: sizes must be >= 1 (num_heads ", d.num_heads,
                     ", kv_lora_rank ", d.kv_lora_rank, ", qk_rope_head_dim ", d.qk_rope_head_dim,
                     ", block_size ", block_size, ")"));
  }
  const int64_t width = d.LatentWidth();
  if (d.kv_lora_rank % 2 != 0 || d.kv_lora_rank > kMaxRank || width % 8 != 0 || width > kMaxWidth) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaLatentAttentionCuda: unsupported dims (kv_lora_rank ", d.kv_lora_rank,
                     " must be even and <= ", kMaxRank, "; kv_lora_rank + qk_rope_head_dim ", width,
                     " a multiple of 8, <= ", kMaxWidth, ")"));
  }
  if (d.num_heads > 65535 * kHeads) {
    return absl::InvalidArgumentError("MlaLatentAttentionCuda: too many heads");
  }
  if (b.num_sequences < 1 || b.num_tokens < 1 || b.max_query_len < 1 || b.max_seq_len < 1 ||
      b.max_blocks_per_seq < 1 || b.max_query_len > b.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlaLatentAttentionCuda: bad batch bounds (num_sequences ", b.num_sequences,
        ", num_tokens ", b.num_tokens, ", max_query_len ", b.max_query_len, ", max_seq_len ",
        b.max_seq_len, ", max_blocks_per_seq ", b.max_blocks_per_seq, ")"));
  }
  if (b.num_sequences > 65535 || b.num_tokens > INT32_MAX ||
      b.max_query_len * attention_detail::kMaxSplitsDevice > INT32_MAX ||
      b.max_seq_len > INT32_MAX / 2) {
    return absl::InvalidArgumentError("MlaLatentAttentionCuda: batch too large");
  }
  if (b.query_start_loc == nullptr || b.context_lens == nullptr || b.block_tables == nullptr) {
    return absl::InvalidArgumentError("MlaLatentAttentionCuda: null batch metadata pointer");
  }
  return absl::OkStatus();
}

}  // namespace

size_t MlaLatentAttentionCudaWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                            const MlaDims& dims) {
  if (!Validate(batch, dims, 1).ok()) return 0;
  const MlaPlan plan = Plan(batch, dims);
  return attention_detail::SplitKvWorkspaceBytes(plan.num_splits, batch.num_tokens, dims.num_heads,
                                                 dims.kv_lora_rank);
}

namespace {

// MlaLatentAttentionCuda up to its split-KV combine: validates, launches the attention kernel
// of the plan, and returns the combine's arguments in *combine (num_splits 1: nothing to merge).
absl::Status EnqueueLatentAttention(const bf16* q_latent, int64_t q_token_stride,
                                    const bf16* cache, int64_t block_size,
                                    const PagedAttentionCudaBatch& batch, const MlaDims& dims,
                                    void* workspace, bf16* out_latent, cudaStream_t stream,
                                    attention_detail::SplitKvCombineArgs* combine_out) {
  if (absl::Status s = Validate(batch, dims, block_size); !s.ok()) return s;
  if (q_latent == nullptr || cache == nullptr || out_latent == nullptr) {
    return absl::InvalidArgumentError("MlaLatentAttentionCuda: null q, cache or out pointer");
  }
  const int64_t width = dims.LatentWidth();
  if (q_token_stride < dims.num_heads * width) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaLatentAttentionCuda: q_token_stride ", q_token_stride,
                     " < num_heads · (kv_lora_rank + qk_rope_head_dim) ", dims.num_heads * width));
  }
  if (!cuda_detail::Aligned16(cache) || (reinterpret_cast<uintptr_t>(out_latent) & 3u) != 0) {
    return absl::InvalidArgumentError(
        "MlaLatentAttentionCuda: cache must be 16-byte aligned, out_latent 4-byte aligned");
  }
  const MlaPlan plan = Plan(batch, dims);
  const size_t ws_bytes = MlaLatentAttentionCudaWorkspaceBytes(batch, dims);
  if (ws_bytes > 0 && (workspace == nullptr || !cuda_detail::Aligned16(workspace))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlaLatentAttentionCuda: needs a 16-byte aligned workspace of ", ws_bytes, " bytes"));
  }
  MlaArgs args;
  args.q = q_latent;
  args.q_token_stride = q_token_stride;
  args.cache = cache;
  args.query_start_loc = batch.query_start_loc;
  args.context_lens = batch.context_lens;
  args.block_tables = batch.block_tables;
  args.max_blocks_per_seq = batch.max_blocks_per_seq;
  args.block_size = static_cast<int>(block_size);
  args.num_heads = static_cast<int>(dims.num_heads);
  args.rank = static_cast<int>(dims.kv_lora_rank);
  args.width = static_cast<int>(width);
  args.scale_log2 = dims.softmax_scale * kLog2e;
  args.num_splits = plan.num_splits;
  args.partition_tokens = plan.partition_tokens;
  args.num_tokens = static_cast<int>(batch.num_tokens);
  args.out = out_latent;
  const attention_detail::SplitKvCombineArgs combine = attention_detail::MakeSplitKvCombineArgs(
      ws_bytes > 0 ? workspace : nullptr, batch.query_start_loc, plan.num_splits, args.num_tokens,
      args.num_heads, args.rank, out_latent);
  args.partial_ml = combine.partial_ml;
  args.partial_out = combine.partial_out;

  args.q_vec = cuda_detail::Aligned16(q_latent) && q_token_stride % 8 == 0;
  if (plan.decode) {
    const dim3 grid(static_cast<unsigned>(plan.num_splits), static_cast<unsigned>(plan.head_chunks),
                    static_cast<unsigned>(batch.num_sequences));
    // A programmatic dependent on sm_90+ (the kernel waits before it reads what the step wrote).
    SLUICE_RETURN_IF_ERROR(
        mla_detail::LaunchMlaDecode(args, grid, plan.decode_stages, MlaDecodePdl(), stream));
  } else if (plan.tensor_cores) {
    const int64_t q_tiles = (batch.max_query_len + plan.tokens_per_cta - 1) / plan.tokens_per_cta;
    const dim3 grid(static_cast<unsigned>(q_tiles * plan.num_splits),
                    static_cast<unsigned>(plan.head_chunks),
                    static_cast<unsigned>(batch.num_sequences));
    SLUICE_RETURN_IF_ERROR(mla_detail::LaunchMlaPrefillTc(args, grid, plan.prefill_mma, stream));
  } else {
    const dim3 grid(static_cast<unsigned>(batch.max_query_len * plan.num_splits),
                    static_cast<unsigned>(plan.head_chunks),
                    static_cast<unsigned>(batch.num_sequences));
    SLUICE_RETURN_IF_ERROR(mla_detail::LaunchMlaFp32(args, grid, stream));
  }
  *combine_out = combine;
  return CudaLaunchStatus("MlaLatentAttentionCuda");
}

}  // namespace

absl::Status MlaLatentAttentionCuda(const bf16* q_latent, int64_t q_token_stride, const bf16* cache,
                                    int64_t block_size, const PagedAttentionCudaBatch& batch,
                                    const MlaDims& dims, void* workspace, bf16* out_latent,
                                    cudaStream_t stream) {
  attention_detail::SplitKvCombineArgs combine;
  if (absl::Status s = EnqueueLatentAttention(q_latent, q_token_stride, cache, block_size, batch,
                                              dims, workspace, out_latent, stream, &combine);
      !s.ok()) {
    return s;
  }
  if (combine.num_splits <= 1) return absl::OkStatus();
  attention_detail::LaunchSplitKvCombine(combine, batch.max_query_len, batch.num_sequences, stream);
  return CudaLaunchStatus("MlaLatentAttentionCuda combine");
}

absl::Status MlaLatentAttentionVUpCuda(const bf16* q_latent, int64_t q_token_stride,
                                       const bf16* cache, int64_t block_size,
                                       const PagedAttentionCudaBatch& batch, const MlaDims& dims,
                                       void* workspace, bf16* out_latent, const bf16* w_uv,
                                       int64_t w_head_stride, int64_t v_head_dim, bf16* out,
                                       int64_t out_token_stride, cudaStream_t stream,
                                       int pdl_bits) {
  if (v_head_dim < 1 || w_uv == nullptr || out == nullptr ||
      (reinterpret_cast<uintptr_t>(w_uv) & 3u) != 0 || w_head_stride % 2 != 0 ||
      w_head_stride < v_head_dim * dims.kv_lora_rank ||
      out_token_stride < dims.num_heads * v_head_dim ||
      (batch.num_sequences > 0 && dims.num_heads > 0 &&
       dims.num_heads * ((v_head_dim + kVUpRows - 1) / kVUpRows) > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlaLatentAttentionVUpCuda: needs v_head_dim >= 1, non-null 4-byte aligned w_uv with an "
        "even w_head_stride >= v_head_dim · kv_lora_rank, out_token_stride >= num_heads · "
        "v_head_dim, num_heads · ⌈v_head_dim / ",
        kVUpRows, "⌉ <= 65535"));
  }
  attention_detail::SplitKvCombineArgs combine;
  if (absl::Status s = EnqueueLatentAttention(q_latent, q_token_stride, cache, block_size, batch,
                                              dims, workspace, out_latent, stream, &combine);
      !s.ok()) {
    return s;
  }
  VUpArgs a;
  a.query_start_loc = batch.query_start_loc;
  a.partial_ml = combine.partial_ml;
  a.partial_out = combine.partial_out;
  a.latent = out_latent;
  a.w = w_uv;
  a.w_head_stride = w_head_stride;
  a.out = out;
  a.out_token_stride = out_token_stride;
  a.num_splits = combine.num_splits;
  a.num_tokens = static_cast<int>(batch.num_tokens);
  a.num_heads = static_cast<int>(dims.num_heads);
  a.rank = static_cast<int>(dims.kv_lora_rank);
  a.dv = static_cast<int>(v_head_dim);
  a.slices = static_cast<int>((v_head_dim + kVUpRows - 1) / kVUpRows);
  a.w_vec = cuda_detail::Aligned16(w_uv) && w_head_stride % 8 == 0 && a.rank % 8 == 0;
  const dim3 grid(static_cast<unsigned>(batch.max_query_len),
                  static_cast<unsigned>(batch.num_sequences),
                  static_cast<unsigned>(dims.num_heads * a.slices));
  const int bits = pdl_bits;
  const bool early = (bits & kMlaPdlVUpPreload) != 0;
  a.trigger = (bits & kMlaPdlVUpTrigger) != 0;
  SLUICE_RETURN_IF_ERROR(mla_detail::LaunchMlaCombineVUp(
      a, grid, early, MlaDecodePdl() || (bits & (kMlaPdlVUpPreload | kMlaPdlVUpTrigger)) != 0,
      stream));
  return CudaLaunchStatus("MlaLatentAttentionVUpCuda combine + W_UV");
}

}  // namespace sluice::kernels
