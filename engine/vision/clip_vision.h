// ClipVisionTower: the CLIP ViT image encoder on the CPU backend (transformers'
// `CLIPVisionTransformer`; "Learning Transferable Visual Models From Natural Language
// Supervision", Radford et al. 2021).
//
//   patches  = Conv2d(3 → D, kernel = stride = patch_size, no bias)(pixel_values), row-major grid
//   h_0      = pre_layrnorm([class_embedding; patches] + position_embedding)   [P + 1, D]
//   h_{l+1}  = h_l + out_proj(attn(LN1(h_l)));  h_{l+1} += fc2(act(fc1(LN2(h_{l+1}))))
// with non-causal multi-head attention (q/k/v/out with biases, scale head_dim^-0.5). The hidden
// states are (h_0, h_1, ..., h_L); post_layernorm applies only to the pooled output, which LLaVA
// does not use, so it is not computed.
#ifndef SLUICE_ENGINE_VISION_CLIP_VISION_H_
#define SLUICE_ENGINE_VISION_CLIP_VISION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/safetensors.h"
#include "engine/vision/llava_config.h"

namespace sluice::vision {

class ClipVisionTower {
 public:
  // Load reads `<prefix>embeddings.*`, `<prefix>pre_layrnorm.*` and
  // `<prefix>encoder.layers.N.*` for the first `num_layers` layers (the later ones never
  // influence the selected hidden state) as float32. Errors: those of LoadWeight (missing
  // tensor, wrong shape/dtype), each naming the tensor.
  static absl::StatusOr<ClipVisionTower> Load(const Checkpoint& checkpoint,
                                              const std::string& prefix,
                                              const ClipVisionConfig& config,
                                              int64_t num_layers);

  const ClipVisionConfig& config() const { return config_; }
  int64_t num_loaded_layers() const { return static_cast<int64_t>(layers_.size()); }

  // HiddenState returns h_layer for each image: pixel_values [num_images, 3, S, S] float32 (S =
  // image_size) → [num_images, num_positions, hidden_size] (CLS first). Thread-safe (scratch is
  // local). Errors: InvalidArgument when pixel_values does not hold num_images images of the
  // configured size, or `layer` is outside [0, num_loaded_layers()].
  absl::StatusOr<std::vector<float>> HiddenState(absl::Span<const float> pixel_values,
                                                 int64_t num_images, int64_t layer) const;

 private:
  struct Layer {
    std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
    std::vector<float> w_qkv, b_qkv;  // [3D, D], [3D]: q rows, then k, then v
    std::vector<float> w_out, b_out;  // [D, D], [D]
    std::vector<float> w_fc1, b_fc1;  // [I, D], [I]
    std::vector<float> w_fc2, b_fc2;  // [D, I], [D]
  };
  ClipVisionConfig config_;
  std::vector<float> patch_w_;    // [D, 3·P·P] (conv weight flattened as (c, ky, kx))
  std::vector<float> class_emb_;  // [D]
  std::vector<float> pos_emb_;    // [P + 1, D]
  std::vector<float> pre_ln_w_, pre_ln_b_;
  std::vector<Layer> layers_;
};

}  // namespace sluice::vision

#endif  // SLUICE_ENGINE_VISION_CLIP_VISION_H_
