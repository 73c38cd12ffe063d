// CUDA rotary position embedding (bf16 storage, fp32 math) using the same RopeTable as the CPU
// path (rope.h: default, linear, llama3 and YaRN tables). Launcher conventions:
// kernels/cuda/cuda_common.h.
#ifndef SLUICE_KERNELS_ROPE_ROPE_CUDA_H_
#define SLUICE_KERNELS_ROPE_ROPE_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/rope/rope.h"

namespace sluice::kernels {

// DeviceRopeTable: a RopeTable whose inverse frequencies live in device memory.
struct DeviceRopeTable {
  DeviceBuffer<float> inv_freq;  // [rotary_dim / 2] float32
  int64_t rotary_dim = 0;
  float attention_scaling = 1.0f;  // multiplies cos and sin (YaRN mscale)
};

// UploadRopeTable copies `table` to the device (synchronous).
// Errors: InvalidArgument for an empty table or rotary_dim / 2 > 1024; Internal for CUDA errors.
absl::StatusOr<DeviceRopeTable> UploadRopeTable(const RopeTable& table);

// RopeCuda rotates in place, like RopeCpu, the first table.rotary_dim channels starting at
// channel `offset` of every head: x is bf16 [num_tokens, num_heads, ...] with token stride
// `token_stride` and head stride `head_stride` (elements); positions: [num_tokens] int32
// (device). For i < half = rotary_dim / 2, with angle = float(pos) * inv_freq[i] (fp32 product),
// c = cos(angle) * scaling, s = sin(angle) * scaling:
//   v[i] = x1·c − x2·s,  v[i + half] = x2·c + x1·s,  x1 = v[i], x2 = v[i + half]
// (transformers' rotate-half `apply_rotary_pos_emb`), computed in fp32, rounded once to bf16.
// With `interleave`, x1 = v[2i], x2 = v[2i + 1] (DeepSeek's `rope_interleave`: pairs are
// de-interleaved to halves before rotating). The rotated spans of different (token, head) pairs
// must not overlap. As a programmatic dependent (`pdl`) the kernel reads nothing before its wait.
// Errors: InvalidArgument for negative sizes or an empty table; Internal for launch errors.
absl::Status RopeCuda(bf16* x, int64_t num_tokens, int64_t num_heads, int64_t token_stride,
                      int64_t head_stride, int64_t offset, const int32_t* positions,
                      const DeviceRopeTable& table, bool interleave, cudaStream_t stream,
                      bool pdl = false);

// RopeQkWriteKvCuda: RoPE of q and k plus the KV-cache write of one layer in one launch, for
// fused QKV rows (Llama: rotate-half layout). qkv: bf16 [num_tokens, token_stride] whose row
// holds q (num_heads × head_dim) at 0, k (num_kv_heads × head_dim) right after, then v (same
// size as k). The first table.rotary_dim channels of every q and k head are rotated in place
// exactly as RopeCuda(interleave = false) does; then, for slot = slot_mapping[t] >= 0, token t's
// rotated k and its v row are written to k_cache / v_cache + slot · num_kv_heads · head_dim
// (WriteKvCacheCuda's layout). Tokens with slot < 0 are rotated but not cached.
// positions: [num_tokens] int32, slot_mapping: [num_tokens] int64 (device). As a programmatic
// dependent (`pdl`) the kernel reads and writes nothing before its wait.
// Errors: InvalidArgument for bad sizes (rotary_dim > head_dim, token_stride shorter than the
// q+k+v row) or null pointers; Internal for launch errors.
absl::Status RopeQkWriteKvCuda(bf16* qkv, int64_t num_tokens, int64_t token_stride,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               const int32_t* positions, const DeviceRopeTable& table,
                               const int64_t* slot_mapping, bf16* k_cache, bf16* v_cache,
                               cudaStream_t stream, bool pdl = false);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ROPE_ROPE_CUDA_H_
