// Bidirectional (non-causal) multi-head attention over dense, equally long sequences: the
// self-attention of ViT encoders (CLIP's vision tower), where every position sees every other.
// No KV cache; the reference for any device version.
#ifndef SLUICE_KERNELS_ATTENTION_BIDIRECTIONAL_ATTENTION_H_
#define SLUICE_KERNELS_ATTENTION_BIDIRECTIONAL_ATTENTION_H_

#include <cstdint>

namespace sluice::kernels {

struct BidirectionalAttentionParams {
  int64_t num_sequences = 0;
  int64_t seq_len = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;  // softmax scale, usually 1/sqrt(head_dim)
};

// BidirectionalAttentionCpu: out = softmax(scale · q·kᵀ) · v per sequence and head over all
// seq_len keys, float32, two-pass softmax (max, then exp/sum) in increasing key order.
//   q, k, v: [num_sequences · seq_len, num_heads · head_dim] with row stride `row_stride` floats
//            (q, k and v may be column slices of one fused qkv buffer)
//   out:     [num_sequences · seq_len, num_heads · head_dim], contiguous
// Parallel over (sequence, query, head).
void BidirectionalAttentionCpu(const float* q, const float* k, const float* v,
                               int64_t row_stride, const BidirectionalAttentionParams& params,
                               float* out);

}  // namespace sluice::kernels

#endif  // SLUICE_KERNELS_ATTENTION_BIDIRECTIONAL_ATTENTION_H_
