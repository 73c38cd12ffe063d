#include "engine/vision/clip_vision.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/weight_loader.h"
#include "kernels/activation/activation.h"
#include "kernels/attention/bidirectional_attention.h"
#include "kernels/layer_norm/layer_norm.h"
#include "kernels/linear/linear.h"
#include "kernels/vit/vit.h"

namespace sluice::vision {

absl::StatusOr<ClipVisionTower> ClipVisionTower::Load(const Checkpoint& ckpt,
                                                      const std::string& prefix,
                                                      const ClipVisionConfig& config,
                                                      int64_t num_layers) {
  ClipVisionTower t;
  t.config_ = config;
  const int64_t D = config.hidden_size, I = config.intermediate_size, P = config.patch_size;
  const std::string e = prefix + "embeddings.";
  SLUICE_RETURN_IF_ERROR(
      LoadWeightInto(ckpt, e + "patch_embedding.weight", {D, 3, P, P}, &t.patch_w_));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, e + "class_embedding", {D}, &t.class_emb_));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, e + "position_embedding.weight",
                                        {config.num_positions(), D}, &t.pos_emb_));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, prefix + "pre_layrnorm.weight", {D}, &t.pre_ln_w_));
  SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, prefix + "pre_layrnorm.bias", {D}, &t.pre_ln_b_));
  t.layers_.resize(static_cast<size_t>(num_layers));
  std::vector<float> tmp;
  for (int64_t l = 0; l < num_layers; ++l) {
    Layer& L = t.layers_[static_cast<size_t>(l)];
    const std::string p = absl::StrCat(prefix, "encoder.layers.", l, ".");
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "layer_norm1.weight", {D}, &L.ln1_w));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "layer_norm1.bias", {D}, &L.ln1_b));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "layer_norm2.weight", {D}, &L.ln2_w));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "layer_norm2.bias", {D}, &L.ln2_b));
    for (const char* name : {"q_proj", "k_proj", "v_proj"}) {
      SLUICE_RETURN_IF_ERROR(
          LoadWeightInto(ckpt, p + "self_attn." + name + ".weight", {D, D}, &tmp));
      L.w_qkv.insert(L.w_qkv.end(), tmp.begin(), tmp.end());
      SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "self_attn." + name + ".bias", {D}, &tmp));
      L.b_qkv.insert(L.b_qkv.end(), tmp.begin(), tmp.end());
    }
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "self_attn.out_proj.weight", {D, D}, &L.w_out));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "self_attn.out_proj.bias", {D}, &L.b_out));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "mlp.fc1.weight", {I, D}, &L.w_fc1));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "mlp.fc1.bias", {I}, &L.b_fc1));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "mlp.fc2.weight", {D, I}, &L.w_fc2));
    SLUICE_RETURN_IF_ERROR(LoadWeightInto(ckpt, p + "mlp.fc2.bias", {D}, &L.b_fc2));
  }
  return t;
}

absl::StatusOr<std::vector<float>> ClipVisionTower::HiddenState(
    absl::Span<const float> pixel_values, int64_t num_images, int64_t layer) const {
  const ClipVisionConfig& c = config_;
  const int64_t S = c.image_size, P = c.patch_size, G = S / P, D = c.hidden_size;
  const int64_t I = c.intermediate_size, N = c.num_positions();
  if (num_images <= 0 ||
      static_cast<int64_t>(pixel_values.size()) != num_images * 3 * S * S) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pixel_values has ", pixel_values.size(), " floats, expected ", num_images, " x 3 x ", S,
        " x ", S));
  }
  if (layer < 0 || layer > num_loaded_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vision hidden state ", layer, " outside [0, ", num_loaded_layers(), "]"));
  }
  const int64_t rows = num_images * N, K = 3 * P * P;
  // Patch embedding as a GEMM over im2col rows ordered (c, ky, kx) like the conv weight.
  std::vector<float> cols(static_cast<size_t>(num_images * G * G * K));
  kernels::PatchUnfoldCpu(pixel_values.data(), num_images, 3, S, P, cols.data());
  std::vector<float> patches(static_cast<size_t>(num_images * G * G * D));
  kernels::LinearCpu(cols.data(), patch_w_.data(), nullptr, patches.data(), num_images * G * G, D,
                     K);
  std::vector<float> h(static_cast<size_t>(rows * D));
  kernels::ClipEmbeddingsCpu(patches.data(), class_emb_.data(), pos_emb_.data(), num_images,
                             G * G, D, h.data());
  const float eps = static_cast<float>(c.layer_norm_eps);
  kernels::LayerNormCpu(h.data(), pre_ln_w_.data(), pre_ln_b_.data(), h.data(), rows, D, eps);

  std::vector<float> normed(h.size()), qkv(static_cast<size_t>(rows * 3 * D)), attn(h.size()),
      tmp(h.size()), mid(static_cast<size_t>(rows * I));
  kernels::BidirectionalAttentionParams ap;
  ap.num_sequences = num_images;
  ap.seq_len = N;
  ap.num_heads = c.num_attention_heads;
  ap.head_dim = D / c.num_attention_heads;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(ap.head_dim));
  for (int64_t l = 0; l < layer; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    kernels::LayerNormCpu(h.data(), L.ln1_w.data(), L.ln1_b.data(), normed.data(), rows, D, eps);
    kernels::LinearCpu(normed.data(), L.w_qkv.data(), L.b_qkv.data(), qkv.data(), rows, 3 * D, D);
    kernels::BidirectionalAttentionCpu(qkv.data(), qkv.data() + D, qkv.data() + 2 * D, 3 * D, ap,
                                       attn.data());
    kernels::LinearCpu(attn.data(), L.w_out.data(), L.b_out.data(), tmp.data(), rows, D, D);
    for (size_t i = 0; i < h.size(); ++i) h[i] += tmp[i];
    kernels::LayerNormCpu(h.data(), L.ln2_w.data(), L.ln2_b.data(), normed.data(), rows, D, eps);
    kernels::LinearCpu(normed.data(), L.w_fc1.data(), L.b_fc1.data(), mid.data(), rows, I, D);
    if (c.hidden_act == "quick_gelu") {
      kernels::QuickGeluCpu(mid.data(), mid.data(), rows * I);
    } else {
      kernels::GeluCpu(mid.data(), mid.data(), rows * I);
    }
    kernels::LinearCpu(mid.data(), L.w_fc2.data(), L.b_fc2.data(), tmp.data(), rows, D, I);
    for (size_t i = 0; i < h.size(); ++i) h[i] += tmp[i];
  }
  return h;
}

}  // namespace sluice::vision
