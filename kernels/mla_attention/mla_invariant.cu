#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "kernels/attention/paged_attention_invariant.h"
#include "kernels/mla_attention/mla_invariant_cuda.h"

namespace sluice::kernels {
namespace {

constexpr int kHeadGemmWarps = 8;

struct HeadGemmArgs {
  const bf16* x;
  int64_t x_token_stride, x_head_stride;
  const bf16* w;
  int64_t w_head_stride, w_n_stride, w_k_stride;
  bf16* y;
  int64_t y_token_stride, y_head_stride;
  int n, k;
};

// One warp per output element (j = blockIdx.x · 8 + warp, head blockIdx.y, token blockIdx.z).
__global__ void __launch_bounds__(kHeadGemmWarps * 32) HeadGemmKernel(HeadGemmArgs a) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j = blockIdx.x * kHeadGemmWarps + warp;
  if (j >= a.n) return;
  const int h = blockIdx.y, t = blockIdx.z;
  const bf16* x = a.x + int64_t{t} * a.x_token_stride + int64_t{h} * a.x_head_stride;
  const bf16* w = a.w + int64_t{h} * a.w_head_stride + int64_t{j} * a.w_n_stride;
  float acc = 0.0f;
  for (int c = lane; c < a.k; c += 32) {
    acc = fmaf(__bfloat162float(x[c]), __bfloat162float(w[int64_t{c} * a.w_k_stride]), acc);
  }
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    a.y[int64_t{t} * a.y_token_stride + int64_t{h} * a.y_head_stride + j] =
        __float2bfloat16_rn(acc);
  }
}

}  // namespace

size_t MlaLatentAttentionInvariantWorkspaceBytes(const PagedAttentionCudaBatch& batch,
                                                 const MlaDims& dims) {
  if (dims.num_heads < 1 || dims.kv_lora_rank < 1 || batch.num_tokens < 1 ||
      batch.max_seq_len < 1) {
    return 0;
  }
  return attention_detail::BatchInvariantWorkspaceBytes(batch, dims.num_heads, dims.kv_lora_rank);
}

absl::Status MlaLatentAttentionInvariantCuda(const bf16* q_latent, int64_t q_token_stride,
                                             const bf16* cache, int64_t block_size,
                                             const PagedAttentionCudaBatch& batch,
                                             const MlaDims& dims, void* workspace,
                                             bf16* out_latent, cudaStream_t stream) {
  const int64_t width = dims.LatentWidth();
  if (dims.num_heads < 1 || dims.num_heads > 65535 || dims.kv_lora_rank < 1 ||
      dims.qk_rope_head_dim < 0 || width > 1024 || block_size < 1 || batch.num_sequences < 1 ||
      batch.num_tokens < 1 || batch.max_seq_len < 1 || batch.max_blocks_per_seq < 1 ||
      q_token_stride < dims.num_heads * width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlaLatentAttentionInvariantCuda: bad sizes (heads ", dims.num_heads, ", R ",
        dims.kv_lora_rank, ", dr ", dims.qk_rope_head_dim, ", block_size ", block_size,
        ", q_token_stride ", q_token_stride, ")"));
  }
  if (q_latent == nullptr || cache == nullptr || out_latent == nullptr ||
      batch.query_start_loc == nullptr || batch.context_lens == nullptr ||
      batch.block_tables == nullptr) {
    return absl::InvalidArgumentError("MlaLatentAttentionInvariantCuda: null pointer");
  }
  attention_detail::BatchInvariantLayout l;
  l.num_heads = dims.num_heads;
  l.num_kv_heads = 1;
  l.head_dim = width;
  l.v_head_dim = dims.kv_lora_rank;
  l.block_size = block_size;
  l.scale = dims.softmax_scale;
  l.q_token_stride = q_token_stride;
  l.q_head_stride = width;
  l.k_token_stride = width;
  l.v_token_stride = width;
  return attention_detail::LaunchBatchInvariantAttention(q_latent, cache, cache, batch, l,
                                                         workspace, out_latent, stream);
}

absl::Status HeadGemmInvariantCuda(const bf16* x, int64_t x_token_stride, int64_t x_head_stride,
                                   const bf16* w, int64_t w_head_stride, int64_t w_n_stride,
                                   int64_t w_k_stride, bf16* y, int64_t y_token_stride,
                                   int64_t y_head_stride, int64_t tokens, int64_t heads,
                                   int64_t n, int64_t k, cudaStream_t stream) {
  if (tokens < 0 || tokens > 65535 || heads < 1 || heads > 65535 || n < 1 || k < 1 ||
      n > 0x3fffffff || k > 0x3fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("HeadGemmInvariantCuda: bad sizes (tokens ",
                                                   tokens, ", heads ", heads, ", n ", n, ", k ",
                                                   k, ")"));
  }
  if (x == nullptr || w == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("HeadGemmInvariantCuda: null pointer");
  }
  if (tokens == 0) return absl::OkStatus();
  HeadGemmArgs a{x,          x_token_stride, x_head_stride, w,
                 w_head_stride, w_n_stride,  w_k_stride,    y,
                 y_token_stride, y_head_stride, static_cast<int>(n), static_cast<int>(k)};
  const dim3 grid(static_cast<unsigned>((n + kHeadGemmWarps - 1) / kHeadGemmWarps),
                  static_cast<unsigned>(heads), static_cast<unsigned>(tokens));
  HeadGemmKernel<<<grid, kHeadGemmWarps * 32, 0, stream>>>(a);
  return CudaLaunchStatus("HeadGemmInvariantCuda");
}

}  // namespace sluice::kernels
