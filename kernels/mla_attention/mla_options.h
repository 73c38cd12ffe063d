// MlaOptions: the choices a CUDA model runner makes about MLA attention (DeepSeek-V2/V3) when it
// is created (cuda_runner::CudaRunnerOptions::mla). Plain data; no CUDA needed to include it.
#ifndef SLUICE_KERNELS_MLA_ATTENTION_MLA_OPTIONS_H_
#define SLUICE_KERNELS_MLA_ATTENTION_MLA_OPTIONS_H_

#include <cstdint>

namespace sluice::kernels {

struct MlaOptions {
  // Steps whose longest query has at least this many tokens compute MLA attention in the
  // non-absorbed (MHA) form, as vLLM and SGLang run MLA prefill: every sequence's context is
  // up-projected with kv_b_proj and attended with head_dim qk_nope + qk_rope and v_head_dim
  // (2·H·(dn + dr + dv) FLOPs per query-key pair instead of the absorbed 2·H·(2·R + dr): 3.4x
  // fewer at DeepSeek-V2/V3 dims; DeepSeek-V2 paper, arXiv:2405.04434, §2.1.2), when the
  // step's contexts fit the runner's scratch (num_seqs·⌈max_seq_len / block_size⌉ blocks <=
  // ⌈max_num_tokens / block_size⌉ + ⌈max_model_len / block_size⌉). Other steps, decode
  // included, use the absorbed form over the latent cache; both read and write the same cache,
  // so a sequence may switch between them from step to step. 0: absorbed everywhere (the runner
  // then allocates no MHA scratch). Tests use 2 to reach the MHA form on short prompts.
  int64_t mha_prefill_min_query_len = 64;
};

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MLA_ATTENTION_MLA_OPTIONS_H_
