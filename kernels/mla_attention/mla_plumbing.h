// CPU references of the MLA plumbing kernels (mla_plumbing_cuda.h), in fp32 (the CUDA kernels
// read and write bf16 and compute in fp32): the latent prologue, the absorbed query, and the
// MHA form's gather and K/V assembly. Formulas: DeepSeek-V2 (arXiv:2405.04434) §2.1 and
// transformers' DeepseekV3Attention (modeling_deepseek_v3.py).
#ifndef SLUICE_KERNELS_MLA_ATTENTION_MLA_PLUMBING_H_
#define SLUICE_KERNELS_MLA_ATTENTION_MLA_PLUMBING_H_

#include <cstdint>

#include "kernels/rope/rope.h"

namespace sluice::kernels {

// MlaPrologueCpuArgs: MlaPrologueArgs (mla_plumbing_cuda.h) on fp32 host arrays; the RoPE table
// (its rotary_dim = 2 · inv_freq.size() must equal dr) replaces inv_freq and scaling.
struct MlaPrologueCpuArgs {
  const float* kv = nullptr;  // token t: c_kv [R] then k_pe [dr] at kv + t·kv_stride
  int64_t kv_stride = 0;
  const float* kv_norm = nullptr;  // [R] kv_a_layernorm weight
  float eps = 1e-6f;
  const float* q_pe = nullptr;  // head h of token t: q_pe + t·q_token_stride + h·q_head_stride
  int64_t q_token_stride = 0, q_head_stride = 0;
  float* q_out = nullptr;  // head h of token t: q_out + t·q_out_token_stride + h·..._head_stride
  int64_t q_out_token_stride = 0, q_out_head_stride = 0;
  int64_t heads = 0, R = 0, dr = 0;
  const int32_t* positions = nullptr;  // [T]
  const int64_t* slots = nullptr;      // [T]; < 0: not cached
  const RopeTable* rope = nullptr;
  bool interleave = false;
  float* cache = nullptr;  // [slots, R + dr]
};

// MlaPrologueCpu: for every token t,
//   cache[slot, :R]  = c_kv · (mean(c_kv²) + eps)^-½ · kv_norm    (slot = slots[t] >= 0)
//   cache[slot, R:]  = RopeCpu(k_pe, positions[t])
//   q_out[t, h, :dr] = RopeCpu(q_pe[t, h], positions[t])           for h < heads
void MlaPrologueCpu(const MlaPrologueCpuArgs& args, int64_t num_tokens);

// MlaAbsorbQueryCpu: out[t, h, r] = Σ_{d < dn} q[t, h, d] · w[h, d, r] with q of token t, head
// h at q + t·q_token_stride + h·q_head_stride, w's head h at w + h·w_head_stride (row stride R),
// out at out + t·out_token_stride + h·out_head_stride.
void MlaAbsorbQueryCpu(const float* q, int64_t q_token_stride, int64_t q_head_stride,
                       const float* w, int64_t w_head_stride, float* out,
                       int64_t out_token_stride, int64_t out_head_stride, int64_t num_tokens,
                       int64_t heads, int64_t dn, int64_t R);

// MlaGatherLatentCpu: sequence s's context rows j < len_s = context_lens[s] +
// query_start_loc[s + 1] − query_start_loc[s], cache slot block_tables[s·max_blocks_per_seq +
// j / block_size]·block_size + j % block_size, into rows s·rows_per_seq + j of kv_c [.., R]
// (the slot's first R values) and k_pe [.., dr] (the next dr); rows past len_s are zeros.
void MlaGatherLatentCpu(const float* cache, int64_t R, int64_t dr, const int32_t* context_lens,
                        const int32_t* query_start_loc, const int32_t* block_tables,
                        int64_t max_blocks_per_seq, int64_t block_size, int64_t num_seqs,
                        int64_t rows_per_seq, float* kv_c, float* k_pe);

// MlaAssembleKvCpu: k[r, h] = [kv_up[r, h, :dn], k_pe[r, :]] ([rows, heads, dn + dr]) and
// v[r, h] = kv_up[r, h, dn:dn + dv] ([rows, heads, dv]), kv_up [rows, heads, dn + dv].
void MlaAssembleKvCpu(const float* kv_up, const float* k_pe, int64_t rows, int64_t heads,
                      int64_t dn, int64_t dr, int64_t dv, float* k, float* v);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_MLA_ATTENTION_MLA_PLUMBING_H_
